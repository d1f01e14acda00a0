/* legacy_kv8.cu - tests only: the attention over cache rows (attn_kv8) and the indexer scores as they were
 * before the split-per-32-entries / parallel-dot versions (src/cuda/attn_kv8.cu, forward_ops.cu), kept so that
 * test_attn_kv8 can time before / after in one run and check the new indexer kernel bit for bit against the old one.
 * Code unchanged except for the names (legacy_*, internal linkage). */
#include "../../src/cuda/common.cuh"
#include "../../src/cuda/kv_cache.cuh"

extern "C" {
int legacy_attn_kv8(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                    const int *idx, int nidx, const float *sink, float scale, float *out, float *scratch, void *stream);
size_t legacy_attn_kv8_scratch(int T, int H, int Dh, int nidx);
int legacy_indexer_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys, int fp4,
                          const int *ncausal, const int *nlist, int maxlist, int ld, float *out, void *stream);
}

namespace {
#define KV_THREADS 256
#define KV_CH 64
#define KV_SPLIT 256
#define KV_MAXD 4

/* Partial result of one (query, head, split): m, l, then Dh accumulated values. */
static __host__ __device__ inline int64_t part_stride(int Dh) { return (int64_t)Dh + 2; }

template <int HB>
__global__ void __launch_bounds__(KV_THREADS) attn_kv8_kernel(const float *q, int H, int Dh, int R,
                                                              const uint8_t *const *base, const float *kv2,
                                                              const int *idx, int nidx, const float *sink, float scale,
                                                              float *out, float *part, int nsplit) {
    extern __shared__ float smem[];
    const int KLD = Dh + 1; /* odd row stride: the score threads (one per entry) hit distinct banks */
    float *qs = smem;                         /* [HB][Dh] */
    float *Ks = qs + HB * Dh;                 /* [KV_CH][KLD] */
    float *S = Ks + KV_CH * KLD;              /* [HB][KV_CH] */
    float *mrow = S + HB * KV_CH, *lrow = mrow + HB, *arow = lrow + HB; /* [HB] each */
    int *ids = (int *)(arow + HB);            /* [KV_CH] */
    const int t = blockIdx.x, h0 = blockIdx.y * HB, sp = blockIdx.z;
    const int hb = H - h0 < HB ? H - h0 : HB, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int e0 = sp * KV_SPLIT, e1 = min(nidx, e0 + KV_SPLIT);
    const uint8_t *cache = base ? base[t] : NULL;
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);

    for (int i = threadIdx.x; i < HB * Dh; i += KV_THREADS) {
        int h = i / Dh;
        qs[i] = h < hb ? q[((int64_t)t * H + h0 + h) * Dh + (i - h * Dh)] : 0.0f;
    }
    if (threadIdx.x < HB) {
        mrow[threadIdx.x] = -INFINITY;
        lrow[threadIdx.x] = 0.0f;
    }
    float acc[HB][KV_MAXD];
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
        for (int k = 0; k < KV_MAXD; k++) acc[h][k] = 0.0f;

