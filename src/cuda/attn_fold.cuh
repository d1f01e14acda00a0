/* attn_fold.cuh - the span states of the sparse attention (attn_kv8.cu on CUDA cores, attn_kv8_tc.cu on tensor
 * cores): a state is (m, l, O) of a run of entries (running max, sum of exp(s - m), sum of exp(s - m) v), folded in
 * list order into the total; out = O oscale / (L + exp(sink - M)), then the inverse RoPE of the last R dims. The same
 * device functions in every kernel that folds (a block over its own spans, attn_kv8_combine over the spans' partials
 * in scratch), so the launch shape never changes a bit. */
#ifndef DSV4_CUDA_ATTN_FOLD_CUH
#define DSV4_CUDA_ATTN_FOLD_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* floats of one span state in scratch: m, l, 2 pad, then the dims rounded up to 4 */
static __host__ __device__ inline int64_t ak_pst(int Dh) { return 4 + 4 * (int64_t)((Dh + 3) / 4); }

/* Folding a state (m, l, x) into (M, L, O), m finite: Mn = max(M, m), L = l b + L a, O = x b + O a. The same
 * operations in the kernel (full mode) and in attn_kv8_combine (partial mode). */
__device__ __forceinline__ void ak_coef(float M, float m, float &Mn, float &a, float &b) {
    Mn = fmaxf(M, m);
    a = M == -INFINITY ? 0.0f : expf(M - Mn);
    b = expf(m - Mn);
}
__device__ __forceinline__ float ak_fold1(float o, float a, float x, float b) { return fmaf(x, b, __fmul_rn(o, a)); }
__device__ __forceinline__ float4 ak_fold4(float4 o, float a, float4 x, float b) {
    return make_float4(ak_fold1(o.x, a, x.x, b), ak_fold1(o.y, a, x.y, b), ak_fold1(o.z, a, x.z, b), ak_fold1(o.w, a, x.w, b));
}
/* o oscale / den (oscale a power of two: o carries that factor's inverse); zero when den is not positive */
__device__ __forceinline__ float ak_fin1(float o, float den, float oscale) {
    return den > 0 ? __fdiv_rn(__fmul_rn(o, oscale), den) : 0.0f;
}
__device__ __forceinline__ float4 ak_fin4(float4 o, float den, float oscale) {
    if (!(den > 0)) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return make_float4(ak_fin1(o.x, den, oscale), ak_fin1(o.y, den, oscale), ak_fin1(o.z, den, oscale),
                       ak_fin1(o.w, den, oscale));
}
__device__ __forceinline__ float ak_den(float M, float L, float sink) {
    return M == -INFINITY ? 0.0f : __fadd_rn(L, expf(sink - M));
}
/* 4 floats from p of which n (may be < 4) exist; vec: p is 16-byte aligned whenever n >= 4 */
__device__ __forceinline__ float4 ak_ld4(const float *p, int n, int vec) {
    if (vec && n >= 4) return *(const float4 *)p;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (n > 0) v.x = p[0];
    if (n > 1) v.y = p[1];
    if (n > 2) v.z = p[2];
    if (n > 3) v.w = p[3];
    return v;
}
__device__ __forceinline__ void ak_st4(float *p, int n, float4 v, int vec) {
    if (vec && n >= 4) {
        *(float4 *)p = v;
        return;
    }
    if (n > 0) p[0] = v.x;
    if (n > 1) p[1] = v.y;
    if (n > 2) p[2] = v.z;
    if (n > 3) p[3] = v.w;
}
/* A tensor-core tile's scores in the mma / wgmma accumulator layout (S[4 n + j]: entry 8 n + 2 tq + (j & 1), head row
 * gr for j < 2, gr + 8 else; tq = lane % 4): entries whose bit in vm is clear become -inf, the others x scale; mt0 /
 * mt1 the two rows' maxima over the quad (attn_kv8_tc.cu, attn_kv8_wg.cu) */
