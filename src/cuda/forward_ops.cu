/* forward_ops.cu - the small ops the GPU-resident forward (forward_cuda.c) needs besides the
 * per-op kernels: embedding gather, indexer scores (spec 9), fills, adds and device copies. Declared in
 * cuda_model.h ("device helpers"). Like the other ops they only enqueue work on the given stream. */
#include "common.cuh"
#include "kv_cache.cuh"
#include "cuda_model.h"

/* ---- embedding: X[t, j, :] = row tok[t] of the embedding, for the M streams ---- */

__global__ void embed_kernel(dsv4_cuda_weight w, const int *tok, int M, int D, float *X) {
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
    embed_kernel<<<grid, 256, 0, DSV4_STREAM(stream)>>>(*w, tok, M, w->cols, X);
    return dsv4_cuda_check_launch("embed");
}

/* ---- fills and copies ---- */

__global__ void fill_kernel(float *x, int64_t n, float v) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) x[i] = v;
}

extern "C" int dsv4_cuda_fill(float *x, int64_t n, float v, void *stream) {
    if (n <= 0) return 0;
    int64_t blocks = (n + 255) / 256;
    fill_kernel<<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, DSV4_STREAM(stream)>>>(x, n, v);
    return dsv4_cuda_check_launch("fill");
}

__global__ void scale_kernel(float *x, int64_t n, float s) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

extern "C" int dsv4_cuda_scale(float *x, int64_t n, float s, void *stream) {
    if (n <= 0) return 0;
    int64_t blocks = (n + 255) / 256;
    scale_kernel<<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, DSV4_STREAM(stream)>>>(x, n, s);
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
 * < nlist[t]. A thread per (query, entry) sums in the twin's order with separately rounded
 * products, so the scores are the CPU's bit for bit (given the same inputs). The grid covers the
 * longest possible list (a fixed launch shape for graphs); blocks past the query's list return at once. */
__global__ void indexer_scores_kernel(const float *qi, const float *wt, int Hi, int Di, const uint8_t *const *keys,
                                      int fp4, const int *ncausal, const int *nlist, int ld, float *out) {
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

extern "C" int dsv4_cuda_indexer_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys, int fp4,
                                        const int *ncausal, const int *nlist, int maxlist, int ld, float *out, void *stream) {
    if (T < 0 || Hi <= 0 || Di <= 0 || maxlist < 0 || ld < maxlist || (fp4 && Di % 32))
        return dsv4_cuda_fail("indexer_scores: bad shape");
    if (!T || !maxlist) return 0;
    size_t smem = sizeof(float) * ((size_t)Hi * Di + Hi);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("indexer_scores: %zu bytes of shared memory", smem);
    dim3 grid((maxlist + 127) / 128, T);
    indexer_scores_kernel<<<grid, 128, smem, DSV4_STREAM(stream)>>>(qi, wt, Hi, Di, keys, fp4, ncausal, nlist, ld, out);
    return dsv4_cuda_check_launch("indexer_scores");
}

/* out[i] += a[i] */
__global__ void add_kernel(float *out, const float *a, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(out[i], a[i]);
}

extern "C" int dsv4_cuda_add(float *out, const float *a, int64_t n, void *stream) {
    if (n <= 0) return 0;
    int64_t blocks = (n + 255) / 256;
    add_kernel<<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, DSV4_STREAM(stream)>>>(out, a, n);
    return dsv4_cuda_check_launch("add");
}
