/* linear_bi.cu - the batch-invariant multi-token GEMM: y = x . W^T for many rows of x (a large decode batch, or the
 * linears of a prefill pass that no cuBLASLt path takes), every y row bitwise what the tensor-core GEMV (linear.cu)
 * gives that row alone.
 *
 * The GEMV stages all of a block's x columns in shared memory, so for wide x only 8-16 tokens fit a launch and a
 * batch of 256 reads the weight 16-32 times (the BF16 head: 1 GB, 32 times, 9.3 ms a step). Here x goes through
 * shared memory one 128-column unit at a time instead:
 *   1. bi_stage: x -> 16-bit terms and a power-of-two scale per (token, unit), once per call, into the workspace,
 *      by the GEMV's own staging code (tc_stage: same terms, same slot order);
 *   2. gemm_bi: a block owns 128 weight rows (8 warps x one 16-row mma tile) and 64 tokens; the units stream through
 *      a cp.async pipeline of NS stages (weight rows and staged x of a unit each), so a weight is read once per 64
 *      tokens (the 4 token blocks of a row block run side by side: DRAM once, L2 for the rest).
 * Bitwise equality with the GEMV: each (row, token) gets the very same mma sequence (per unit: fresh accumulators,
 * the unit's k-steps in the GEMV's order with the same decoded fragments and x terms), the same fmaf by (weight
 * scale x x scale) per unit, the same column slices (S from the GEMV's plan, a function of the shape only) summed
 * in the same order. The mma columns (tokens) are independent of each other, so the token grouping does not matter.
 * Few blocks (small weights, few tokens: less than half a wave): the S column slices go to P blocks (S / P each)
 * instead of one, which write each slice's sums into the workspace, and bi_reduce adds the S slices in order (the
 * GEMV's: sum = p0, sum += p1, ...).
 * Not taken (the caller falls back to the GEMV): F32 weights, more than BI_MAXU units, a workspace too small, or
 * below 128 rows with fewer blocks than a quarter of the SMs even when split. */
#include <string.h>

#include "linear_gemv.cuh"

#define BI_WARPS 8
#define BI_THREADS (BI_WARPS * 32)
#define BI_ROWS (BI_WARPS * 16) /* weight rows per block */
#define BI_TT 64                /* tokens per block */
#define BI_NTT (BI_TT / 8)      /* 8-token mma column tiles */
#define BI_MAXT 256             /* tokens staged per pass (the workspace's size) */
#define BI_MAXU 256             /* 128-column units (32768 columns) */
#define BI_SMEM (220 * 1024)

/* Shared memory of a pipeline stage: x terms [XT][BI_TT][ROWP] (16-bit; ROWP the GEMV's padded row, so the same
 * conflict-free fragment reads), the unit's weight rows [BI_ROWS][WROW] (WROW = 64 mod 128 bytes: a quarter warp's two
 * rows land on distinct banks) and the unit's x scales [BI_TT]. */
template <int FMT, int XT> struct bi_cfg {
    static constexpr int V = tc_fmt<FMT>::V;
    static constexpr int UB = 64 * V; /* bytes of a row's unit */
    static constexpr int WROW = UB % 128 ? UB : UB + 64;
    static constexpr int ROWP = 128 + tc_fmt<FMT>::PADB / 2;
    static constexpr int XB = XT * BI_TT * ROWP * 2;
    static constexpr int WB = BI_ROWS * WROW;
    static constexpr int SB = XB + WB + BI_TT * 4;
    static constexpr int NS = BI_SMEM / SB < 4 ? BI_SMEM / SB : 4;
    static_assert(NS >= 2, "two stages must fit");
    static_assert(XB % 16 == 0 && WB % 16 == 0, "16-byte aligned stage parts");
};

/* One linear of a call: the GEMV's job (weight, x, y, strides), its staged x in the workspace, its first row block. */
struct bi_job {
    tc_job t;
    uint16_t *xg; /* token t's term xt: xg + (t * XT + xt) * NU * 128, units in tc_slot order */
    float *sg;    /* scale of (token t, unit u): sg[u * Tp + t] */
    float *part;  /* P > 1: the sums of slice s for (token t, row r) at part[(s * Tp + t) * rows + r] */
    int rb0;      /* the job's row blocks are rb0 .. rb0 + ceil(rows / BI_ROWS) - 1 */
};
struct bi_params {
    int xbf16, T, Tp, S, NU, ntc, nj; /* tokens of this pass, scale row stride, slices, units, token blocks, jobs */
    int P;                            /* blocks over a (row block, token block)'s S slices: 1 (into y), or S / P each */
};
template <int NJ> struct bi_args {
    bi_params p;
    bi_job j[NJ];
};
#define BI_NJ TC_MAXJ