__device__ __forceinline__ void ak_tile_max(float (&S)[16], unsigned vm, int tq, float scale, float &mt0, float &mt1) {
    mt0 = -INFINITY, mt1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int e = 8 * n + 2 * tq + (j & 1);
            const float x = (vm >> e) & 1u ? __fmul_rn(S[4 * n + j], scale) : -INFINITY;
            S[4 * n + j] = x;
            if (j < 2) mt0 = fmaxf(mt0, x);
            else mt1 = fmaxf(mt1, x);
        }
    mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, 1));
    mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, 2));
    mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, 1));
    mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, 2));
}

/* The end of a tile's online-softmax step for a quad's rows gr and gr + 8 (the tensor-core tiles' layout): the tile's
 * sums ls0 / ls1 of this thread's entries added over the quad, l = l a + ls, m = mn, and O's rows rescaled by a unless
 * every lane's a is 1 (x 1 would change no bit). attn_kv8_tc's and attn_kv8_wg's step. */
template <int NO>
__device__ __forceinline__ void ak_row_fold(float (&O)[NO][4], float ls0, float ls1, float a0, float a1, float mn0, float mn1,
                                            float &l0, float &l1, float &m0, float &m1) {
    ls0 += __shfl_xor_sync(0xffffffffu, ls0, 1);
    ls0 += __shfl_xor_sync(0xffffffffu, ls0, 2);
    ls1 += __shfl_xor_sync(0xffffffffu, ls1, 1);
    ls1 += __shfl_xor_sync(0xffffffffu, ls1, 2);
    l0 = fmaf(l0, a0, ls0), l1 = fmaf(l1, a1, ls1);
    m0 = mn0, m1 = mn1;
    if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f))
#pragma unroll
        for (int n = 0; n < NO; n++) O[n][0] *= a0, O[n][1] *= a0, O[n][2] *= a1, O[n][3] *= a1;
}

/* The output's inverse RoPE (rope_kernel with inverse = 1: the same operations, so the same bits as storing and then
 * rotating): the pairs of the last R dims, pair i at angle pos x freq[i]; freq NULL: none */
struct ak_rope {
    const float *freq;
    const int *pos;
};
/* the rotation with its cos / sin given (ak_rope_cs: the same values ak_unrot computes) */
__device__ __forceinline__ void ak_unrot_cs(float &a, float &b, float c, float s) {
    const float x = a, y = b;
    a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
    b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}
__device__ __forceinline__ void ak_rope_cs(float p, float f, float &c, float &s) {
    const float ang = __fmul_rn(p, f);
    c = cosf(ang), s = -sinf(ang);
}
__device__ __forceinline__ void ak_unrot(float &a, float &b, float p, float f) {
    float c, s;
    ak_rope_cs(p, f, c, s);
    ak_unrot_cs(a, b, c, s);
}
/* v holds dims d .. d + 3 (d a multiple of 4; those past Dh unused) of query t's row */
__device__ __forceinline__ float4 ak_rope4(float4 v, int d, int Dh, int R, ak_rope ro, int t) {
    const int r0 = Dh - R;
    if (!ro.freq || d < r0) return v;
    const float p = (float)ro.pos[t];
    const int i = (d - r0) >> 1;
    ak_unrot(v.x, v.y, p, ro.freq[i]);
    if (d + 2 < Dh) ak_unrot(v.z, v.w, p, ro.freq[i + 1]);
    return v;
}

/* Folds, for each (query t, head h), the span states part[((t H + h) nspan + s) ak_pst(Dh)] (m, l, pad, pad, O)
 * in order s = 0 .. nspan - 1 and writes out [T, H, Dh] = O oscale / (L + exp(sink - M)), inverse-rotated by ro
 * (attn_kv8.cu). vec: out 16-byte aligned and Dh % 4 == 0. Returns non-zero (dsv4_cuda_fail) on a launch error. */
int ak_combine_launch(const float *part, int T, int H, int Dh, int R, int nspan, const float *sink, float oscale,
                      float *out, int vec, ak_rope ro, cudaStream_t st);

#endif
