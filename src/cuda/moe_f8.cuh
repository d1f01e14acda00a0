/* moe_f8.cuh - the routed experts on Hopper's FP8 tensor cores (MXFP4 weights, FP8 act quant), decode and prefill alike
 * (included by moe_tc.cu, run by dsv4_moe_tc_run by default: DSV4_MOE_F8=0 or a mode bit of the f16 kernels turns it
 * off, DSV4_MOE_TC_F8 forces it). bench/NOTES.md, sessions 18-20: the probe streamed 3.0 TB/s this way against 2.5 for
 * the f16 way in the same per-warp cp.async ring.
 *
 * A block is SL warpgroups on one 64-row tile of one active expert, warpgroup s on a column slice (below); gate / up:
 * the same 64 rows of w1 and w3 (two accumulators, the SwiGLU fused), down: 64 rows of w2, or with x quantized per row
 * and 8-token chunks two 64-row tiles of w2 as the two accumulators (GATEUP 2, the default there). Warp w holds rows 16 w ..
 * 16 w + 15 of the tile as the A operand of wgmma m64nNk32 e4m3 (registers), one k32 step per 32-column MXFP4 group: the
 * group's e2m1 nibbles re-packed as e4m3 codes (values x 2^-6, exact). The x codes of the chunk's 8 to 64 tokens are B
 * (shared memory, K-major core matrices): act-quantized by each warpgroup for its slice at the chunk's start (XR 0), or
 * quantized once per row by moe_quant_kernel and copied unit by unit through a ring (XR 1); the same codes and
 * power-of-two scales as the f16 kernels' (mt_quant<1>). Per group: D = A B (fresh), then u += D x 2^(e - 121) (e: the
 * row's E8M0 group scale, times the 2^6 the codes carry); per 128-column unit: acc += u x sx (the token's act-quant scale
 * of the unit); per chunk the slices' acc added in a fixed order. Each output's operations depend on the shape only, not
 * on the tokens beside it or the chunk size: batch invariant, and prefill passes give decode's bits. The numerics are not
 * the f16 kernels': Hopper's FP8 MMA aligns a k32 step's products and keeps ~13 fraction bits (the probe: ~5e-6 of
 * sum |w x| per row).
 *
 * Weights stream through a per-warp ring of MF8_STAGES units (cp.async, one commit group a unit): lane (g, c) copies its
 * 16 bytes of row g (and g + 8) of each matrix, i.e. group c of the unit (the checkpoint's row-major bytes), into chunk
 * slot g * 4 + (c ^ (g >> 1)) of the row half's 512 bytes, and reads back word c of group G from chunk (g, G): the
 * A fragment of group G needs word c of every group from lane c (a 4 x 4 transpose of words in a quad), and the slot
 * swizzle makes those 4-byte reads conflict-free. Lane l copies the scale word of row l & 15 of matrix l >> 4 (with x
 * quantized per row and 8-token chunks: 16 bytes of them, 4 units' words, every 4 units; session 39: at batch 256 one word
 * a unit was ~30 % of the kernel's L2 sector requests, each 4-byte copy a sector of its own). */
#pragma once

#define MF8_STAGES 4 /* units in a warp's weight ring (the default; the kernel's ST: 4 to 8, the same bits) */
#define MF8_SB 4    /* (token, unit) items of x a warp loads before quantizing them (loads in flight) */
#define MF8_RQ_T 16 /* from this many tokens a pass on, x act-quantized once per row (moe_quant_kernel, WO 3) */

/* 8 e2m1 nibbles (value 8c + i at bits 4i) -> e4m3 codes (x 2^-6): lo the even values, hi the odd ones */
__device__ __forceinline__ void mf8_repack(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const uint32_t t = w << 2;
    lo = (t & 0x1C1C1C1Cu) | ((t << 2) & 0x80808080u);
    hi = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}

/* D = A B (scale-d false: D's old values unused), wgmma m64nNk32 e4m3 with A from registers and B by descriptor, N = 8 NT
 * (8-64 tokens); D's n-tile j in d[j][0..3] as in wgmma.cuh */
