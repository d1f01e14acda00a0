/* attn.cu - sparse attention with a sink over an index list (spec 7.1, 10), the twin of
 * dsv4_cpu_sparse_attn. Keys = values (one row per entry, shared by all heads), so a block takes
 * one query token and HB heads, reads each selected row twice (scores, then the weighted sum) and
 * keeps the HB x n score matrix in shared memory:
 *   1. a thread per entry (a warp per entry when rows are not 16-byte aligned): HB dot products
 *      q_h . k over Dh, scaled;
 *   2. a warp per head: max over the valid entries, p = exp(s - max), den = sum p + exp(sink - max);
 *   3. a thread per output dim: sum_i p[h][i] k_i[d] / den[h] for the HB heads. */
#include "common.cuh"

#define ATTN_THREADS 256

template <int HB>
__global__ void __launch_bounds__(ATTN_THREADS) sparse_attn_kernel(const float *q, int H, int Dh, const float *kv, int64_t kv_ld,
                                                                   const int *idx, int nidx, const float *sink, float scale,
                                                                   float *out, int vec4, const float *const *qbase,
                                                                   const float *kv2) {
    extern __shared__ float asm_[];
    float *qs = asm_;                       /* [HB][Dh] */
    float *S = qs + HB * Dh;                /* [HB][nidx] */
    float *den = S + (size_t)HB * nidx;     /* [HB] */
    int *ids = (int *)(den + HB);           /* [nidx] */
    const int t = blockIdx.x, h0 = blockIdx.y * HB, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hb = H - h0 < HB ? H - h0 : HB;
    /* rows: id >= 0 -> kv (or this query's own base qbase[t]); id <= -2 -> row -id-2 of kv2 */
    if (qbase) kv = qbase[t];
#define ROWP(id) ((id) >= 0 ? kv + (int64_t)(id) * kv_ld : kv2 + (int64_t)(-(id) - 2) * kv_ld)
    for (int i = threadIdx.x; i < HB * Dh; i += ATTN_THREADS) {
        int h = i / Dh;
        qs[i] = h < hb ? q[((int64_t)t * H + h0 + h) * Dh + (i - h * Dh)] : 0.0f;
    }
    for (int i = threadIdx.x; i < nidx; i += ATTN_THREADS) {
        int id = idx[(int64_t)t * nidx + i];
        ids[i] = id < -1 && !kv2 ? -1 : id; /* -1 = no entry */
    }
    __syncthreads();
    if (vec4) {
        /* a thread per entry: each thread streams its own row with 16-byte loads (many rows in
         * flight), while the block's q reads are broadcasts */
        for (int i = threadIdx.x; i < nidx; i += ATTN_THREADS) {
            int id = ids[i];
            if (id == -1) {
#pragma unroll
                for (int h = 0; h < HB; h++) S[h * nidx + i] = -INFINITY;
                continue;
            }
            const float4 *k4 = (const float4 *)ROWP(id);
            float acc[HB];
#pragma unroll
            for (int h = 0; h < HB; h++) acc[h] = 0.0f;
            for (int d4 = 0; d4 < Dh / 4; d4 += 4) {
                float4 kk[4];
#pragma unroll
                for (int c = 0; c < 4; c++) kk[c] = d4 + c < Dh / 4 ? __ldg(k4 + d4 + c) : make_float4(0, 0, 0, 0);
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    if (d4 + c >= Dh / 4) break;
#pragma unroll
                    for (int h = 0; h < HB; h++) {
                        float4 qq = ((const float4 *)(qs + h * Dh))[d4 + c];
                        acc[h] = fmaf(qq.x, kk[c].x, acc[h]);
                        acc[h] = fmaf(qq.y, kk[c].y, acc[h]);
                        acc[h] = fmaf(qq.z, kk[c].z, acc[h]);
                        acc[h] = fmaf(qq.w, kk[c].w, acc[h]);
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < HB; h++) S[h * nidx + i] = acc[h] * scale;
        }
    } else {
        for (int i = warp; i < nidx; i += ATTN_THREADS / 32) {
            int id = ids[i];
            if (id == -1) {
                if (lane < HB) S[lane * nidx + i] = -INFINITY;
                continue;
            }
            const float *k = ROWP(id);
            float acc[HB];
#pragma unroll
            for (int h = 0; h < HB; h++) acc[h] = 0.0f;
            for (int d = lane; d < Dh; d += 32) {
                float kd = k[d];
#pragma unroll
                for (int h = 0; h < HB; h++) acc[h] = fmaf(qs[h * Dh + d], kd, acc[h]);
            }
#pragma unroll
            for (int h = 0; h < HB; h++) {
                float v = warp_sum(acc[h]);
                if (lane == 0) S[h * nidx + i] = v * scale;
            }
        }
    }
    __syncthreads();
    for (int h = warp; h < HB; h += ATTN_THREADS / 32) {
        float *sh = S + (size_t)h * nidx;
        float mx = -INFINITY;
        for (int i = lane; i < nidx; i += 32) mx = fmaxf(mx, sh[i]);
        mx = warp_max(mx);
        float sum = 0;
        for (int i = lane; i < nidx; i += 32) {
            float p = ids[i] == -1 ? 0.0f : expf(sh[i] - mx);
            sh[i] = p;
            sum += p;
        }
        sum = warp_sum(sum);
        /* no valid entry: den 0 marks a zero output (the twin's n == 0 case) */
        if (lane == 0) den[h] = mx == -INFINITY ? 0.0f : sum + (h < hb ? expf(sink[h0 + h] - mx) : 0.0f);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < Dh; d += ATTN_THREADS) {
        float acc[HB];
#pragma unroll
        for (int h = 0; h < HB; h++) acc[h] = 0.0f;
        /* 16 rows in flight per step; invalid entries have p = 0 and load nothing */
        for (int i0 = 0; i0 < nidx; i0 += 16) {
            float v[16];
#pragma unroll
            for (int c = 0; c < 16; c++) {
                int id = i0 + c < nidx ? ids[i0 + c] : -1;
                v[c] = id != -1 ? __ldg(ROWP(id) + d) : 0.0f;
            }
#pragma unroll
            for (int c = 0; c < 16; c++) {
                if (i0 + c >= nidx) break;
#pragma unroll
                for (int h = 0; h < HB; h++) acc[h] = fmaf(S[h * nidx + i0 + c], v[c], acc[h]);
            }
        }
#pragma unroll
        for (int h = 0; h < HB; h++)
            if (h < hb) out[((int64_t)t * H + h0 + h) * Dh + d] = den[h] > 0 ? acc[h] / den[h] : 0.0f;
    }
#undef ROWP
}

static size_t attn_smem(int hb, int Dh, int nidx) {
    return sizeof(float) * ((size_t)hb * Dh + (size_t)hb * nidx + hb) + sizeof(int) * (size_t)nidx;
}

template <int HB>
static int attn_launch(const float *q, int T, int H, int Dh, const float *kv, int64_t kv_ld, const int *idx, int nidx,
                       const float *sink, float scale, float *out, cudaStream_t st, const float *const *qbase = NULL,
                       const float *kv2 = NULL) {
    size_t smem = attn_smem(HB, Dh, nidx);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)sparse_attn_kernel<HB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("sparse_attn: cannot raise shared memory to %zu bytes", smem);
    dim3 grid(T, (H + HB - 1) / HB);
    /* with per-query bases the caller guarantees 16-byte aligned rows when Dh % 4 == 0 */
    int vec4 = Dh % 4 == 0 && kv_ld % 4 == 0 && ((uintptr_t)kv & 15) == 0 && ((uintptr_t)kv2 & 15) == 0;
    sparse_attn_kernel<HB><<<grid, ATTN_THREADS, smem, st>>>(q, H, Dh, kv, kv_ld, idx, nidx, sink, scale, out, vec4, qbase, kv2);
    return dsv4_cuda_check_launch("sparse_attn");
}