    for (int c0 = e0; c0 < e1; c0 += KV_CH) {
        const int nc = min(KV_CH, e1 - c0);
        __syncthreads(); /* the previous chunk is consumed */
        if (threadIdx.x < KV_CH) {
            int id = threadIdx.x < nc ? idx[(int64_t)t * nidx + c0 + threadIdx.x] : -1;
            if (id >= 0 && !cache) id = -1;
            if (id < -1 && !kv2) id = -1;
            ids[threadIdx.x] = id;
        }
        __syncthreads();
        /* rows into shared memory: a warp per row */
        for (int i = warp; i < nc; i += KV_THREADS / 32) {
            int id = ids[i];
            float *kd = Ks + i * KLD;
            if (id >= 0) {
                const uint8_t *row = cache + (int64_t)id * rb;
                for (int d = lane; d < Dh; d += 32) kd[d] = dev_kv_at(row, Dh, R, d);
            } else if (id < -1) {
                const float *row = kv2 + (int64_t)(-id - 2) * Dh;
                for (int d = lane; d < Dh; d += 32) kd[d] = row[d];
            } else {
                for (int d = lane; d < Dh; d += 32) kd[d] = 0.0f;
            }
        }
        __syncthreads();
        /* scores */
        for (int p = threadIdx.x; p < HB * KV_CH; p += KV_THREADS) {
            int h = p / KV_CH, i = p - h * KV_CH;
            if (i >= nc || ids[i] == -1) {
                S[p] = -INFINITY;
                continue;
            }
            const float *qh = qs + h * Dh, *kd = Ks + i * KLD;
            float s = 0.0f;
            for (int d = 0; d < Dh; d++) s = fmaf(qh[d], kd[d], s);
            S[p] = s * scale;
        }
        __syncthreads();
        /* online softmax: a warp per head */
        for (int h = warp; h < HB; h += KV_THREADS / 32) {
            float *sh = S + h * KV_CH;
            float v0 = sh[lane], v1 = sh[lane + 32];
            float mc = warp_max(fmaxf(v0, v1));
            float mo = mrow[h], mn = fmaxf(mo, mc);
            float p0 = 0.0f, p1 = 0.0f, a = 1.0f;
            if (mn != -INFINITY) {
                p0 = v0 == -INFINITY ? 0.0f : expf(v0 - mn);
                p1 = v1 == -INFINITY ? 0.0f : expf(v1 - mn);
                a = mo == -INFINITY ? 0.0f : expf(mo - mn);
            }
            sh[lane] = p0;
            sh[lane + 32] = p1;
            float ps = warp_sum(p0 + p1);
            if (lane == 0) {
                lrow[h] = lrow[h] * a + ps;
                mrow[h] = mn;
                arow[h] = a;
            }
        }
        __syncthreads();
        /* weighted sum */
#pragma unroll
        for (int k = 0; k < KV_MAXD; k++) {
            int d = threadIdx.x + k * KV_THREADS;
            if (d >= Dh) break;
#pragma unroll
            for (int h = 0; h < HB; h++) {
                float sacc = 0.0f;
                const float *ph = S + h * KV_CH;
                for (int i = 0; i < nc; i++) sacc = fmaf(ph[i], Ks[i * KLD + d], sacc);
                acc[h][k] = fmaf(acc[h][k], arow[h], sacc);
            }
        }
    }
    __syncthreads();
    /* write: the final output (one split) or this split's partial */
#pragma unroll
    for (int h = 0; h < HB; h++) {
        if (h >= hb) break;
        const float m = mrow[h], l = lrow[h];
        if (nsplit == 1) {
            float den = m == -INFINITY ? 0.0f : l + expf(sink[h0 + h] - m);
#pragma unroll
            for (int k = 0; k < KV_MAXD; k++) {
                int d = threadIdx.x + k * KV_THREADS;
                if (d < Dh) out[((int64_t)t * H + h0 + h) * Dh + d] = den > 0 ? acc[h][k] / den : 0.0f;
            }
        } else {
            float *pp = part + (((int64_t)t * H + h0 + h) * nsplit + sp) * part_stride(Dh);
            if (threadIdx.x == 0) pp[0] = m, pp[1] = l;
#pragma unroll
            for (int k = 0; k < KV_MAXD; k++) {
                int d = threadIdx.x + k * KV_THREADS;
                if (d < Dh) pp[2 + d] = acc[h][k];
            }
        }
    }
}

/* one block per (query, head): merges the splits in order */
__global__ void attn_kv8_combine(const float *part, int H, int Dh, int nsplit, const float *sink, float *out) {
    const int t = blockIdx.x, h = blockIdx.y;
    const float *pp = part + ((int64_t)t * H + h) * nsplit * part_stride(Dh);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, pp[s * part_stride(Dh)]);
    float L = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        float m = pp[s * part_stride(Dh)];
        if (m != -INFINITY) L += pp[s * part_stride(Dh) + 1] * expf(m - M);
    }
    float den = M == -INFINITY ? 0.0f : L + expf(sink[h] - M);
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            float m = pp[s * part_stride(Dh)];
            if (m != -INFINITY) o += pp[s * part_stride(Dh) + 2 + d] * expf(m - M);
        }
        out[((int64_t)t * H + h) * Dh + d] = den > 0 ? o / den : 0.0f;
    }
}

static size_t kv8_smem(int hb, int Dh) {
    return sizeof(float) * ((size_t)hb * Dh + (size_t)KV_CH * (Dh + 1) + (size_t)hb * KV_CH + 3 * (size_t)hb) +
           sizeof(int) * KV_CH;
}