template <int NT> __device__ __forceinline__ void mf8_mma(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
    static_assert(NT == 1 || NT == 2 || NT == 4 || NT == 8, "n-tiles of an e4m3 wgmma here: 1, 2, 4, 8");
#define MF8_A "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
#define MF8_D4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
    if constexpr (NT == 1)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, 0, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1; }"
                     : MF8_D4(0)
                     : MF8_A
                     : "memory");
    else if constexpr (NT == 2)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, 0, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1; }"
                     : MF8_D4(0), MF8_D4(1)
                     : MF8_A
                     : "memory");
    else if constexpr (NT == 4)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, 0, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15},"
                     " {%16,%17,%18,%19}, %20, p, 1, 1; }"
                     : MF8_D4(0), MF8_D4(1), MF8_D4(2), MF8_D4(3)
                     : MF8_A
                     : "memory");
    else
        asm volatile("{ .reg .pred p; setp.ne.b32 p, 0, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1; }"
                     : MF8_D4(0), MF8_D4(1), MF8_D4(2), MF8_D4(3), MF8_D4(4), MF8_D4(5), MF8_D4(6), MF8_D4(7)
                     : MF8_A
                     : "memory");
#undef MF8_A
#undef MF8_D4
}

/* the 128 threads of warpgroup w (named barrier 1 + w); one warpgroup a block: barrier 1 as an immediate, so that the
 * kernel is known to use two barriers, not all sixteen (Nsight Compute: "Block Limit Barriers 4" with the register form) */
template <int SL> __device__ __forceinline__ void mf8_wg_sync(int w) {
    if constexpr (SL == 1) asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else asm volatile("bar.sync %0, 128;\n" ::"r"(1 + w) : "memory");
}

/* shared memory of one block of SL warpgroups. XR 0: x codes of a chunk [NU * 4 groups][NT][2][8][16] and scales
 * [8 NT][NU] (staged at the chunk's start), or with X1 (passes of one token) the token's codes alone [NU * 4 groups][32]
 * (+ 112 bytes that its B operands' padding rows read) and scales [NU]; XR 1: per warpgroup a ring of MF8_STAGES units
 * of x, [4 groups][NT][2][8][16] codes and [8 NT] scales. Then the slices' partial sums [SL - 1][NM][NT][4][128], then
 * per warp the weight ring. */
__host__ __device__ constexpr size_t mf8_stage_bytes(int nm) { return (size_t)nm * 1024 + (size_t)nm * 64; }
__host__ __device__ constexpr int mf8_xstage(int NT) { return NT * 1024 + NT * 32; }
/* XR 0: bytes of the x codes (the scales follow them), then of codes and scales */
__host__ __device__ constexpr size_t mf8_xcodes(int NT, int NU, int X1) { return X1 ? (size_t)NU * 128 + 128 : (size_t)NU * 4 * NT * 256; }
__host__ __device__ constexpr size_t mf8_xbytes(int NT, int NU, int X1) {
    return mf8_xcodes(NT, NU, X1) + (X1 ? (((size_t)NU * 4 + 15) & ~(size_t)15) : (size_t)8 * NT * NU * 4);
}
/* XR 1 with 8-token chunks: the scale words in groups of 4 units (16 bytes a row, one copy every 4 units), slots a warp
 * for a ring of ST units (a group's slot is written when its first unit is issued, ST - 1 units ahead, so 4 x slots >
 * ST + 2); XR 0 (x staged up front, decode of 1-15 tokens: two blocks an SM must fit) keeps a word a unit in the stage */
__host__ __device__ constexpr int mf8_nslot(int ST) { return (ST + 2) / 4 + 1; }
static inline size_t mf8_smem(int NT, int NU, int nm, int SL, int XR, int X1, int ST = MF8_STAGES) {
    const size_t x = XR ? (size_t)SL * ST * mf8_xstage(NT) : mf8_xbytes(NT, NU, X1);
    return x + (size_t)(SL - 1) * nm * NT * 4 * 128 * 4 + (size_t)4 * SL * ST * mf8_stage_bytes(nm) +
           (XR && NT == 1 ? (size_t)4 * SL * mf8_nslot(ST) * nm * 256 : 0);
}
/* column slices from the shape only (the sums' order must not depend on the batch): enough warps per expert to fill the
 * GPU at batch 1, as the f16 ring's S */
