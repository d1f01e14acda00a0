/* sample.cu - dsv4_cuda_sample (sample_cuda.h): the CPU sampler's algorithm (src/engine/sample.c),
 * one block per sequence. Thread t owns the contiguous token ids [t * chunk, (t + 1) * chunk), so
 * per-thread partial sums combined by an exclusive scan over threads follow id order. Thresholds
 * (top_k, top_p) are found by binary search over the order-preserving 32-bit key of z: 32 passes,
 * each one deterministic block reduction, instead of a sort. */
#include "common.cuh"
#include "sample_cuda.h"
#include "../engine/sample_minp.h"

#define SAMPLE_THREADS 512
#define NWARP (SAMPLE_THREADS / 32)

/* ---- Philox-4x32-10 and the step's uniform (the spec in src/engine/sample.h) ---- */

__device__ static double philox_uniform(uint64_t seed, uint64_t step) {
    uint32_t c0 = 0, c1 = 0, c2 = (uint32_t)step, c3 = (uint32_t)(step >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    return ((double)(c0 >> 5) * 67108864.0 + (double)(c1 >> 6)) / 9007199254740992.0;
}

/* order-preserving key of a float (larger float -> larger key); -inf -> 0x007fffff */
__device__ __forceinline__ uint32_t fkey(float z) {
    uint32_t u = __float_as_uint(z);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* ---- deterministic block reductions / scans (fixed trees) ---- */

struct red_smem {
    double d[NWARP];
    unsigned long long u[NWARP];
    float f[NWARP];
    int i[NWARP];
};

__device__ static double block_sum_d(double v, red_smem *sm) {
    v = warp_sum_d(v);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sm->d[w] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < NWARP; i++) s += sm->d[i]; /* same order in every thread */
    return s;
}

__device__ static unsigned long long block_sum_u(unsigned long long v, red_smem *sm) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sm->u[w] = v;
    __syncthreads();
    unsigned long long s = 0;
    for (int i = 0; i < NWARP; i++) s += sm->u[i];
    return s;
}

__device__ static float block_max_f(float v, red_smem *sm) {
    v = warp_max(v);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sm->f[w] = v;
    __syncthreads();
    float m = sm->f[0];
    for (int i = 1; i < NWARP; i++) m = fmaxf(m, sm->f[i]);
    return m;
}

__device__ static int block_min_i(int v, red_smem *sm) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sm->i[w] = v;
    __syncthreads();
    int m = sm->i[0];
    for (int i = 1; i < NWARP; i++) m = min(m, sm->i[i]);
    return m;
}

__device__ static int block_max_i(int v, red_smem *sm) { return -block_min_i(-v, sm); }

/* Exclusive prefix sum over threads in thread order (= id order of the chunks). */
__device__ static double block_exscan_d(double v, red_smem *sm) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    double inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(0xffffffffu, inc, o);
        if (l >= o) inc += t;
    }
    __syncthreads();
    if (l == 31) sm->d[w] = inc;
    __syncthreads();
    double base = 0;
    for (int i = 0; i < w; i++) base += sm->d[i];
    return base + inc - v;
}

/* ---- the kernel ---- */

struct row_view {
    const float *l;
    int lo, hi; /* this thread's ids */
    int scaled; /* T != 1 */
    float T;
};

__device__ __forceinline__ float zat(const row_view &r, int i) { return r.scaled ? r.l[i] / r.T : r.l[i]; }