/* 1. x of token blockIdx.x, job blockIdx.y -> terms and scales (tc_stage with one token: 16 warps over the units). */
template <int FMT, int XT>
__global__ void __launch_bounds__(TC_THREADS) bi_stage(const __grid_constant__ bi_args<BI_NJ> a) {
    __shared__ float sxs[BI_MAXU];
    const bi_job &B = a.j[blockIdx.y];
    const int t = blockIdx.x, NU = a.p.NU;
    tc_params p = {};
    p.xbf16 = a.p.xbf16, p.t0 = t, p.nt = 1, p.NU = NU, p.nub = NU, p.tok = NU * 128;
    tc_stage<FMT, XT>(p, a.j[0].t, B.t, B.xg + (size_t)t * XT * NU * 128, sxs, 0, NU);
    __syncthreads();
    for (int u = threadIdx.x; u < NU; u += blockDim.x) B.sg[(size_t)u * a.p.Tp + t] = sxs[u];
}

/* a unit's sums of an 8-token tile (rows g, g + 8 x tokens 2c, 2c + 1) into acc, times the rows' weight factor and the
 * tokens' x scales: the GEMV's fmaf */
__device__ __forceinline__ void bi_scale_add(float (&acc)[4], const float (&u)[4], const float (&sw)[2], float xa, float xb) {
    acc[0] = fmaf(u[0], sw[0] * xa, acc[0]);
    acc[1] = fmaf(u[1], sw[0] * xb, acc[1]);
    acc[2] = fmaf(u[2], sw[1] * xa, acc[2]);
    acc[3] = fmaf(u[3], sw[1] * xb, acc[3]);
}