static inline int mf8_slices(int R, int NU) {
    int sl = 1;
    while (sl < 4 && NU % (2 * sl) == 0 && (R / 64) * 4 * sl < 256) sl *= 2;
    return sl;
}

/* A block: SL warpgroups on one 64-row tile of one active expert (grid: R / 64 x expert slots; GATEUP 2: a 128-row pair
 * of tiles, R / 128), warpgroup s on the units [s NU / SL, (s + 1) NU / SL) (a column slice); at a chunk's end the
 * slices' sums are added in the order of s by warpgroup 0, which writes the outputs. Chunks of 8 NT tokens. XR 0: the
 * chunk's x quantized by the warpgroup
 * at the chunk's start (decode, fewer than MF8_RQ_T tokens: no quant launch; P.x1, a pass of one token: the token's
 * row alone, each B operand's K halves 16 bytes apart, so that its padding columns read the row's next bytes); XR 1: x
 * from P.xq (moe_quant_kernel), unit by unit through a ring beside the weights' (the warpgroup's 128 threads copy it, a
 * named barrier a unit). GP: groups whose wgmmas are in flight together (1, 2, 4), promoted in order as they finish.
 * Every variant gives every output the same operations in the same order: the same bits whatever NT, XR and GP. */
template <int GATEUP, int NT, int SL, int XR, int GP, int ST>
__global__ void __launch_bounds__(SL * 128, NT == 1 ? 4 / SL : 1) mf8_kernel(const __grid_constant__ mt_params P) {
    /* GATEUP 2: the down projection on two 64-row tiles a warpgroup (rows 128 b .. 128 b + 63 and the next 64 as the two
     * matrices: one x stage and one unit's waits, descriptors and copies' addressing for twice the weights; each row's
     * operations are the 64-row form's, so the same bits; the default where it applies, DSV4_MOE_F8_D2=0 turns it off) */
    constexpr bool GU = GATEUP == 1, D2 = GATEUP == 2;
    constexpr int NM = GATEUP ? 2 : 1, STG = (int)mf8_stage_bytes(GATEUP ? 2 : 1), XST = mf8_xstage(NT), S = ST;
    static_assert(!D2 || XR, "two row tiles: x quantized per row");
    static_assert(XR || NT == 1, "up-front staging: 8-token chunks");
    extern __shared__ __align__(16) unsigned char mt_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3, wg = warp >> 2, tw = threadIdx.x & 127;
    const int NU = P.NU, R = P.R, C = P.C, NUS = NU / SL, ub = wg * NUS;
    const bool X1 = !XR && P.x1; /* (every expert has at most one token: chunks of one) */
    /* the plan and x. P.pre (the down projection after this kernel's gate / up, x staged here): the plan was complete
     * before this grid could start (gate / up let it launch only at its end, past its own grid wait, which waited for the
     * plan's writer), and the weights are constants, so the first weight copies go before the wait; only h, gate / up's
     * output, needs it */
    const bool PRE = !GATEUP && !XR && P.pre;
    if (!PRE) dev_pdl_wait();
    const int ia = blockIdx.y;
    if (ia >= *P.p.nact) return;
    const int ex = P.p.act_e[ia], off = P.p.act_off[ia], cnt = P.p.act_cnt[ia];
    /* XR, 8-token chunks: the chunks of an expert split over CS blocks side by side in x (P.csplit; block cp of a row
     * tile takes chunks cp, cp + CS, ...: they read the tile's weights at about the same time, once from DRAM); each
     * chunk's outputs are computed alone (acc starts at 0), so the bits do not depend on the split */
    const int CS = XR && NT == 1 ? P.csplit : 1, cp = XR && NT == 1 ? (int)blockIdx.x % CS : 0;
    const int rt = XR && NT == 1 ? (int)blockIdx.x / CS : (int)blockIdx.x;
    const int ncha = (cnt + 8 * NT - 1) / (8 * NT);
    if (cp >= ncha) return;
    const dsv4_cuda_weight w0 = P.WA[ex], w1 = GU ? P.WB[ex] : w0;
    const int64_t rowq = C / 32; /* 16-byte chunks a row */
    const size_t xbytes = XR ? (size_t)SL * S * XST : mf8_xbytes(NT, NU, X1);
    unsigned char *xs = mt_sm + (XR ? (size_t)wg * S * XST : 0);                        /* XR: this warpgroup's x ring */
    float *sxs = (float *)(mt_sm + mf8_xcodes(NT, NU, X1)); /* XR 0 */
    float *red = (float *)(mt_sm + xbytes);                      /* [SL - 1][NM][NT][4][128] */
    unsigned char *ring = (unsigned char *)(red + (SL - 1) * NM * NT * 4 * 128) + (size_t)warp * S * STG;
    /* scale groups (SG: x quantized per row, 8-token chunks): slots, bytes of one ([m][row][16 bytes]), this warp's offset */
    constexpr bool SG = XR && NT == 1;
    constexpr int NSL = SG ? mf8_nslot(S) : 1, SCG = NM * 256;
    const int scs_off = SL * S * XST + (SL - 1) * NM * NT * 4 * 128 * 4 + 4 * SL * S * STG + warp * NSL * SCG;
    const unsigned xsa = (unsigned)__cvta_generic_to_shared(xs), ring_sa = (unsigned)__cvta_generic_to_shared(ring);
    const int r0 = rt * (D2 ? 128 : 64) + (warp & 3) * 16; /* the warp's first row (D2: of matrix 0; matrix 1's + 64) */
    constexpr int mrow = D2 ? 64 : 0;                        /* matrix 1's rows past matrix 0's (D2) */

    /* this lane's copies: 16 bytes of row r0 + g + 8h of matrix m (group c of the unit), the scale word of row l & 15 of
     * matrix l >> 4 */
    const unsigned char *wp[NM][2];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wp[m][h] = (const unsigned char *)((const uint4 *)(m ? w1.data : w0.data) + ((m ? w1.row0 + mrow : w0.row0) + r0 + g + 8 * h) * rowq + c);
    const int sm_ = lane >> 4, sr = lane & 15;
    const bool scl = sm_ < NM;
    const uint8_t *sp = scl ? (sm_ ? w1.scale + (w1.row0 + mrow + r0 + sr) * w1.scale_stride : w0.scale + (w0.row0 + r0 + sr) * w0.scale_stride)
                            : w0.scale;
    const unsigned slot = (unsigned)(g * 4 + (c ^ (g >> 1))) * 16;
    /* the scale words 4 units at a time (16 bytes of a row: a quarter of the sectors of one word a unit) where every
     * row's first word of the slice is 16-byte aligned and the slice is whole groups; else a word a unit in the stage */
    const bool s4 = SG && P.sg && NUS % 4 == 0 && __all_sync(0xffffffffu, !scl || (((uintptr_t)(sp + (size_t)ub * 4)) & 15) == 0);
    /* XR: this thread's x copies of a unit: token tw >> 3 (+ 16 j) of the chunk, piece tw & 7 (group p >> 1, row half
     * p & 1), and (threads tw < 8 NT) the unit scale of token tw; rows of the chunk being issued */
    constexpr int XJ = NT >= 2 ? NT / 2 : 1;
    const uint8_t *xrow[XJ];
    const uint8_t *srow = NULL;
    int xchunk = -1;
    int iu = 0, ich = 0; /* the unit (within the slice) and chunk of the next issue: calls come for i = 0, 1, 2, ... */
    auto issue = [&](int i, int n) {
        if (i < n) {
            const int u = ub + iu;
            const unsigned sa = ring_sa + (unsigned)((i % S) * STG);
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) mt_cp16s(sa + m * 1024 + h * 512 + slot, wp[m][h] + (int64_t)u * 64);
            if (scl) {
                if (!s4) mt_cps<4>(sa + NM * 1024 + (sm_ * 16 + sr) * 4, sp + u * 4);
                else if ((i & 3) == 0)
                    mt_cp16s((unsigned)__cvta_generic_to_shared(mt_sm) + (unsigned)(scs_off + ((i >> 2) % NSL) * SCG + lane * 16), sp + u * 4);
            }
            if (XR) {
                const int ch = cp + CS * ich;
                if (ch != xchunk) { /* the rows of chunk ch's tokens this thread copies (past the expert's count: none) */
                    xchunk = ch;
                    const int c0 = ch * 8 * NT;
#pragma unroll
                    for (int j = 0; j < XJ; j++) {
                        const int t = (tw >> 3) + 16 * j;
                        xrow[j] = t < 8 * NT && c0 + t < cnt ? P.xq + (int64_t)(GU ? P.p.rows[off + c0 + t] : off + c0 + t) * P.xq_ld : NULL;
                    }
                    const int t = tw;
                    srow = t < 8 * NT && c0 + t < cnt ? P.xq + (int64_t)(GU ? P.p.rows[off + c0 + t] : off + c0 + t) * P.xq_ld + C : NULL;
                }
                const unsigned xa = xsa + (unsigned)((i % S) * XST);
                const int pc = tw & 7, q = pc >> 1, h = pc & 1;
#pragma unroll
                for (int j = 0; j < XJ; j++) {
                    const int t = (tw >> 3) + 16 * j;
                    if (xrow[j]) mt_cp16s(xa + (unsigned)(((q * NT + (t >> 3)) * 2 + h) * 128 + (t & 7) * 16), xrow[j] + u * 128 + pc * 16);
                }
                if (srow) mt_cps<4>(xa + NT * 1024 + tw * 4, srow + u * 4);
            }
            if (++iu == NUS) iu = 0, ich++;
        }
        dev_cp_commit();
    };

    /* XR 0: x of the chunk's tokens c0 .. c0 + nt - 1 (rows of x by token, or of h by slot) in this warpgroup's units,
     * act-quantized: item (token, unit) a warp, MF8_SB items' loads in flight. Tokens past nt are not staged: column n
     * of D depends on B's column n only, and their outputs are not written. */
    auto stage = [&](int c0, int nt) {
        mt_stage_items<MF8_SB, GU>(P, off, c0, ub, NUS, nt * NUS, warp & 3, 4, lane, [&](int t, int uu, const float(&v)[4]) {
            const int u = ub + uu;
            uint16_t term[4][1];
            uint8_t code[4];
            const float sc = mt_quant<1>(v, term, code);
            const int pp = mf8_pos(lane); /* core matrix pp >> 4, byte pp & 15 of the token's row */
#pragma unroll
            for (int q = 0; q < 4; q++) {
                if (X1) xs[(u * 4 + q) * 32 + pp] = code[q]; /* the one token's row: its 16-byte pieces in a row */
                else xs[((u * 4 + q) * NT + (t >> 3)) * 256 + (pp >> 4) * 128 + (t & 7) * 16 + (pp & 15)] = code[q];
            }
            if (lane == 0) sxs[t * NU + u] = sc;
        });
    };

    const int nch = (ncha - cp + CS - 1) / CS, n = nch * NUS; /* this block's chunks */
