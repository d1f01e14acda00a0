/* forward_ops.cu - the small ops the GPU-resident forward (forward_cuda.c) needs besides the
 * per-op kernels: embedding gather, indexer scores (spec 9), fills, adds and device copies. Declared in
 * cuda_model.h ("device helpers"). Like the other ops they only enqueue work on the given stream. */
#include "common.cuh"
#include "kv_cache.cuh"
#include "cuda_model.h"
#include "indexer.cuh"
#include "indexer_tc.h"

/* ---- embedding: X[t, j, :] = row tok[t] of the embedding, for the M streams ---- */

__global__ void embed_kernel(dsv4_cuda_weight w, const int *tok, int M, int D, float *X) {
    dev_pdl_enter();
    const int t = blockIdx.y;
    const int r = tok[t];
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) {
        float v = dev_weight_at(w, r, c);
        for (int j = 0; j < M; j++) X[((int64_t)t * M + j) * D + c] = v;
    }
}

extern "C" int dsv4_cuda_embed(const dsv4_cuda_weight *w, const int *tok, int T, int M, float *X, void *stream) {
    if (T < 0 || M <= 0) return dsv4_cuda_fail("embed: bad shape (T %d M %d)", T, M);
    if (!T) return 0;
    dim3 grid((w->cols + 255) / 256, T);
    dev_launch(embed_kernel, grid, 256, 0, DSV4_STREAM(stream), *w, tok, M, w->cols, X);
    return dsv4_cuda_check_launch("embed");
}

/* ---- fills and copies ---- */

__global__ void fill_kernel(float *x, int64_t n, float v) {
    dev_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) x[i] = v;
}

