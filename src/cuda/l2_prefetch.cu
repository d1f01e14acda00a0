/* l2_prefetch.cu - weights asked of L2 ahead of the linear that reads them (cuda_model.h, dsv4_cuda_l2_prefetch).
 *
 * A decode step at small batches is a chain of latency-bound kernels (norms, mHC, attention, top-k, routing)
 * between the linears that stream the weights; during the former DRAM idles. forward_cuda.c forks this kernel on a
 * stream of its own at such points: it issues cp.async.bulk.prefetch.L2 for the weights of the linears a little
 * further down the chain, so that those read L2 instead of DRAM. It changes no value (a prefetch has no result) and
 * returns as soon as its requests are issued (the copies into L2 complete in the background). */
#include "cuda_model.h"
#include "common.cuh"

#define PF_THREADS 128
#define PF_BLOCKS 4
#define PF_CHUNK (16 << 10) /* bytes a prefetch instruction */

typedef struct pf_ranges {
    const uint8_t *p[DSV4_L2PF_MAXW * 2];
    unsigned long long n[DSV4_L2PF_MAXW * 2];
    int count;
} pf_ranges;

__global__ void __launch_bounds__(PF_THREADS) l2pf_kernel(pf_ranges r) {
    const int nth = gridDim.x * blockDim.x, id = blockIdx.x * blockDim.x + threadIdx.x;
    for (int j = 0; j < r.count; j++) {
        const unsigned long long n = r.n[j], nch = (n + PF_CHUNK - 1) / PF_CHUNK;
        for (unsigned long long c = id; c < nch; c += nth) {
            const unsigned long long o = c * PF_CHUNK, left = n - o;
            const unsigned sz = (unsigned)((left < PF_CHUNK ? left : PF_CHUNK) & ~15ull);
            if (sz) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.p[j] + o), "r"(sz) : "memory");
        }
    }
}

/* bytes of a view's rows (from row0) and of its scale rows */
__host__ __device__ static void weight_ranges(const dsv4_cuda_weight *w, pf_ranges *r, size_t *left) {
    size_t rb; /* bytes a row */
    switch (w->fmt) {
    case DSV4_WF_F32: rb = (size_t)w->cols * 4; break;
    case DSV4_WF_BF16:
    case DSV4_WF_F16: rb = (size_t)w->cols * 2; break;
    case DSV4_WF_FP8: rb = (size_t)w->cols; break;
    case DSV4_WF_MXFP4:
    case DSV4_WF_NVFP4: rb = (size_t)w->cols / 2; break;
    default: return;
    }
    size_t n = rb * (size_t)w->rows;
    if (n > *left) n = *left;
    *left -= n;
    if (n >= 16 && ((uintptr_t)(w->data + rb * (size_t)w->row0) & 15) == 0)
        r->p[r->count] = w->data + rb * (size_t)w->row0, r->n[r->count++] = n;
    if (!w->scale) return;
    size_t sb = 0, s0 = 0; /* scale bytes of the view and their offset */
    const size_t es = w->scale_f32 ? 4 : 1;
    if (w->fmt == DSV4_WF_FP8) {
        s0 = (size_t)(w->row0 / 128) * w->scale_stride * es;
        sb = (size_t)((w->rows + 127) / 128) * w->scale_stride * es;
    } else if (w->fmt == DSV4_WF_MXFP4 || w->fmt == DSV4_WF_NVFP4) {
        s0 = (size_t)w->row0 * w->scale_stride;
        sb = (size_t)w->rows * w->scale_stride;
    }
    const uintptr_t a = (uintptr_t)(w->scale + s0), a16 = (a + 15) & ~(uintptr_t)15;
    if (sb > a16 - a + 16) r->p[r->count] = (const uint8_t *)a16, r->n[r->count++] = sb - (a16 - a);
}

/* block a: the chosen matrices of active expert a (a thread a chunk) */
__global__ void __launch_bounds__(PF_THREADS) l2pf_experts_kernel(dsv4_cuda_experts ex, dsv4_cuda_moe_plan p, int which) {
    const int a = blockIdx.x;
    if (a >= *p.nact) return;
    const int e = p.act_e[a];
    pf_ranges r;
    r.count = 0;
    size_t left = (size_t)-1;
    if (which & 1) weight_ranges(&ex.w1[e], &r, &left), weight_ranges(&ex.w3[e], &r, &left);
    if (which & 2) weight_ranges(&ex.w2[e], &r, &left);
    for (int j = 0; j < r.count; j++) {
        const unsigned long long n = r.n[j], nch = (n + PF_CHUNK - 1) / PF_CHUNK;
        for (unsigned long long c = threadIdx.x; c < nch; c += blockDim.x) {
            const unsigned long long o = c * PF_CHUNK, rest = n - o;
            const unsigned sz = (unsigned)((rest < PF_CHUNK ? rest : PF_CHUNK) & ~15ull);
            if (sz) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.p[j] + o), "r"(sz) : "memory");
        }
    }
}

extern "C" int dsv4_cuda_l2_prefetch_experts(const dsv4_cuda_experts *ex, const dsv4_cuda_moe_plan *p, int maxact, int which,
                                             void *stream) {
    if (maxact < 1 || !(which & 3)) return 0;
    l2pf_experts_kernel<<<maxact, PF_THREADS, 0, DSV4_STREAM(stream)>>>(*ex, *p, which);
    return dsv4_cuda_check_launch("l2_prefetch_experts");
}

extern "C" int dsv4_cuda_l2_prefetch(const dsv4_cuda_weight *const *ws, int n, size_t cap, void *stream) {
    if (n < 0 || n > DSV4_L2PF_MAXW) return dsv4_cuda_fail("l2_prefetch: %d weights (at most %d)", n, DSV4_L2PF_MAXW);
    pf_ranges r;
    r.count = 0;
    size_t left = cap ? cap : (size_t)-1;
    for (int i = 0; i < n; i++)
        if (ws[i] && ws[i]->data) weight_ranges(ws[i], &r, &left);
    if (!r.count) return 0;
    l2pf_kernel<<<PF_BLOCKS, PF_THREADS, 0, DSV4_STREAM(stream)>>>(r);
    return dsv4_cuda_check_launch("l2_prefetch");
}