#pragma unroll
    for (int i = 0; i < S - 1; i++) issue(i, n);
    if (PRE) dev_pdl_wait();
    float acc[NM][NT][4], ua[NM][NT][4];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int q = 0; q < NT; q++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[m][q][k] = ua[m][q][k] = 0.0f;
    int c0 = 0, nt = 0;
    for (int i = 0, uu = 0, ch = 0; i < n; i++, uu = uu + 1 == NUS ? (ch++, 0) : uu + 1) { /* uu, ch: i's unit and chunk */
        const int u = ub + uu;
        if (uu == 0) { /* a new chunk */
            c0 = (cp + CS * ch) * 8 * NT;
            nt = cnt - c0 < 8 * NT ? cnt - c0 : 8 * NT;
            if (!XR) {
                mf8_wg_sync<SL>(wg); /* the previous chunk's wgmmas are done (each waited) */
                stage(c0, nt);
                wg_fence_proxy();
                mf8_wg_sync<SL>(wg);
            }
        }
        dev_cp_wait<S - 2>(); /* unit i's copies (this thread's) */
        if (XR) { /* ... and the warpgroup's: its x */
            wg_fence_proxy();
            mf8_wg_sync<SL>(wg);
        }
        /* into the stage read at i - 1 (XR: every thread of the warpgroup is past it, the barrier above) */
        issue(i + S - 1, n);
        const unsigned char *st = ring + (i % S) * STG;
        const uint32_t *scw = s4 ? (const uint32_t *)(mt_sm + scs_off + ((i >> 2) % NSL) * SCG) + (i & 3) : (const uint32_t *)(st + NM * 1024);
        const int sst = s4 ? 4 : 1; /* words between rows */
        uint32_t sw[NM][2]; /* the rows' (g, g + 8) four group scales, read once a unit (the wgmmas' memory clobbers) */
#pragma unroll
        for (int m = 0; m < NM; m++) sw[m][0] = scw[(m * 16 + g) * sst], sw[m][1] = scw[(m * 16 + 8 + g) * sst];
        const unsigned xb = XR ? xsa + (unsigned)((i % S) * XST) : xsa + (unsigned)(u * (X1 ? 128 : 4 * NT * 256));
        /* the rows' group scales 2^(e - 127) times the 2^6 of the re-packed codes: biased exponent e + 6 (E8M0 codes
         * above 248, scales past 2^121, would overflow: not in any checkpoint's range); D of group G into ua */
        auto promote = [&](int G, float (&d)[NM][NT][4]) {
#pragma unroll
            for (int m = 0; m < NM; m++) {
                const float f0 = __uint_as_float((__byte_perm(sw[m][0], 0u, 0x4440u + G) + 6u) << 23);
                const float f1 = __uint_as_float((__byte_perm(sw[m][1], 0u, 0x4440u + G) + 6u) << 23);
#pragma unroll
                for (int q = 0; q < NT; q++) {
#pragma unroll
                    for (int k = 0; k < 4; k++) wg_keep(d[m][q][k]);
                    ua[m][q][0] = fmaf(d[m][q][0], f0, ua[m][q][0]), ua[m][q][1] = fmaf(d[m][q][1], f0, ua[m][q][1]);
                    ua[m][q][2] = fmaf(d[m][q][2], f1, ua[m][q][2]), ua[m][q][3] = fmaf(d[m][q][3], f1, ua[m][q][3]);
                }
            }
        };
        /* group G's A fragments (word c of each lane of the quad, through the slot swizzle) and a zeroed D */
        auto load_a = [&](int G, uint32_t (&a)[NM][4]) {
            const unsigned gs = (unsigned)(g * 4 + (G ^ (g >> 1))) * 16 + c * 4;
#pragma unroll
            for (int m = 0; m < NM; m++) {
                mf8_repack(*(const uint32_t *)(st + m * 1024 + gs), a[m][0], a[m][2]);
                mf8_repack(*(const uint32_t *)(st + m * 1024 + 512 + gs), a[m][1], a[m][3]);
            }
        };
        auto zero = [&](float (&d)[NM][NT][4]) { /* (D's old values are not read: scale-d false; ptxas drops these) */
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int q = 0; q < NT; q++) d[m][q][0] = d[m][q][1] = d[m][q][2] = d[m][q][3] = 0.0f;
        };