extern "C" int dsv4_cuda_fill(float *x, int64_t n, float v, void *stream) {
    if (n <= 0) return 0;
    int64_t blocks = (n + 255) / 256;
    dev_launch(fill_kernel, (unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, DSV4_STREAM(stream), x, n, v);
    return dsv4_cuda_check_launch("fill");
}

__global__ void scale_kernel(float *x, int64_t n, float s) {
    dev_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

extern "C" int dsv4_cuda_scale(float *x, int64_t n, float s, void *stream) {
    if (n <= 0) return 0;
    int64_t blocks = (n + 255) / 256;
    dev_launch(scale_kernel, (unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, DSV4_STREAM(stream), x, n, s);
    return dsv4_cuda_check_launch("scale");
}

extern "C" int dsv4_cuda_copy(void *dst, const void *src, size_t bytes, void *stream) {
    if (!bytes) return 0;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, DSV4_STREAM(stream));
    return e == cudaSuccess ? 0 : dsv4_cuda_fail("copy: %s", cudaGetErrorString(e));
}

extern "C" int dsv4_cuda_copy2d(float *dst, int64_t dld, const float *src, int64_t sld, int rows, int n, void *stream) {
    if (rows <= 0 || n <= 0) return 0;
    cudaError_t e = cudaMemcpy2DAsync(dst, (size_t)dld * sizeof(float), src, (size_t)sld * sizeof(float), (size_t)n * sizeof(float),
                                      (size_t)rows, cudaMemcpyDeviceToDevice, DSV4_STREAM(stream));
    return e == cudaSuccess ? 0 : dsv4_cuda_fail("copy2d: %s", cudaGetErrorString(e));
}

/* ---- indexer scores (twin: the score loop of indexer_topk() in forward_attn.c) ----
 * score[t, w] = sum_h wt[t,h] * relu(qi[t,h] . k_w) for w < ncausal[t], -inf for ncausal[t] <= w
 * < nlist[t]. The twin's order with separately rounded products: each (entry, head) dot a sequential chain over
 * j, then each entry's sum a sequential chain over h, so the scores are the CPU's bit for bit (given the same
 * inputs) whatever the launch shape.
 * ixs_kernel: a block per (query, group of IX_EP * 128 / Hi entries at a time); thread (h, g) keeps q[t, h] in
 * registers and runs the IX_EP dot chains of its entries side by side over the keys, dequantized once per block
 * into shared memory; the dots go through shared memory to one thread per entry for the chain over the heads.
 * A query's blocks stride over its chunks, so the grid (which may depend on T: it changes no operation) stays
 * small for long capacities and its chunks past nlist[t] cost nothing.
 * indexer_scores_kernel (other shapes): a thread per (query, entry) running the whole chain. */
#define IX_THREADS 128
#define IXT_MIN_T 32 /* queries from which indexer_tc.cu's kernel runs */
#define IX_EP 4

template <int DI>
__global__ void __launch_bounds__(IX_THREADS) ixs_kernel(const float *qi, const float *wt, int Hi, const uint8_t *const *keys,
                                                         int fp4, const int *ncausal, const int *nlist, int ld, float *out) {
    dev_pdl_enter();
    constexpr int QLD = DI + 4; /* q rows 4 banks apart: the row-per-thread float4 reads of a quarter warp are conflict free */
    extern __shared__ __align__(16) float ism[];
    const int NG = IX_THREADS / Hi, E = NG * IX_EP, HP = (Hi + 3) & ~3;
    float *qs = ism;             /* [Hi][QLD] */
    float *ws = qs + Hi * QLD;   /* [HP] */
    float *ks = ws + HP;         /* [E][DI] keys of the chunk */
    float *ds = ks + E * DI;     /* [E][Hi + 1] dots of the chunk */
    const int t = blockIdx.y, n = nlist[t], ncs = ncausal[t], nch = (n + E - 1) / E;
    if ((int)blockIdx.x >= nch) return;
    const float *qt = qi + (int64_t)t * Hi * DI;
    for (int i = threadIdx.x; i < Hi * (DI / 4); i += IX_THREADS) {
        const int h = i / (DI / 4), j = i - h * (DI / 4);
        *(float4 *)(qs + h * QLD + 4 * j) = *(const float4 *)(qt + (int64_t)h * DI + 4 * j);
    }
    for (int i = threadIdx.x; i < Hi; i += IX_THREADS) ws[i] = wt[(int64_t)t * Hi + i];
    __syncthreads();
    const int h = threadIdx.x % Hi, g = threadIdx.x / Hi;
    const bool active = g < NG;
    float qr[DI];
#pragma unroll
    for (int j = 0; j < DI; j += 4) {
        const float4 v = active ? *(const float4 *)(qs + h * QLD + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        qr[j] = v.x, qr[j + 1] = v.y, qr[j + 2] = v.z, qr[j + 3] = v.w;
    }
    const int64_t rbytes = dsv4_ikey_row_bytes(DI);
    for (int c = blockIdx.x; c < nch; c += gridDim.x) {
        const int w0 = c * E;
        /* the chunk's keys (those the query sees) into shared memory, 8 values per item */
        for (int it = threadIdx.x; it < E * (DI / 8); it += IX_THREADS) {
            const int e = it / (DI / 8), p = it - e * (DI / 8), w = w0 + e;
            if (w >= n || w >= ncs) continue;
            float4 lo, hi;
            if (fp4) {
                const uint8_t *kr = keys[t] + (int64_t)w * rbytes;
                const uint32_t cw = *(const uint32_t *)(kr + 4 * p);
                const float sc = dev_e8m0(kr[DI / 2 + p / 4]);
                float v[8];
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = dev_e2m1_x2((cw >> (4 * k)) & 15u) * 0.5f * sc; /* = dev_ikey_at */
                lo = make_float4(v[0], v[1], v[2], v[3]), hi = make_float4(v[4], v[5], v[6], v[7]);
            } else {
                const float *kr = (const float *)keys[t] + (int64_t)w * DI + 8 * p;
                lo = *(const float4 *)kr, hi = *(const float4 *)(kr + 4);
            }
            *(float4 *)(ks + e * DI + 8 * p) = lo;
            *(float4 *)(ks + e * DI + 8 * p + 4) = hi;
        }
        __syncthreads();
        if (active) {
            float dot[IX_EP];
            const float *k0 = ks + g * IX_EP * DI;
#pragma unroll
            for (int e = 0; e < IX_EP; e++) dot[e] = 0.0f;
#pragma unroll
            for (int j = 0; j < DI; j += 4) {
#pragma unroll
                for (int e = 0; e < IX_EP; e++) {
                    const float4 kv = *(const float4 *)(k0 + e * DI + j);
                    dot[e] = __fadd_rn(dot[e], __fmul_rn(qr[j], kv.x));
                    dot[e] = __fadd_rn(dot[e], __fmul_rn(qr[j + 1], kv.y));
                    dot[e] = __fadd_rn(dot[e], __fmul_rn(qr[j + 2], kv.z));
                    dot[e] = __fadd_rn(dot[e], __fmul_rn(qr[j + 3], kv.w));
                }
            }
#pragma unroll
            for (int e = 0; e < IX_EP; e++) ds[(g * IX_EP + e) * (Hi + 1) + h] = dot[e];
        }
        __syncthreads();
        /* the chain over the heads, a thread per entry (the next chunk's keys load meanwhile) */
        ix_head_sums(ds, Hi + 1, 1, 0, ws, Hi, w0, E, n, ncs, out + (int64_t)t * ld, threadIdx.x, IX_THREADS);
    }
}

__global__ void indexer_scores_kernel(const float *qi, const float *wt, int Hi, int Di, const uint8_t *const *keys,
                                      int fp4, const int *ncausal, const int *nlist, int ld, float *out) {
    dev_pdl_enter();
    extern __shared__ float iss[];
    float *qs = iss, *ws = iss + Hi * Di;
    const int t = blockIdx.y;
    if ((int64_t)blockIdx.x * blockDim.x >= nlist[t]) return; /* the whole block is past the list */
    for (int i = threadIdx.x; i < Hi * Di; i += blockDim.x) qs[i] = qi[(int64_t)t * Hi * Di + i];
    for (int i = threadIdx.x; i < Hi; i += blockDim.x) ws[i] = wt[(int64_t)t * Hi + i];
    __syncthreads();
    const int w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= nlist[t]) return;
    if (w >= ncausal[t]) {
        out[(int64_t)t * ld + w] = -INFINITY;
        return;
    }
    float s = 0;
    if (fp4) { /* the stored format decodes to the same values exactly */
        const uint8_t *k = keys[t] + (int64_t)w * dsv4_ikey_row_bytes(Di);
        for (int h = 0; h < Hi; h++) {
            float dot = 0;
            for (int j = 0; j < Di; j++) dot = __fadd_rn(dot, __fmul_rn(qs[h * Di + j], dev_ikey_at(k, Di, j)));
            s = __fadd_rn(s, __fmul_rn(ws[h], dot > 0 ? dot : 0));
        }
    } else {
        const float *k = (const float *)keys[t] + (int64_t)w * Di;
        for (int h = 0; h < Hi; h++) {
            float dot = 0;
            for (int j = 0; j < Di; j++) dot = __fadd_rn(dot, __fmul_rn(qs[h * Di + j], k[j]));
            s = __fadd_rn(s, __fmul_rn(ws[h], dot > 0 ? dot : 0));
        }
    }
    out[(int64_t)t * ld + w] = s;
}

template <int DI>
static int ixs_launch(const float *qi, const float *wt, int T, int Hi, const uint8_t *const *keys, int fp4,
                      const int *ncausal, const int *nlist, int maxlist, int ld, float *out, cudaStream_t st) {
    const int E = (IX_THREADS / Hi) * IX_EP;
    const size_t smem = sizeof(float) * ((size_t)Hi * (DI + 4) + ((Hi + 3) & ~3) + (size_t)E * DI + (size_t)E * (Hi + 1));
    if (smem > (size_t)dsv4_cuda_dev.smem_optin) return 1; /* not this kernel */
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)ixs_kernel<DI>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("indexer_scores: %zu bytes of shared memory", smem);
    /* blocks per query: every chunk its own block at small T, ~2 blocks per SM in all */
    const long nch = (maxlist + E - 1) / E, want = (2L * dsv4_cuda_dev.sm_count + T - 1) / T;
    dim3 grid((unsigned)(nch < want ? nch : want), T);
    dev_launch(ixs_kernel<DI>, grid, IX_THREADS, smem, st, qi, wt, Hi, keys, fp4, ncausal, nlist, ld, out);
    return dsv4_cuda_check_launch("indexer_scores");
}

extern "C" int dsv4_cuda_indexer_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys, int fp4,
                                        const int *ncausal, const int *nlist, int maxlist, int ld, float *out, void *stream) {
    if (T < 0 || Hi <= 0 || Di <= 0 || maxlist < 0 || ld < maxlist || (fp4 && Di % 32))
        return dsv4_cuda_fail("indexer_scores: bad shape");
    if (!T || !maxlist) return 0;
    cudaStream_t st = DSV4_STREAM(stream);
    /* many queries over FP4 keys: tensor cores (indexer_tc.cu), the same bits */
    if (fp4 && T >= IXT_MIN_T) {
        const int rc = dsv4_ixt_scores(qi, wt, T, Hi, Di, keys, ncausal, nlist, maxlist, ld, out, st);
        if (rc <= 0) return rc;
    }
    /* ixs_kernel: Di 64 or 128, Hi <= 128, q rows (and fp32 key rows) 16-byte aligned */
    if (Hi <= IX_THREADS && !((uintptr_t)qi & 15)) {
        int rc = 1;
        if (Di == 128) rc = ixs_launch<128>(qi, wt, T, Hi, keys, fp4, ncausal, nlist, maxlist, ld, out, st);
        else if (Di == 64) rc = ixs_launch<64>(qi, wt, T, Hi, keys, fp4, ncausal, nlist, maxlist, ld, out, st);
        if (rc <= 0) return rc;
    }
    size_t smem = sizeof(float) * ((size_t)Hi * Di + Hi);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("indexer_scores: %zu bytes of shared memory", smem);
    dim3 grid((maxlist + 127) / 128, T);
    dev_launch(indexer_scores_kernel, grid, 128, smem, st, qi, wt, Hi, Di, keys, fp4, ncausal, nlist, ld, out);
    return dsv4_cuda_check_launch("indexer_scores");
}

/* out[i] += a[i] */
__global__ void add_kernel(float *out, const float *a, int64_t n) {
    dev_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(out[i], a[i]);
}

extern "C" int dsv4_cuda_add(float *out, const float *a, int64_t n, void *stream) {
    if (n <= 0) return 0;
    int64_t blocks = (n + 255) / 256;
    dev_launch(add_kernel, (unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, DSV4_STREAM(stream), out, a, n);
    return dsv4_cuda_check_launch("add");
}