static int attn_dispatch(const float *q, int T, int H, int Dh, const float *kv, int64_t kv_ld, const int *idx, int nidx,
                         const float *sink, float scale, float *out, void *stream, const float *const *qbase, const float *kv2) {
    if (T < 0 || H <= 0 || Dh <= 0 || nidx < 0 || nidx > 4096 || kv_ld < Dh)
        return dsv4_cuda_fail("sparse_attn: bad shape (T %d H %d Dh %d nidx %d)", T, H, Dh, nidx);
    if (!T) return 0;
    cudaStream_t st = DSV4_STREAM(stream);
    /* the most heads per block whose scores fit in shared memory */
    const size_t lim = (size_t)dsv4_cuda_dev.smem_optin;
    /* few queries (decode): fewer heads per block, so that the blocks fill the GPU */
    if (T * ((H + 3) / 4) < dsv4_cuda_dev.sm_count && attn_smem(1, Dh, nidx) <= lim)
        return attn_launch<1>(q, T, H, Dh, kv, kv_ld, idx, nidx, sink, scale, out, st, qbase, kv2);
    if (T * ((H + 15) / 16) < dsv4_cuda_dev.sm_count && H >= 4 && attn_smem(4, Dh, nidx) <= lim)
        return attn_launch<4>(q, T, H, Dh, kv, kv_ld, idx, nidx, sink, scale, out, st, qbase, kv2);
    if (H >= 16 && attn_smem(16, Dh, nidx) <= lim) return attn_launch<16>(q, T, H, Dh, kv, kv_ld, idx, nidx, sink, scale, out, st, qbase, kv2);
    if (H >= 8 && attn_smem(8, Dh, nidx) <= lim) return attn_launch<8>(q, T, H, Dh, kv, kv_ld, idx, nidx, sink, scale, out, st, qbase, kv2);
    if (H >= 4 && attn_smem(4, Dh, nidx) <= lim) return attn_launch<4>(q, T, H, Dh, kv, kv_ld, idx, nidx, sink, scale, out, st, qbase, kv2);
    if (attn_smem(1, Dh, nidx) <= lim) return attn_launch<1>(q, T, H, Dh, kv, kv_ld, idx, nidx, sink, scale, out, st, qbase, kv2);
    return dsv4_cuda_fail("sparse_attn: Dh %d with %d entries does not fit in shared memory", Dh, nidx);
}

extern "C" int dsv4_cuda_sparse_attn(const float *q, int T, int H, int Dh, const float *kv, int64_t kv_ld, const int *idx,
                                     int nidx, const float *sink, float scale, float *out, void *stream) {
    return attn_dispatch(q, T, H, Dh, kv, kv_ld, idx, nidx, sink, scale, out, stream, NULL, NULL);
}

extern "C" int dsv4_cuda_sparse_attn2(const float *q, int T, int H, int Dh, const float *const *qbase, const float *kv2,
                                      int64_t kv_ld, const int *idx, int nidx, const float *sink, float scale, float *out,
                                      void *stream) {
    return attn_dispatch(q, T, H, Dh, NULL, kv_ld, idx, nidx, sink, scale, out, stream, qbase, kv2);
}