/* 2. The GEMM. Block: row block rbg = blockIdx.x / ntc (of the job it falls in), tokens (blockIdx.x % ntc) * 64 ... */
template <int FMT, int XT>
__global__ void __launch_bounds__(BI_THREADS, 1) gemm_bi(const __grid_constant__ bi_args<BI_NJ> a) {
    using F = tc_fmt<FMT>;
    using C = bi_cfg<FMT, XT>;
    constexpr int V = F::V, E = F::E, BF = F::BF, NSUB = E / 8, NS = C::NS, ROWP = C::ROWP, WROW = C::WROW, UB = C::UB;
    constexpr bool FP4 = FMT == DSV4_WF_MXFP4 || FMT == DSV4_WF_NVFP4;
    static_assert(F::WT == 1 && E >= 8, "one weight term, 16-bit chunks of 8+ elements");
    extern __shared__ __align__(16) unsigned char bi_sm[];
    const bi_params &p = a.p;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    /* block = (row block rbg, slice block ps, token block): the token blocks of a weight slice side by side (L2) */
    const int bq = blockIdx.x / p.ntc, rbg = bq / p.P, ps = bq - rbg * p.P, tt0 = (blockIdx.x - bq * p.ntc) * BI_TT;
    int ji = 0;
    for (int i = 1; i < p.nj; i++) ji = rbg >= a.j[i].rb0 ? i : ji;
    const bi_job &B = a.j[ji];
    const tc_job &J = B.t, &J0 = a.j[0].t;
    const int rb = rbg - B.rb0, R = J.w.rows, T = p.T, NU = p.NU, S = p.S;
    const int64_t rowb = (int64_t)(J0.w.cols / E) * 16; /* bytes per stored row */
    const int rw0 = rb * BI_ROWS + warp * 16 + g;        /* the lane's rows rw0, rw0 + 8 */

    /* The thread's copies of a unit, set up once (only u moves their sources: u 128 x values, u UB weight bytes).
     * x: chunk k of the thread is 16 bytes (pc = tid & 15) of token row xr + 16 (k & 3) of term k >> 2, xr = tid >> 4;
     * weights: chunk k is row wr + k BI_THREADS / PPR of the block's, bytes (tid % PPR) 16, wr = tid / PPR. */
    constexpr int PPR = UB / 16, XN = XT * BI_TT * 16 / BI_THREADS, WN = BI_ROWS * PPR / BI_THREADS;
    static_assert(BI_TT * 16 == 4 * BI_THREADS && (BI_ROWS * PPR) % BI_THREADS == 0 && XN == 4 * XT, "whole copies a thread");
    const int xpc = threadIdx.x & 15, xr = threadIdx.x >> 4, wpc = threadIdx.x % PPR, wr = threadIdx.x / PPR;
    int xo[4]; /* x: token row xr + 16 m's offset in xg, clamped to a real token past the end (never stored) */
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const int t = tt0 + xr + 16 * m;
        xo[m] = (t < T ? t : T - 1) * XT * NU * 128 + xpc * 8;
    }
    const int xd0 = xr * ROWP + xpc * 8; /* x chunk 0's place in a stage (16-bit elements) */
    int wd[WN]; /* weights: row k's byte offset from row 0's (rows clamped to the last real one) */
    const unsigned char *wsrc;
    {
        int r0 = rb * BI_ROWS + wr;
        r0 = r0 < R ? r0 : R - 1;
        wsrc = J.w.data + ((int64_t)J.w.row0 + r0) * rowb + wpc * 16;
#pragma unroll
        for (int k = 0; k < WN; k++) {
            int r = rb * BI_ROWS + wr + k * (BI_THREADS / PPR);
            r = r < R ? r : R - 1;
            wd[k] = (int)((r - r0) * rowb);
        }
    }
    auto issue = [&](int u) { /* unit u's weight rows, x terms and x scales -> stage u % NS */
        unsigned char *st = bi_sm + (size_t)(u % NS) * C::SB;
        uint16_t *xs = (uint16_t *)st + xd0;
        unsigned char *ws = st + C::XB + wr * WROW + wpc * 16;
        float *ss = (float *)(st + C::XB + C::WB);
        const uint16_t *xsrc = B.xg + (size_t)u * 128;
#pragma unroll
        for (int k = 0; k < XN; k++) { /* term xt = k >> 2, token row xr + 16 (k & 3) */
            const int xt = k >> 2, m = k & 3;
            dev_cp16(xs + (xt * BI_TT + 16 * m) * ROWP, xsrc + xo[m] + (size_t)xt * NU * 128);
        }
        const unsigned char *wu = wsrc + (int64_t)u * UB;
#pragma unroll
        for (int k = 0; k < WN; k++) dev_cp16(ws + k * (BI_THREADS / PPR) * WROW, wu + wd[k]);
        if (threadIdx.x < BI_TT / 4) dev_cp16(ss + threadIdx.x * 4, B.sg + (size_t)u * p.Tp + tt0 + threadIdx.x * 4);
    };
    /* the lane's weight scale words of unit u, as tc_load packs them: rows rw0 and rw0 + 8 (clamped), their scale rows
     * found once (sp), u only steps along them */
    const uint8_t *sp[2];
#pragma unroll
    for (int m = 0; m < 2; m++) {
        int r = rw0 + 8 * m;
        r = r < R ? r : R - 1;
        const int64_t Rs = (int64_t)J.w.row0 + r;
        if (FMT == DSV4_WF_FP8) sp[m] = J.w.scale + (Rs / 128) * J.w.scale_stride * (J0.w.scale_f32 ? 4 : 1);
        else if (FMT == DSV4_WF_MXFP4) sp[m] = J.w.scale + Rs * J.w.scale_stride + c;
        else if (FMT == DSV4_WF_NVFP4) sp[m] = J.w.scale + Rs * J.w.scale_stride + 2 * c;
        else sp[m] = nullptr;
    }
    auto ldscale = [&](int u, uint32_t (&s)[2][2]) {
#pragma unroll
        for (int m = 0; m < 2; m++) {
            s[m][0] = s[m][1] = 0;
            if (FMT == DSV4_WF_FP8)
                s[m][0] = J0.w.scale_f32 ? __ldg((const uint32_t *)sp[m] + u) : (uint32_t)__ldg(sp[m] + u);
            else if (FMT == DSV4_WF_MXFP4) s[m][0] = __ldg(sp[m] + u * 4);
            else if (FMT == DSV4_WF_NVFP4) s[m][0] = __ldg((const uint16_t *)(sp[m] + u * 8));
        }
    };

    float acc[BI_NTT][4], tot[BI_NTT][4];
#pragma unroll
    for (int n = 0; n < BI_NTT; n++)
