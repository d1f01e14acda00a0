/* topk.cu - the indexer's top-k on the GPU (cuda_model.h): the CPU engine's selection (torch.topk's,
 * exact ties included), one block per query row, depending only on the row.
 *
 * Fast path: each score becomes a unique 64-bit key (the float's bits mapped to an order-preserving
 * unsigned integer, then the complement of the index); a radix select finds the k-th largest key 8 bits
 * at a time from the top (a shared-memory histogram of the digit among the keys that match the digits
 * chosen so far, then the bin holding the k-th; it stops as soon as that bin holds exactly the remaining
 * count, typically after 3-4 of the 8 digits). The keys at or above the found prefix are exactly k; they
 * are gathered and sorted (bitonic, in shared memory) into decreasing order, which is torch's order
 * when the values are distinct.
 * Ties: where torch's choice depends on its algorithm (the k-th value equal to an unselected one, "boundary
 * ties"; -inf aside: those entries are masked and dropped), one thread redoes the row with the CPU's own
 * algorithm (src/cpu/topk_algo.h) on a copy of the row: in shared memory for
 * rows up to TOPK_SMEM_N entries (the block copies it; measured ~20 % faster than the global scratch:
 * 882 us for a tied row of 8192 entries, 1,101 us for 8193), else in the scratch. Rare with real scores, common in tiny test
 * models (ReLU zeros) and with repeated prompt tokens (equal compressed entries).
 * Equal values that are all selected ("order ties": the set is the same whatever the algorithm, only the order
 * of the equal entries is torch's own) keep the fast path's order, equal values by increasing index, unless
 * DSV4_TOPK_EXACT_ORDER=1 (then torch's order by the one-thread path, as the CPU engine has it): the attention
 * then adds the same entries in another order, a rounding-level difference from the CPU engine, and the
 * result still depends only on the row (batch invariant, deterministic).
 * Counters (dsv4_cuda_topk_counts): rows, rows with order ties only, rows with boundary ties. */
#include <stdlib.h>

#include "common.cuh"
#include "cuda_model.h"

#define DSV4_TK_FN __host__ __device__
#include "../cpu/topk_algo.h"

#define TOPK_THREADS 1024 /* threads a row where k > 512 (the sort's register form needs the padded k within the block) */
#define TOPK_THREADS_S 512 /* threads a row where k <= 512: two rows an SM at 64 registers, so one row's barriers overlap the
                            * other's work (session 51: 4096 rows of an 8K prefill 382.6 -> 192.2 us on an H100, the same
                            * picks); DSV4_TOPK_THREADS=1024: the 1024-thread form for every k */
#define TOPK_THREADS_XS 256 /* DSV4_TOPK_THREADS=256, k <= 512: four rows an SM, two of the sort's keys a thread */
#define TOPK_MAXK 2048
#define TOPK_SMEM_N 8192 /* longest row whose tie path runs in shared memory (64 KB; two blocks an SM still fit) */
#define TOPK_RK 2048     /* fast: keys the block keeps in registers (rows up to 2048 entries read once) */

__device__ __forceinline__ uint64_t topk_key(float v, int i) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint32_t)(0xffffffffu - (uint32_t)i);
}
__device__ __forceinline__ float key_value(uint64_t key) {
    uint32_t m = (uint32_t)(key >> 32);
    return __uint_as_float((m & 0x80000000u) ? (m & 0x7fffffffu) : ~m);
}
__device__ __forceinline__ int key_index(uint64_t key) { return (int)(0xffffffffu - (uint32_t)key); }

__device__ unsigned long long topk_count[3]; /* rows, rows with order ties only, rows with boundary ties */