static int nsplits(int nidx) { return nidx <= KV_SPLIT ? 1 : (nidx + KV_SPLIT - 1) / KV_SPLIT; }

} /* namespace */
extern "C" size_t legacy_attn_kv8_scratch(int T, int H, int Dh, int nidx) {
    int ns = nsplits(nidx);
    return ns == 1 ? 0 : (size_t)T * H * ns * (size_t)part_stride(Dh);
}

namespace {

template <int HB>
static int kv8_launch(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                      const int *idx, int nidx, const float *sink, float scale, float *out, float *scratch,
                      cudaStream_t st) {
    size_t smem = kv8_smem(HB, Dh);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)attn_kv8_kernel<HB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess)
        return dsv4_cuda_fail("legacy attn_kv8: cannot raise shared memory to %zu bytes", smem);
    const int ns = nsplits(nidx);
    dim3 grid(T, (H + HB - 1) / HB, ns);
    attn_kv8_kernel<HB><<<grid, KV_THREADS, smem, st>>>(q, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, ns);
    if (dsv4_cuda_check_launch("legacy attn_kv8")) return -1;
    if (ns > 1) {
        attn_kv8_combine<<<dim3(T, H), 128, 0, st>>>(scratch, H, Dh, ns, sink, out);
        return dsv4_cuda_check_launch("legacy attn_kv8_combine");
    }
    return 0;
}

} /* namespace */
extern "C" int legacy_attn_kv8(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base,
                                  const float *kv2, const int *idx, int nidx, const float *sink, float scale, float *out,
                                  float *scratch, void *stream) {
    if (T < 0 || H <= 0 || Dh <= R || (Dh - R) % 64 || R % 2 || Dh > KV_MAXD * KV_THREADS || nidx < 0)
        return dsv4_cuda_fail("legacy attn_kv8: bad shape (T %d H %d Dh %d R %d nidx %d)", T, H, Dh, R, nidx);
    if (!T) return 0;
    if (nsplits(nidx) > 1 && !scratch) return dsv4_cuda_fail("legacy attn_kv8: %d entries need scratch", nidx);
    cudaStream_t st = DSV4_STREAM(stream);
    if (nidx == 0) { /* no entries anywhere: zeros */
        if (cudaMemsetAsync(out, 0, sizeof(float) * (size_t)T * H * Dh, st) != cudaSuccess)
            return dsv4_cuda_fail("legacy attn_kv8: memset failed");
        return 0;
    }
    const size_t lim = (size_t)dsv4_cuda_dev.smem_optin;
    /* heads per block: the fewest blocks that still fill the GPU (fewer re-reads of the rows);
     * the head grouping does not change any sum, so this choice may depend on T */
    const long blocks16 = (long)T * ((H + 15) / 16) * nsplits(nidx);
    if (H >= 16 && blocks16 >= dsv4_cuda_dev.sm_count && kv8_smem(16, Dh) <= lim)
        return kv8_launch<16>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, st);
    if (H >= 4 && (long)T * ((H + 3) / 4) * nsplits(nidx) >= dsv4_cuda_dev.sm_count && kv8_smem(4, Dh) <= lim)
        return kv8_launch<4>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, st);
    if (kv8_smem(1, Dh) <= lim)
        return kv8_launch<1>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, st);
    return dsv4_cuda_fail("legacy attn_kv8: Dh %d does not fit in shared memory", Dh);
}

static __global__ void legacy_indexer_scores_kernel(const float *qi, const float *wt, int Hi, int Di, const uint8_t *const *keys,
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

extern "C" int legacy_indexer_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys, int fp4,
                                        const int *ncausal, const int *nlist, int maxlist, int ld, float *out, void *stream) {
    if (T < 0 || Hi <= 0 || Di <= 0 || maxlist < 0 || ld < maxlist || (fp4 && Di % 32))
        return dsv4_cuda_fail("legacy indexer_scores: bad shape");
    if (!T || !maxlist) return 0;
    size_t smem = sizeof(float) * ((size_t)Hi * Di + Hi);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)legacy_indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("legacy indexer_scores: %zu bytes of shared memory", smem);
    dim3 grid((maxlist + 127) / 128, T);
    legacy_indexer_scores_kernel<<<grid, 128, smem, DSV4_STREAM(stream)>>>(qi, wt, Hi, Di, keys, fp4, ncausal, nlist, ld, out);
    return dsv4_cuda_check_launch("legacy indexer_scores");
}