#pragma unroll
        for (int k = 0; k < 4; k++) acc[n][k] = tot[n][k] = 0.0f;
    /* the block's slices s0 .. s0 + S / P - 1 and their units */
    const int s0 = ps * (S / p.P), u0 = s0 * NU / S, u1 = (s0 + S / p.P) * NU / S;
    /* v of the block's (row, token) pairs into rows of ld floats at base (token t's row at base + t * ld) */
    auto store = [&](float *base, int64_t ld, const float (&v)[BI_NTT][4]) {
#pragma unroll
        for (int n = 0; n < BI_NTT; n++) {
            const int t = tt0 + 2 * c + 8 * n;
            float *y0 = base + (int64_t)t * ld, *y1 = y0 + ld;
            if (rw0 < R) {
                if (t < T) y0[rw0] = v[n][0];
                if (t + 1 < T) y1[rw0] = v[n][1];
            }
            if (rw0 + 8 < R) {
                if (t < T) y0[rw0 + 8] = v[n][2];
                if (t + 1 < T) y1[rw0 + 8] = v[n][3];
            }
        }
    };
    uint32_t an[2][2];
    ldscale(u0, an);
    for (int i = 0; i < NS - 1; i++) {
        if (u0 + i < u1) issue(u0 + i);
        dev_cp_commit();
    }
    int s = s0, send = (s0 + 1) * NU / S; /* the current slice and its end */
    for (int u = u0; u < u1; u++) {
        dev_cp_wait<NS - 2>(); /* unit u has landed (this thread's copies) */
        __syncthreads();       /* everyone's, and stage (u - 1) % NS is free */
        if (u + NS - 1 < u1) issue(u + NS - 1);
        dev_cp_commit();
        uint32_t ac[2][2] = {{an[0][0], an[0][1]}, {an[1][0], an[1][1]}};
        if (u + 1 < u1) ldscale(u + 1, an);
        const unsigned char *st = bi_sm + (size_t)(u % NS) * C::SB;
        const uint16_t *xs = (const uint16_t *)st;
        const unsigned char *ws = st + C::XB;
        const float *ss = (const float *)(st + C::XB + C::WB);
        /* the unit's A fragments, decoded once (rows g, g + 8 of the warp's tile), and the unit's weight factor */
        uint32_t A[V][NSUB][2][1][4];
        float sw[2] = {1.0f, 1.0f};
#pragma unroll
        for (int v = 0; v < V; v++) {
            const uint4 q0 = *(const uint4 *)(ws + (size_t)(warp * 16 + g) * WROW + (v * 4 + c) * 16);
            const uint4 q1 = *(const uint4 *)(ws + (size_t)(warp * 16 + g + 8) * WROW + (v * 4 + c) * 16);
            uint32_t fq[2][2];
            float swv[2];
            tc_scales<FMT>(ac, v, J0.w.scale_f32, J.w.scale2, fq, swv);
            if (v == V - 1) sw[0] = swv[0], sw[1] = swv[1];
#pragma unroll
            for (int j = 0; j < NSUB; j++) {
                tc_decode<FMT>(q0, j, fq[0][j >> 1], A[v][j][0]);
                tc_decode<FMT>(q1, j, fq[1][j >> 1], A[v][j][1]);
            }
        }
#pragma unroll
        for (int n = 0; n < BI_NTT; n++) {
            float cu[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const int tok = g + 8 * n;
#pragma unroll
            for (int v = 0; v < V; v++)
#pragma unroll
                for (int j = 0; j < NSUB; j++) {
                    const int js = FP4 ? (j ^ ((c >> 1) & 1)) : j;
                    uint32_t Bf[XT][4];
#pragma unroll
                    for (int xt = 0; xt < XT; xt++) {
                        const uint4 t4 = *(const uint4 *)(xs + (size_t)(xt * BI_TT + tok) * ROWP + (v * 4 + c) * E + js * 8);
                        Bf[xt][0] = t4.x, Bf[xt][1] = t4.y, Bf[xt][2] = t4.z, Bf[xt][3] = t4.w;
                    }
#pragma unroll
                    for (int k = 0; k < 2; k++)
#pragma unroll
                        for (int xt = 0; xt < XT; xt++)
                            tc_mma<BF>(cu, A[v][j][0][0][2 * k], A[v][j][1][0][2 * k], A[v][j][0][0][2 * k + 1],
                                       A[v][j][1][0][2 * k + 1], Bf[xt][2 * k], Bf[xt][2 * k + 1]);
                }
            bi_scale_add(acc[n], cu, sw, ss[2 * c + 8 * n], ss[2 * c + 8 * n + 1]);
        }
        if (u + 1 == send) { /* end of a slice: add it to the earlier slices' sum in slice order (P == 1), or store
                              * it for bi_reduce (P > 1: the sums as the GEMV's part[]) */
            if (p.P > 1) store(B.part + (size_t)s * p.Tp * R, R, acc);
#pragma unroll
            for (int n = 0; n < BI_NTT; n++)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (p.P == 1) tot[n][k] = s == 0 ? acc[n][k] : tot[n][k] + acc[n][k];
                    acc[n][k] = 0.0f;
                }
            s++;
            send = (s + 1) * NU / S;
        }
    }
    dev_cp_wait<0>();
    if (p.P == 1) store(J.y, J.ldy, tot);
}