template <int NT>
__global__ void __launch_bounds__(NT, 1024 / NT) topk_kernel(const float *scores, int64_t ld, const int *nrow, const int *ncausal, int k,
                                                  int exact_order, int fast, int *sel, int *nsel, tk_elem *scratch) {
    dev_pdl_enter();
    extern __shared__ tk_elem tk_row[]; /* [ld] when ld <= TOPK_SMEM_N (the tie path's copy), else none */
    __shared__ int hist[256];
    __shared__ uint64_t keys[TOPK_MAXK];
    __shared__ int out[TOPK_MAXK];
    __shared__ int pick_bin, pick_above, ngot, tie, neq, nsel_eq;
    __shared__ int wsum[NT / 32];
    constexpr int KR = TOPK_RK / NT; /* keys a thread keeps in registers */
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = nrow[t], kk0 = k < n ? k : n, nc = ncausal[t];
    const float *row = scores + (int64_t)t * ld;
    if (kk0 <= 0) {
        if (tid == 0) nsel[t] = 0;
        return;
    }
    /* the entries the fast path ranks: with at least kk0 causal ones, those alone (the masked entries are -inf at the
     * highest indices, so every causal key is above theirs: the same kk0 keys, and none to drop); a prefill pass's
     * rows (the pass's whole list, its later entries masked) no longer rank and scan the masked tail */
    const int nr = fast && nc >= kk0 && nc < n ? nc : n;
    /* fast: the first TOPK_RK keys in registers (each thread its own: read from the row once, not once a pass), and the
     * histogram's and the gather's shared atomics once a warp and bin (the scores' top digits are few, so a warp's keys
     * land on the same bins) */
    uint64_t kc[KR];
    const int ncache = fast ? (nr < TOPK_RK ? nr : TOPK_RK) : 0;
#pragma unroll
    for (int j = 0; j < KR; j++) {
        const int i = tid + j * NT;
        kc[j] = i < ncache ? topk_key(row[i], i) : 0;
    }
    /* the keys of entries i0 + tid, i0 from 0 by NT up to nr, warp-uniformly: f(in range, key) */
    auto each_key = [&](auto f) {
#pragma unroll
        for (int j = 0; j < KR; j++)
            if (j * NT < ncache) f(tid + j * NT < ncache, kc[j]);
        for (int i0 = ncache; i0 < nr; i0 += NT) {
            const int i = i0 + tid;
            f(i < nr, i < nr ? topk_key(row[i], i) : 0);
        }
    };
    uint64_t prefix = 0, mask = 0;
    int kk = kk0;
    for (int dg = 7; dg >= 0; dg--) {
        const int sh = dg * 8;
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        if (fast) {
            each_key([&](bool ok, uint64_t key) {
                const bool in = ok && (key & mask) == prefix;
                const int bin = (int)((key >> sh) & 255);
                const unsigned act = __ballot_sync(0xffffffffu, in);
                if (in) {
                    const unsigned peers = __match_any_sync(act, bin);
                    if (!(peers & ((1u << lane) - 1u))) atomicAdd(&hist[bin], __popc(peers)); /* the lowest lane of the bin */
                }
            });
        } else {
            for (int i = tid; i < nr; i += blockDim.x) {
                uint64_t key = topk_key(row[i], i);
                if ((key & mask) == prefix) atomicAdd(&hist[(int)((key >> sh) & 255)], 1);
            }
        }
        __syncthreads();
        if (tid < 32) {
            /* lane l owns bins 255 - 8l .. 248 - 8l (top down): counts above each bin by a warp scan */
            int c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) sum += (c[j] = hist[255 - 8 * lane - j]);
            int incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            int above = incl - sum;
            if (above < kk && kk <= incl) {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (above + c[j] >= kk) {
                        pick_bin = 255 - 8 * lane - j;
                        pick_above = above;
                        break;
                    }
                    above += c[j];
                }
            }
        }
        __syncthreads();
        const int bin = pick_bin;
        kk -= pick_above;
        prefix |= (uint64_t)bin << sh;
        mask |= (uint64_t)255 << sh;
        const int done = hist[bin] == kk;
        __syncthreads(); /* everyone has read hist and pick_* before the next pass resets them */
        if (done) break;
    }
    /* the selected keys: (key & mask) >= prefix, exactly kk0 of them */
    if (tid == 0) ngot = 0;
    int P = 1;
    while (P < kk0) P <<= 1;
    for (int i = tid; i < P; i += blockDim.x) keys[i] = 0; /* padding sorts last: every real key is > 0 */
    __syncthreads();
    if (fast) {
        each_key([&](bool ok, uint64_t key) {
            const bool in = ok && (key & mask) >= prefix;
            const unsigned b = __ballot_sync(0xffffffffu, in);
            int at = 0;
            if (lane == 0 && b) at = atomicAdd(&ngot, __popc(b));
            at = __shfl_sync(0xffffffffu, at, 0);
            if (in) keys[at + __popc(b & ((1u << lane) - 1u))] = key;
        });
    } else {
        for (int i = tid; i < nr; i += blockDim.x) {
            uint64_t key = topk_key(row[i], i);
            if ((key & mask) >= prefix) keys[atomicAdd(&ngot, 1)] = key;
        }
    }
    __syncthreads();
    /* bitonic sort of P keys, decreasing. fast, P <= RS x the block's threads: thread tid holds keys tid + q NT (q < RS)
     * in registers, the exchanges within a warp (stride < 32) by shuffles, between a thread's own keys (stride >= NT)
     * in registers, the others through shared memory: the same network, so the same order, with 2 barriers a stage of
     * stride 32 .. NT / 2 (10 stages at P 512 and 512 threads, 9 at 256) instead of one a stage (45) */
    constexpr int RS = NT >= 512 ? 1 : 512 / NT; /* the keys a thread holds: P <= 512 fits every form where k <= 512 */
    if (fast && P <= RS * NT) {
        uint64_t r[RS];
#pragma unroll
        for (int q = 0; q < RS; q++) r[q] = tid + q * NT < P ? keys[tid + q * NT] : 0;
        for (int size = 2; size <= P; size <<= 1)
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                uint64_t o[RS];
                if (stride >= NT) { /* partner key q ^ stride / NT of the same thread */
#pragma unroll
                    for (int q = 0; q < RS; q++) o[q] = r[q ^ (stride / NT)];
                } else if (stride >= 32) {
                    __syncthreads(); /* every thread has read the previous stage's partner */
#pragma unroll
                    for (int q = 0; q < RS; q++)
                        if (tid + q * NT < P) keys[tid + q * NT] = r[q];
                    __syncthreads();
#pragma unroll
                    for (int q = 0; q < RS; q++) o[q] = tid + q * NT < P ? keys[(tid + q * NT) ^ stride] : 0;
                } else {
#pragma unroll
                    for (int q = 0; q < RS; q++) o[q] = __shfl_xor_sync(0xffffffffu, r[q], stride);
                }
                /* the pair (i, i ^ stride): i the lower index; decreasing where (i & size) == 0, the lower index keeps the
                 * larger key there and the smaller elsewhere */
#pragma unroll
                for (int q = 0; q < RS; q++) {
                    const int i = tid + q * NT;
                    const bool lower = !(i & stride), desc = !(i & size);
                    r[q] = lower == desc ? (r[q] > o[q] ? r[q] : o[q]) : (r[q] < o[q] ? r[q] : o[q]);
                }
            }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < RS; q++)
            if (tid + q * NT < P) keys[tid + q * NT] = r[q];
        __syncthreads();
    } else {
        for (int size = 2; size <= P; size <<= 1)
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int i = tid; i < P; i += blockDim.x) {
                    int j = i ^ stride;
                    if (j > i) {
                        uint64_t a = keys[i], bb = keys[j];
                        int desc = (i & size) == 0;
                        if (desc ? a < bb : a > bb) keys[i] = bb, keys[j] = a;
                    }
                }
                __syncthreads();
            }
    }
    /* exact ties that torch's algorithm resolves its own way? */
    if (tid == 0) tie = 0, neq = 0, nsel_eq = 0;
    __syncthreads();
    const float vk = key_value(keys[kk0 - 1]);
    for (int i = tid; i + 1 < kk0; i += blockDim.x) {
        float a = key_value(keys[i]);
        if (a == key_value(keys[i + 1]) && a != -INFINITY) tie = 1;
    }
    if (vk != -INFINITY && kk0 < n) { /* (past nr: -inf, never vk) */
        for (int i = tid; i < nr; i += blockDim.x)
            if (row[i] == vk) atomicAdd(&neq, 1);
        for (int i = tid; i < kk0; i += blockDim.x)
            if (key_value(keys[i]) == vk) atomicAdd(&nsel_eq, 1);
    }
    __syncthreads();
    const int boundary = neq > nsel_eq, tied = boundary || (tie && exact_order);
    if (tid == 0) {
        atomicAdd(&topk_count[0], 1ull);
        if (boundary) atomicAdd(&topk_count[2], 1ull);
        else if (tie) atomicAdd(&topk_count[1], 1ull);
    }
    if (tied) { /* torch's selection and order, by one thread, on a copy of the row */
        tk_elem *q = ld <= TOPK_SMEM_N ? tk_row : scratch + (int64_t)t * ld;
        for (int i = tid; i < n; i += blockDim.x) q[i].v = row[i], q[i].i = i;
        __syncthreads();
        if (tid == 0) {
            tk_select_torch(q, n, kk0);
            for (int i = 0; i < kk0; i++) out[i] = q[i].i;
        }
    } else {
        for (int i = tid; i < kk0; i += blockDim.x) out[i] = key_index(keys[i]);
    }
    __syncthreads();
    /* picks of masked entries (>= ncausal) are dropped, the order kept (a block-wide stable compaction: each pick's
     * place is the kept picks before it, by warp ballots and the warps' counts in order) */
    if (nc >= n || (nr < n && !tied)) {
        for (int i = tid; i < kk0; i += blockDim.x) sel[(int64_t)t * k + i] = out[i];
        if (tid == 0) nsel[t] = kk0;
    } else if (!fast) { /* (the one-thread compaction before session 29) */
        if (tid == 0) {
            int kept = 0;
            for (int i = 0; i < kk0; i++)
                if (out[i] < nc) sel[(int64_t)t * k + kept++] = out[i];
            nsel[t] = kept;
        }
    } else {
        int base = 0;
        for (int i0 = 0; i0 < kk0; i0 += blockDim.x) {
            const int i = i0 + tid, v = i < kk0 ? out[i] : 0;
            const bool keep = i < kk0 && v < nc;
            const unsigned b = __ballot_sync(0xffffffffu, keep);
            if (lane == 0) wsum[warp] = __popc(b);
            __syncthreads();
            int before = 0, total = 0;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
                const int c = wsum[w];
                before += w < warp ? c : 0, total += c;
            }
            if (keep) sel[(int64_t)t * k + base + before + __popc(b & ((1u << lane) - 1u))] = v;
            base += total;
            __syncthreads(); /* every warp has read wsum before the next round writes it */
        }
        if (tid == 0) nsel[t] = base;
    }
}