__global__ void __launch_bounds__(SAMPLE_THREADS) k_sample(const float *logits, int64_t ld, int V,
                                                          dsv4_cuda_sample_params *params, int advance,
                                                          int32_t *out) {
    __shared__ red_smem sm;
    __shared__ float s_zlo;
    const int b = blockIdx.x;
    const dsv4_cuda_sample_params P = params[b];
    const int chunk = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    row_view r;
    r.l = logits + (int64_t)b * ld;
    r.lo = min(V, (int)threadIdx.x * chunk);
    r.hi = min(V, r.lo + chunk);
    r.T = P.temperature;
    r.scaled = P.temperature != 1.0f;

    /* NaN / +inf check */
    int bad = 0;
    for (int i = r.lo; i < r.hi; i++) bad |= !(r.l[i] < INFINITY);
    if (block_max_i(bad, &sm)) {
        if (threadIdx.x == 0) out[b] = -1;
        return;
    }

    if (P.temperature < 1e-5f) { /* greedy: first maximum */
        float best = -INFINITY;
        int bi = V;
        for (int i = r.lo; i < r.hi; i++)
            if (bi == V || r.l[i] > best) {
                best = r.l[i];
                bi = i;
            }
        float m = block_max_f(best, &sm);
        int id = block_min_i(best == m && bi < V ? bi : V, &sm);
        if (threadIdx.x == 0) {
            out[b] = m == -INFINITY ? -2 : id;
            if (advance && m != -INFINITY) params[b].step = P.step + 1;
        }
        return;
    }

    float lm = -INFINITY;
    for (int i = r.lo; i < r.hi; i++) lm = fmaxf(lm, zat(r, i));
    const float mz = block_max_f(lm, &sm);
    if (mz == -INFINITY || !isfinite(mz)) {
        if (threadIdx.x == 0) out[b] = mz == -INFINITY ? -2 : -1;
        return;
    }
    const double m = mz;

    if (threadIdx.x == 0) s_zlo = dsv4_minp_threshold(mz, P.min_p);
    __syncthreads();
    float zlo = s_zlo;

    if (P.top_k > 0 && P.top_k < V) {
        /* the largest key t with #{finite z : key(z) >= t} >= k: the k-th largest z */
        uint32_t lo = 0, hi = 0xffffffffu; /* invariant: count(lo) >= k (or lo = 0) */
        const uint32_t kinf = fkey(-INFINITY);
        unsigned long long nfin = 0;
        for (int i = r.lo; i < r.hi; i++) nfin += zat(r, i) != -INFINITY;
        nfin = block_sum_u(nfin, &sm);
        if (nfin > (unsigned long long)P.top_k) {
            while (lo < hi) {
                uint32_t mid = (uint32_t)(((uint64_t)lo + hi + 1) >> 1);
                unsigned long long c = 0;
                for (int i = r.lo; i < r.hi; i++) {
                    uint32_t k = fkey(zat(r, i));
                    c += k != kinf && k >= mid;
                }
                c = block_sum_u(c, &sm);
                if (c >= (unsigned long long)P.top_k) lo = mid;
                else hi = mid - 1;
            }
            uint32_t u = (lo & 0x80000000u) ? (lo & 0x7fffffffu) : ~lo;
            float tk = __uint_as_float(u);
            if (tk > zlo) zlo = tk;
        }
    }

    /* top_p: cut = the last kept token in (z desc, id asc) order */
    uint32_t kc = 0;  /* key of the cut value; 0 = no cut */
    int idc = -1;
    if (P.top_p < 1.0f) {
        double W = 0;
        for (int i = r.lo; i < r.hi; i++) {
            float z = zat(r, i);
            if (z >= zlo && z != -INFINITY) W += exp((double)z - m);
        }
        W = block_sum_d(W, &sm);
        const double Pm = (double)P.top_p * W;
        /* the largest key c with mass(key(z) >= c) >= Pm */
        uint32_t lo = 0, hi = 0xffffffffu;
        bool found = false;
        while (lo < hi) {
            uint32_t mid = (uint32_t)(((uint64_t)lo + hi + 1) >> 1);
            double s = 0;
            for (int i = r.lo; i < r.hi; i++) {
                float z = zat(r, i);
                if (z >= zlo && z != -INFINITY && fkey(z) >= mid) s += exp((double)z - m);
            }
            s = block_sum_d(s, &sm);
            if (s >= Pm) {
                lo = mid;
                found = true;
            } else {
                hi = mid - 1;
            }
        }
        if (found) { /* (not found only if rounding defeated Pm < W: keep everything) */
            /* mass strictly above the cut value, then the ties at it in id order */
            double above = 0, tie = 0;
            for (int i = r.lo; i < r.hi; i++) {
                float z = zat(r, i);
                if (!(z >= zlo) || z == -INFINITY) continue;
                uint32_t k = fkey(z);
                if (k > lo) above += exp((double)z - m);
                else if (k == lo) tie += exp((double)z - m);
            }
            above = block_sum_d(above, &sm);
            double c = above + block_exscan_d(tie, &sm);
            int last = -1;
            for (int i = r.lo; i < r.hi; i++) {
                float z = zat(r, i);
                if (!(z >= zlo) || z == -INFINITY || fkey(z) != lo) continue;
                if (c < Pm) last = i;
                c += exp((double)z - m);
            }
            idc = block_max_i(last, &sm);
            if (idc >= 0) kc = lo;
        }
    }

    /* the draw: kept weights in id order, inverse CDF */
    const double u = philox_uniform(P.seed, P.step);
    double s = 0;
    int lastpos = -1;
    for (int i = r.lo; i < r.hi; i++) {
        float z = zat(r, i);
        uint32_t k = fkey(z);
        bool keep = z >= zlo && z != -INFINITY && (idc < 0 || k > kc || (k == kc && i <= idc));
        if (!keep) continue;
        double w = exp((double)z - m);
        s += w;
        if (w > 0) lastpos = i;
    }
    const double base = block_exscan_d(s, &sm);
    const double S = block_sum_d(s, &sm);
    const double t = u * S;
    int pick = V;
    if (base + s > t) { /* the crossing is in this chunk (or an earlier one) */
        double c = base;
        for (int i = r.lo; i < r.hi; i++) {
            float z = zat(r, i);
            uint32_t k = fkey(z);
            bool keep = z >= zlo && z != -INFINITY && (idc < 0 || k > kc || (k == kc && i <= idc));
            if (!keep) continue;
            c += exp((double)z - m);
            if (c > t) {
                pick = i;
                break;
            }
        }
    }
    pick = block_min_i(pick, &sm);
    const int lastk = block_max_i(lastpos, &sm);
    if (threadIdx.x == 0) {
        out[b] = pick < V ? pick : lastk;
        if (advance) params[b].step = P.step + 1;
    }
}

extern "C" int dsv4_cuda_sample(const float *logits, int64_t ld, int B, int V, dsv4_cuda_sample_params *params,
                                int advance, int32_t *out, void *stream) {
    if (B < 0 || V <= 0 || ld < V) return dsv4_cuda_fail("sample: bad shape B=%d V=%d ld=%lld", B, V, (long long)ld);
    if (B == 0) return 0;
    k_sample<<<B, SAMPLE_THREADS, 0, DSV4_STREAM(stream)>>>(logits, ld, V, params, advance, out);
    return dsv4_cuda_check_launch("sample");
}