/* 3. (P > 1) y = the S slices' sums added in slice order: y[t, r] = p0, += p1, .. (job blockIdx.y) */
__global__ void __launch_bounds__(256) bi_reduce(const __grid_constant__ bi_args<BI_NJ> a) {
    const bi_job &B = a.j[blockIdx.y];
    const int R = B.t.w.rows, T = a.p.T, S = a.p.S;
    const size_t n = (size_t)T * R, sl = (size_t)a.p.Tp * R;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(i / R), r = (int)(i - (size_t)t * R);
        const float *q = B.part + (size_t)t * R + r;
        float v = q[0];
        for (int s = 1; s < S; s++) v += q[s * sl];
        B.t.y[(int64_t)t * B.t.ldy + r] = v;
    }
}

/* ---- launcher ---- */

typedef void (*bi_fn)(const bi_args<BI_NJ>);
struct bi_kernels {
    bi_fn stage, gemm;
    int smem;
};
template <int FMT, int XT> static bi_kernels bi_pick_xt() {
    return bi_kernels{bi_stage<FMT, XT>, gemm_bi<FMT, XT>, bi_cfg<FMT, XT>::NS * bi_cfg<FMT, XT>::SB};
}
template <int FMT> static bi_kernels bi_pick_fmt(int xt) {
    if (xt == 1) return bi_pick_xt<FMT, 1>();
    if constexpr (tc_fmt<FMT>::BF) return bi_pick_xt<FMT, 3>();
    else return bi_pick_xt<FMT, 2>();
}
static int bi_pick(int fmt, int xt, bi_kernels *k) {
    switch (fmt) {
    case DSV4_WF_BF16: *k = bi_pick_fmt<DSV4_WF_BF16>(xt); return 0;
    case DSV4_WF_F16: *k = bi_pick_fmt<DSV4_WF_F16>(xt); return 0;
    case DSV4_WF_FP8: *k = bi_pick_fmt<DSV4_WF_FP8>(xt); return 0;
    case DSV4_WF_MXFP4: *k = bi_pick_fmt<DSV4_WF_MXFP4>(xt); return 0;
    case DSV4_WF_NVFP4: *k = bi_pick_fmt<DSV4_WF_NVFP4>(xt); return 0;
    default: return 1; /* F32: three weight terms (the GEMV) */
    }
}

static size_t bi_align(size_t b) { return (b + 255) & ~(size_t)255; }
static int bi_tp(int T) { return (T + BI_TT - 1) / BI_TT * BI_TT; }
/* Workspace of one job: staged terms (at most 3) and scales of up to BI_MAXT tokens, and (P > 1) its slices' sums. */
static size_t bi_job_bytes(int T, int NU, int xt, int P, int S, int R) {
    T = T < BI_MAXT ? T : BI_MAXT;
    return bi_align((size_t)T * xt * NU * 128 * 2) + bi_align((size_t)NU * bi_tp(T) * 4) +
           (P > 1 ? bi_align((size_t)S * bi_tp(T) * R * 4) : 0);
}
/* room for the split's slice sums in dsv4_cuda_linear_ws_bytes: 16 slices of 4096 rows per row of x */
#define BI_PART_ROWS (16 * 4096)

extern "C" size_t dsv4_cuda_linear_ws_bytes(int T, int64_t cols, int njobs) {
    if (T <= 0 || cols <= 0 || njobs <= 0) return 0;
    T = T < BI_MAXT ? T : BI_MAXT;
    const int64_t NU = (cols + 127) / 128;
    return bi_align((size_t)T * 3 * NU * 128 * 2) + bi_align((size_t)NU * bi_tp(T) * 4) + (size_t)njobs * 768 +
           (size_t)bi_tp(T) * BI_PART_ROWS * 4;
}