static int tk_exact_order = -1; /* DSV4_TOPK_EXACT_ORDER, read at the first launch */
static int tk_fast = -1;        /* DSV4_TOPK_FAST (default 1 since session 30: bench/NOTES.md) */
static int tk_threads = -1;     /* DSV4_TOPK_THREADS (TOPK_THREADS_XS where k allows it, since session 54; 512 in 51-53) */

extern "C" int dsv4_cuda_topk(const float *scores, int T, int64_t ld, const int *nlist, const int *ncausal, int k, int *sel,
                              int *nsel, void *scratch, void *stream) {
    if (T < 0 || k < 1 || k > TOPK_MAXK || ld < 1 || !scratch) return dsv4_cuda_fail("topk: bad arguments (T %d k %d)", T, k);
    if (!T) return 0;
    const size_t smem = ld <= TOPK_SMEM_N ? (size_t)ld * sizeof(tk_elem) : 0;
    static int smem_set; /* the kernel's dynamic shared memory raised to its most (static + dynamic > 48 KB), once */
    if (smem && !smem_set) {
        if (cudaFuncSetAttribute((const void *)topk_kernel<TOPK_THREADS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 TOPK_SMEM_N * (int)sizeof(tk_elem)) != cudaSuccess ||
            cudaFuncSetAttribute((const void *)topk_kernel<TOPK_THREADS_S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 TOPK_SMEM_N * (int)sizeof(tk_elem)) != cudaSuccess ||
            cudaFuncSetAttribute((const void *)topk_kernel<TOPK_THREADS_XS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 TOPK_SMEM_N * (int)sizeof(tk_elem)) != cudaSuccess)
            return dsv4_cuda_fail("topk: cannot raise shared memory to %zu bytes", (size_t)TOPK_SMEM_N * sizeof(tk_elem));
        smem_set = 1;
    }
    if (tk_exact_order < 0) {
        const char *e = getenv("DSV4_TOPK_EXACT_ORDER");
        tk_exact_order = e && *e && *e != '0';
    }
    if (tk_fast < 0) tk_fast = dsv4_env_int("DSV4_TOPK_FAST", 1) != 0;
    if (tk_threads < 0) tk_threads = dsv4_env_int("DSV4_TOPK_THREADS", TOPK_THREADS_XS);
    if (tk_threads == TOPK_THREADS_XS && k <= TOPK_THREADS_S)
        dev_launch(topk_kernel<TOPK_THREADS_XS>, T, TOPK_THREADS_XS, smem, DSV4_STREAM(stream), scores, ld, nlist, ncausal, k,
                   tk_exact_order, tk_fast, sel, nsel, (tk_elem *)scratch);
    else if (tk_threads == TOPK_THREADS_S && k <= TOPK_THREADS_S)
        dev_launch(topk_kernel<TOPK_THREADS_S>, T, TOPK_THREADS_S, smem, DSV4_STREAM(stream), scores, ld, nlist, ncausal, k,
                   tk_exact_order, tk_fast, sel, nsel, (tk_elem *)scratch);
    else
        dev_launch(topk_kernel<TOPK_THREADS>, T, TOPK_THREADS, smem, DSV4_STREAM(stream), scores, ld, nlist, ncausal, k,
                   tk_exact_order, tk_fast, sel, nsel, (tk_elem *)scratch);
    return dsv4_cuda_check_launch("topk");
}

extern "C" void dsv4_cuda_topk_set_exact_order(int on) { tk_exact_order = on < 0 ? -1 : on != 0; }
extern "C" void dsv4_cuda_topk_set_fast(int on) { tk_fast = on < 0 ? -1 : on != 0; }
extern "C" void dsv4_cuda_topk_set_threads(int nt) { tk_threads = nt < 0 ? -1 : nt; }

extern "C" int dsv4_cuda_topk_counts(unsigned long long c[3], int reset) {
    if (cudaMemcpyFromSymbol(c, topk_count, sizeof(unsigned long long) * 3) != cudaSuccess)
        return dsv4_cuda_fail("topk: cannot read the counters");
    if (reset) {
        const unsigned long long z[3] = {0, 0, 0};
        if (cudaMemcpyToSymbol(topk_count, z, sizeof z) != cudaSuccess) return dsv4_cuda_fail("topk: cannot reset the counters");
    }
    return 0;
}