#pragma unroll
        for (int G0 = 0; G0 < 4; G0 += GP) { /* GP groups' wgmmas in flight (a commit group each), promoted in order */
            uint32_t a[GP][NM][4];
            float d[GP][NM][NT][4];
#pragma unroll
            for (int j = 0; j < GP; j++) load_a(G0 + j, a[j]), zero(d[j]);
            wg_fence(); /* the A and D registers written above, before the wgmmas read them */
#pragma unroll
            for (int j = 0; j < GP; j++) {
#pragma unroll
                for (int m = 0; m < NM; m++)
                    mf8_mma<NT>(d[j][m], a[j][m],
                                X1 ? wg_desc(xb + (unsigned)((G0 + j) * 32), 16, 256) : wg_desc(xb + (unsigned)((G0 + j) * NT * 256), 128, 256));
                wg_commit();
            }
            if constexpr (GP == 4) {
                wg_wait<3>(), promote(G0, d[0]);
                wg_wait<2>(), promote(G0 + 1, d[1]);
                wg_wait<1>(), promote(G0 + 2, d[2]);
                wg_wait<0>(), promote(G0 + 3, d[3]);
            } else if constexpr (GP == 2) {
                wg_wait<1>(), promote(G0, d[0]);
                wg_wait<0>(), promote(G0 + 1, d[GP - 1]);
            } else wg_wait<0>(), promote(G0, d[0]);
#pragma unroll
            for (int j = 0; j < GP; j++)
#pragma unroll
                for (int m = 0; m < NM; m++)
#pragma unroll
                    for (int k = 0; k < 4; k++) wg_keep(a[j][m][k]);
        }
        /* the unit's sums times the tokens' act-quant scales */
        const float *sxu = XR ? (const float *)(xs + (i % S) * XST + NT * 1024) : NULL;