int dsv4_linear_bi_run(const tc_job *jobs, int nj, int xt, int S, int x_bf16, int T, void *ws, size_t wsb, cudaStream_t st) {
    const int fmt = jobs[0].w.fmt, NU = jobs[0].w.cols / 128;
    bi_kernels k;
    if (!ws || nj < 1 || nj > BI_NJ || NU < 1 || NU > BI_MAXU || bi_pick(fmt, xt, &k)) return 1;
    const int Tc = T < BI_MAXT ? T : BI_MAXT, ntc = (Tc + BI_TT - 1) / BI_TT;
    int nrb = 0;
    for (int i = 0; i < nj; i++) nrb += (jobs[i].w.rows + BI_ROWS - 1) / BI_ROWS;
    /* fewer blocks than half a wave: the slices over P blocks, enough for two waves (if the workspace holds the
     * slices' sums); measured slower for blocks near a wave (the sums' traffic and the reduction) */
    int P = 1;
    if (2 * nrb * ntc < dsv4_cuda_dev.sm_count)
        while (P < S && nrb * ntc * P < 2 * dsv4_cuda_dev.sm_count) P *= 2;
    size_t need = 0;
    for (int pass = 0; pass < 2; pass++) {
        need = 0;
        for (int i = 0; i < nj; i++) need += bi_job_bytes(Tc, NU, xt, P, S, jobs[i].w.rows);
        if (need <= wsb || P == 1) break;
        P = 1;
    }
    if (need > wsb) return 1;
    /* still fewer blocks than a quarter of the SMs below 128 rows: the GEMV's launches are faster (measured, NOTES) */
    if (T < 128 && nrb * ntc * P < 32) return 1;
    static const void *attr_done[16];
    int seen = 0;
    for (int i = 0; i < 16 && attr_done[i]; i++) seen |= attr_done[i] == (const void *)k.gemm;
    if (!seen) {
        if (cudaFuncSetAttribute((const void *)k.gemm, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem) != cudaSuccess)
            return dsv4_cuda_fail("linear (multi-token gemm): cannot raise shared memory to %d bytes", k.smem);
        for (int i = 0; i < 16; i++)
            if (!attr_done[i]) {
                attr_done[i] = (const void *)k.gemm;
                break;
            }
    }
    bi_args<BI_NJ> a;
    memset(&a, 0, sizeof a);
    a.p.xbf16 = x_bf16, a.p.S = S, a.p.NU = NU, a.p.nj = nj, a.p.Tp = bi_tp(Tc), a.p.P = P;
    unsigned char *base = (unsigned char *)ws;
    nrb = 0;
    int rmax = 0;
    for (int i = 0; i < nj; i++) {
        a.j[i].xg = (uint16_t *)base;
        base += bi_align((size_t)Tc * xt * NU * 128 * 2);
        a.j[i].sg = (float *)base;
        base += bi_align((size_t)NU * bi_tp(Tc) * 4);
        a.j[i].part = (float *)base;
        if (P > 1) base += bi_align((size_t)S * bi_tp(Tc) * jobs[i].w.rows * 4);
        rmax = jobs[i].w.rows > rmax ? jobs[i].w.rows : rmax;
        a.j[i].rb0 = nrb;
        nrb += (jobs[i].w.rows + BI_ROWS - 1) / BI_ROWS;
    }
    const size_t es = x_bf16 ? 2 : 4;
    for (int t0 = 0; t0 < T; t0 += Tc) {
        const int nt = T - t0 < Tc ? T - t0 : Tc;
        a.p.T = nt, a.p.ntc = (nt + BI_TT - 1) / BI_TT;
        for (int i = 0; i < nj; i++) {
            a.j[i].t = jobs[i];
            a.j[i].t.x = (const unsigned char *)jobs[i].x + es * (size_t)t0 * jobs[i].ldx;
            a.j[i].t.y = jobs[i].y + (size_t)t0 * jobs[i].ldy;
        }
        k.stage<<<dim3(nt, nj), TC_THREADS, 0, st>>>(a);
        k.gemm<<<nrb * P * a.p.ntc, BI_THREADS, k.smem, st>>>(a);
        if (P > 1) {
            const int64_t n = (int64_t)nt * rmax;
            const int gx = (int)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
            bi_reduce<<<dim3(gx, nj), 256, 0, st>>>(a);
        }
    }
    return dsv4_cuda_check_launch("linear (multi-token gemm)");
}