#pragma unroll
        for (int q = 0; q < NT; q++) {
            const int t0 = 8 * q + 2 * c;
            const float s0 = XR ? sxu[t0] : sxs[(X1 ? 0 : t0) * NU + u], s1 = XR ? sxu[t0 + 1] : sxs[(X1 ? 0 : t0 + 1) * NU + u];
#pragma unroll
            for (int m = 0; m < NM; m++) {
                acc[m][q][0] = fmaf(ua[m][q][0], s0, acc[m][q][0]), acc[m][q][1] = fmaf(ua[m][q][1], s1, acc[m][q][1]);
                acc[m][q][2] = fmaf(ua[m][q][2], s0, acc[m][q][2]), acc[m][q][3] = fmaf(ua[m][q][3], s1, acc[m][q][3]);
                ua[m][q][0] = ua[m][q][1] = ua[m][q][2] = ua[m][q][3] = 0.0f;
            }
        }
        if (uu != NUS - 1) continue;
        if (SL > 1) { /* the slices' sums into warpgroup 0's, in the order of s */
            if (wg) {
#pragma unroll
                for (int m = 0; m < NM; m++)
#pragma unroll
                    for (int q = 0; q < NT; q++)
#pragma unroll
                        for (int k = 0; k < 4; k++) red[((((wg - 1) * NM + m) * NT + q) * 4 + k) * 128 + tw] = acc[m][q][k];
            }
            __syncthreads();
            if (!wg) {
#pragma unroll
                for (int s = 1; s < SL; s++)
#pragma unroll
                    for (int m = 0; m < NM; m++)
#pragma unroll
                        for (int q = 0; q < NT; q++)
#pragma unroll
                            for (int k = 0; k < 4; k++) acc[m][q][k] += red[((((s - 1) * NM + m) * NT + q) * 4 + k) * 128 + tw];
            }
            __syncthreads();
        }
        /* the chunk's outputs: element k of n-tile q is token 8 q + 2 c + (k & 1), row r0 + g + 8 (k >> 1) */
#pragma unroll
        for (int q = 0; q < NT; q++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int tk = 8 * q + 2 * c + (k & 1), r = r0 + g + 8 * (k >> 1);
                if (!wg && tk < nt && r < R) {
                    const int64_t sl = off + c0 + tk;
                    P.out[sl * R + r] = GU ? mt_swiglu(acc[0][q][k], acc[NM - 1][q][k], P.lim, P.p.rw[sl]) : acc[0][q][k];
                    if (D2) P.out[sl * R + r + 64] = acc[NM - 1][q][k];
                }
#pragma unroll
                for (int m = 0; m < NM; m++) acc[m][q][k] = 0.0f;
            }
    }
    mt_cp_wait_all();
    dev_pdl_trigger();
}
