/* attn_kv8.cu - cache rows in the stored format (kv_cache.h): pack / unpack, and the sparse attention
 * with a sink that reads them (dsv4_cuda_attn_kv8).
 *
 * Attention, the arithmetic (fixed by the query's own list: never by T, the launch shape or the head grouping):
 *  - the list is cut in sub-splits of AK_S = 32 entries (entry 32 s + i is lane i's);
 *  - per (head, sub-split): score s_i = (q . k_i) * scale, each dot a lane's FMA chain over its dims
 *    (128 c + 4 lane .. + 3, c ascending) then the xor-butterfly tree over the lanes (16, 8, 4, 2, 1; taken 8
 *    entries at a time, a transposed reduction that adds the same pairs); m = max, p_i = exp(s_i - m),
 *    l = butterfly sum of the p_i, acc = sum_i p_i k_i as an FMA chain in entry order;
 *  - sub-splits folded in order (ak_coef / ak_fold) into span states (spans of SP = ceil(ns / 32) consecutive
 *    sub-splits: one sub-split each up to 1024 entries), span states folded in order into the total;
 *    out = O / (L + exp(sink - M)).
 * The launch shape only decides who does what: a block takes one query, NW warps of HB heads each and either every
 * span (full mode: it folds the spans itself) or one span (partial mode: span states go to scratch and
 * attn_kv8_combine folds them). A sub-split's rows come in by cp.async while the previous one computes and are
 * dequantized once per block into shared memory (fp32), read by all its heads. Small batches take partial mode and
 * few heads per block (many blocks), large batches full mode with 32 heads per block (4 per warp: each
 * shared-memory read of a row feeds 4 heads). Note: an entry's weight is exact math's to ~1e-6; the CPU twin's
 * scores (a sequential float sum over the dims) are further from it than these (a tree), see test_attn_kv8. */
#include "common.cuh"
#include "attn_fold.cuh"
#include "kv_cache.cuh"

#define AK_S 32       /* entries per sub-split: one per lane */
#define AK_MAXSPAN 32 /* spans per query at most (partials per (query, head)) */
#define AK_PMAX_T 32  /* partial mode only for T <= this (bounds the scratch) */
#define AK_MAXD 512   /* head_dim limit: 4 float4 per lane */

/* ---- pack / unpack ---- */

__global__ void kv_pack_kernel(const float *src, int64_t sld, int n, int Dh, int R, uint8_t *dst, int64_t rb,
                               const int *rows) {
    dev_pdl_enter();
    int r = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= n) return;
    int to = rows ? rows[r] : r;
    if (to < 0) return;
    dev_kv_pack_row_warp(src + (int64_t)r * sld, Dh, R, dst + (int64_t)to * rb);
}

__global__ void ikey_pack_kernel(const float *src, int64_t sld, int n, int Di, uint8_t *dst, int64_t rb, const int *rows) {
    dev_pdl_enter();
    int r = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= n) return;
    int to = rows ? rows[r] : r;
    if (to < 0) return;
    dev_ikey_pack_row_warp(src + (int64_t)r * sld, Di, dst + (int64_t)to * rb);
}

extern "C" int dsv4_cuda_ikey_pack(const float *src, int64_t sld, int n, int Di, uint8_t *dst, const int *rows, void *stream) {
    if (n < 0 || Di <= 0 || Di % 32 || sld < Di) return dsv4_cuda_fail("ikey_pack: bad shape (n %d Di %d)", n, Di);
    if (!n) return 0;
    dev_launch(ikey_pack_kernel, (n + 7) / 8, 256, 0, DSV4_STREAM(stream), src, sld, n, Di, dst, dsv4_ikey_row_bytes(Di), rows);
    return dsv4_cuda_check_launch("ikey_pack");
}

__global__ void kv_unpack_kernel(const uint8_t *src, int n, int Dh, int R, int64_t rb, float *dst, int64_t dld) {
    dev_pdl_enter();
    int r = blockIdx.x;
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) dst[(int64_t)r * dld + d] = dev_kv_at(src + (int64_t)r * rb, Dh, R, d);
}

extern "C" int dsv4_cuda_kv_pack(const float *src, int64_t sld, int n, int Dh, int R, uint8_t *dst, const int *rows,
                                 void *stream) {
    if (n < 0 || R < 0 || Dh <= R || (Dh - R) % 64 || R % 2 || sld < Dh)
        return dsv4_cuda_fail("kv_pack: bad shape (n %d Dh %d R %d)", n, Dh, R);
    if (!n) return 0;
    dev_launch(kv_pack_kernel, (n + 7) / 8, 256, 0, DSV4_STREAM(stream), src, sld, n, Dh, R, dst, dsv4_kv_row_bytes(Dh, R), rows);
    return dsv4_cuda_check_launch("kv_pack");
}

extern "C" int dsv4_cuda_kv_unpack(const uint8_t *src, int n, int Dh, int R, float *dst, int64_t dld, void *stream) {
    if (n < 0 || Dh <= R || (Dh - R) % 64 || dld < Dh) return dsv4_cuda_fail("kv_unpack: bad shape (n %d Dh %d R %d)", n, Dh, R);
    if (!n) return 0;
    dev_launch(kv_unpack_kernel, n, 128, 0, DSV4_STREAM(stream), src, n, Dh, R, dsv4_kv_row_bytes(Dh, R), dst, dld);
    return dsv4_cuda_check_launch("kv_unpack");
}

/* ---- attention ---- */

struct ak_geom {
    int ns, sp, nspan; /* sub-splits, sub-splits per span, spans */
};
static ak_geom ak_geometry(int nidx) {
    ak_geom g;
    g.ns = (nidx + AK_S - 1) / AK_S;
    g.sp = g.ns > AK_MAXSPAN ? (g.ns + AK_MAXSPAN - 1) / AK_MAXSPAN : 1;
    g.nspan = (g.ns + g.sp - 1) / g.sp;
    return g;
}
__device__ __forceinline__ float4 ak_fma4(float p, float4 k, float4 a) {
    return make_float4(fmaf(p, k.x, a.x), fmaf(p, k.y, a.y), fmaf(p, k.z, a.z), fmaf(p, k.w, a.w));
}

/* Butterfly sums of 8 values (one per entry) over the warp, transposed: each level keeps half of the values and
 * adds the partner's copy of them (the pairs of warp_sum's tree: lanes l, l^16, then ^8, ^4, ^2, ^1). Returns
 * the sum of entry lane >> 2 (in all 4 lanes of the quad). */
__device__ __forceinline__ float ak_tree8(const float (&v)[8], int lane) {
    const unsigned F = 0xffffffffu;
    const bool u16 = lane & 16, u8 = lane & 8, u4 = lane & 4;
    float a[4], b[2];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float keep = u16 ? v[j + 4] : v[j], send = u16 ? v[j] : v[j + 4];
        a[j] = keep + __shfl_xor_sync(F, send, 16);
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const float keep = u8 ? a[j + 2] : a[j], send = u8 ? a[j] : a[j + 2];
        b[j] = keep + __shfl_xor_sync(F, send, 8);
    }
    const float keep = u4 ? b[1] : b[0], send = u4 ? b[0] : b[1];
    float c = keep + __shfl_xor_sync(F, send, 4);
    c += __shfl_xor_sync(F, c, 2);
    c += __shfl_xor_sync(F, c, 1);
    return c;
}


/* Block (query blockIdx.x, heads blockIdx.y * NW * HB .., span blockIdx.z or every span when gridDim.z == 1).
 * Per sub-split: the raw cache rows arrive by cp.async (issued while the previous sub-split computes), are
 * dequantized into Ks (fp32, shared by the block's heads), then each warp scores, softmaxes and sums its heads. */
template <int DPL4, int HB, int NW>
__global__ void __launch_bounds__(NW * 32, NW >= 8 ? 1 : 2) attn_kv8_kernel(const float *q, int H, int Dh, int R,
                                                           const uint8_t *const *base, const float *kv2, const int *idx,
                                                           int nidx, const float *sink, float scale, float *out,
                                                           float *part, int ns, int SP, int nspan, int vec, ak_rope orope) {
    dev_pdl_enter();
    constexpr int DPAD = 128 * DPL4, NT = NW * 32;
    const unsigned F = 0xffffffffu;
    extern __shared__ __align__(16) float smem[];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);
    int *ids = (int *)smem;                                      /* [2][AK_S] entry ids, double-buffered */
    uint8_t *raw = (uint8_t *)(smem + 2 * AK_S);                 /* [AK_S][rb] cache rows as stored */
    float *Ks = (float *)(raw + AK_S * rb);                      /* [AK_S][DPAD] rows of the sub-split */
    float *Ot = Ks + AK_S * DPAD;                                /* [NW * HB][DPAD] the total's O (full, nspan > 1) */
    const bool full = gridDim.z == 1, tot = full && nspan > 1;
    const int hw = blockIdx.y * (NW * HB) + warp * HB; /* the warp's first head */
    const uint8_t *cache = base ? base[t] : NULL;
    const int nope = Dh - R, ro = dsv4_kv_rope_off(Dh, R), nq4 = (Dh + 3) >> 2, nchk = (int)(rb >> 4);
    const int *lidx = idx + (int64_t)t * nidx;

    /* dims past Dh (to DPAD) stay zero in every row: q is zero there too */
    for (int i = threadIdx.x; i < AK_S * (DPAD / 4 - nq4); i += NT) {
        const int r = i / (DPAD / 4 - nq4), c = nq4 + i % (DPAD / 4 - nq4);
        *(float4 *)(Ks + r * DPAD + 4 * c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float M[HB], L[HB], Ms[HB], Ls[HB];
    float4 Os[HB][DPL4];
#pragma unroll
    for (int h = 0; h < HB; h++) {
        M[h] = -INFINITY, L[h] = 0.0f;
        if (tot)
#pragma unroll
            for (int c = 0; c < DPL4; c++)
                *(float4 *)(Ot + (warp * HB + h) * DPAD + 128 * c + 4 * lane) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    const int sp0 = full ? 0 : blockIdx.z, sp1 = full ? nspan : blockIdx.z + 1;
    const int s_begin = sp0 * SP, s_end = min(ns, sp1 * SP);
    auto fetch = [&](int s) {
        const int e = s * AK_S + (int)threadIdx.x;
        int id = e < nidx ? lidx[e] : -1;
        if (id >= 0 && !cache) id = -1;
        if (id < -1 && !kv2) id = -1;
        return id;
    };
    /* the cache rows of sub-split s (ids sid) into raw */
    auto issue = [&](int s, const int *sid) {
        const int nc = min(AK_S, nidx - s * AK_S);
        for (int it = threadIdx.x; it < nc * nchk; it += NT) {
            const int i = it / nchk, k = it - i * nchk, id = sid[i];
            if (id >= 0) dev_cp16(raw + i * rb + 16 * k, cache + (int64_t)id * rb + 16 * k);
        }
        dev_cp_commit();
    };
    if (threadIdx.x < AK_S) ids[threadIdx.x] = fetch(s_begin);
    int nid = threadIdx.x < AK_S && s_begin + 1 < s_end ? fetch(s_begin + 1) : -1;
    __syncthreads();
    issue(s_begin, ids);

    for (int sp = sp0; sp < sp1; sp++) {
#pragma unroll
        for (int h = 0; h < HB; h++) {
            Ms[h] = -INFINITY, Ls[h] = 0.0f;
#pragma unroll
            for (int c = 0; c < DPL4; c++) Os[h][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        const int se = min(ns, (sp + 1) * SP);
        for (int s = sp * SP; s < se; s++) {
            const int nc = min(AK_S, nidx - s * AK_S), b = (s - s_begin) & 1;
            const int *cid = ids + b * AK_S;
            int *nxt = ids + (b ^ 1) * AK_S;
            /* this warp's queries (from L1 / L2 after the first sub-split) */
            float4 qv[HB][DPL4];
#pragma unroll
            for (int h = 0; h < HB; h++)
#pragma unroll
                for (int c = 0; c < DPL4; c++) {
                    const int hh = hw + h, d = 128 * c + 4 * lane;
                    qv[h][c] = hh < H && d < Dh ? ak_ld4(q + ((int64_t)t * H + hh) * Dh + d, Dh - d, vec)
                                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            dev_cp_wait<0>();
            if (threadIdx.x < AK_S) {
                nxt[threadIdx.x] = nid;
                nid = s + 2 < s_end ? fetch(s + 2) : -1;
            }
            __syncthreads(); /* raw rows and the next ids are in; the previous sub-split's Ks reads are done */
            /* rows into Ks: a warp per row, a lane per 4 dims */
            for (int i = warp; i < nc; i += NW) {
                const int id = cid[i];
                if (id == -1) continue;
                float *kd = Ks + i * DPAD;
                if (id >= 0) {
                    const uint8_t *row = raw + i * rb;
#pragma unroll 4
                    for (int c = lane; c < nq4; c += 32) {
                        const int d = 4 * c;
                        float4 v;
                        if (d + 4 <= nope) {
                            const uint32_t w = *(const uint32_t *)(row + d);
                            const float sc = dev_e8m0(row[nope + d / 64]);
                            const float2 lo = dev_e4m3x2((uint16_t)w), hi = dev_e4m3x2((uint16_t)(w >> 16));
                            v = make_float4(lo.x * sc, lo.y * sc, hi.x * sc, hi.y * sc);
                        } else if (d >= nope && d + 4 <= Dh) {
                            const uint2 u = *(const uint2 *)(row + ro + 2 * (d - nope));
                            v = make_float4(dev_bf16((uint16_t)u.x), dev_bf16((uint16_t)(u.x >> 16)), dev_bf16((uint16_t)u.y),
                                            dev_bf16((uint16_t)(u.y >> 16)));
                        } else {
                            v.x = d < Dh ? dev_kv_at(row, Dh, R, d) : 0.0f;
                            v.y = d + 1 < Dh ? dev_kv_at(row, Dh, R, d + 1) : 0.0f;
                            v.z = d + 2 < Dh ? dev_kv_at(row, Dh, R, d + 2) : 0.0f;
                            v.w = d + 3 < Dh ? dev_kv_at(row, Dh, R, d + 3) : 0.0f;
                        }
                        *(float4 *)(kd + d) = v;
                    }
                } else {
                    const float *row = kv2 + (int64_t)(-id - 2) * Dh;
                    for (int c = lane; c < nq4; c += 32) *(float4 *)(kd + 4 * c) = ak_ld4(row + 4 * c, Dh - 4 * c, vec);
                }
            }
            const unsigned vmask = __ballot_sync(F, lane < nc && cid[lane] != -1);
            __syncthreads(); /* Ks is ready, raw is free */
            if (s + 1 < s_end) issue(s + 1, nxt);
            if (!vmask) continue; /* no entry: nothing to fold */

            /* scores: 8 entries at a time, lane i ends up with entry i's */
            float my[HB];
#pragma unroll
            for (int h = 0; h < HB; h++) my[h] = -INFINITY;
#pragma unroll
            for (int g = 0; g < AK_S / 8; g++) {
                if (g * 8 >= nc) break;
                float dv[HB][8];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float4 *kr = (const float4 *)(Ks + (g * 8 + e) * DPAD) + lane;
                    float4 k[DPL4];
#pragma unroll
                    for (int c = 0; c < DPL4; c++) k[c] = kr[32 * c];
#pragma unroll
                    for (int h = 0; h < HB; h++) {
                        float d = 0.0f;
#pragma unroll
                        for (int c = 0; c < DPL4; c++) {
                            d = fmaf(qv[h][c].x, k[c].x, d);
                            d = fmaf(qv[h][c].y, k[c].y, d);
                            d = fmaf(qv[h][c].z, k[c].z, d);
                            d = fmaf(qv[h][c].w, k[c].w, d);
                        }
                        dv[h][e] = d;
                    }
                }
#pragma unroll
                for (int h = 0; h < HB; h++) {
                    const float r = __shfl_sync(F, ak_tree8(dv[h], lane), (lane & 7) * 4);
                    if ((lane >> 3) == g) my[h] = r;
                }
            }
            /* softmax of the sub-split */
            const bool valid = (vmask >> lane) & 1;
            float m[HB], p[HB], l[HB];
#pragma unroll
            for (int h = 0; h < HB; h++) {
                const float sc = valid ? __fmul_rn(my[h], scale) : -INFINITY;
                m[h] = warp_max(sc);
                p[h] = sc == -INFINITY ? 0.0f : expf(sc - m[h]);
                l[h] = warp_sum(p[h]);
            }
            /* weighted sum in entry order (8 rows at a time in flight; entries without a row add nothing) */
            float4 acc[HB][DPL4];
#pragma unroll
            for (int h = 0; h < HB; h++)
#pragma unroll
                for (int c = 0; c < DPL4; c++) acc[h][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int g = 0; g < AK_S / 8; g++) {
                const unsigned gm = (vmask >> (8 * g)) & 0xffu;
                if (!gm) continue;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int i = 8 * g + e;
                    const float4 *kr = (const float4 *)(Ks + i * DPAD) + lane;
                    float4 k[DPL4];
#pragma unroll
                    for (int c = 0; c < DPL4; c++) k[c] = kr[32 * c];
                    const bool use = (gm >> e) & 1u;
#pragma unroll
                    for (int h = 0; h < HB; h++) {
                        const float pi = __shfl_sync(F, p[h], i);
                        if (use)
#pragma unroll
                            for (int c = 0; c < DPL4; c++) acc[h][c] = ak_fma4(pi, k[c], acc[h][c]);
                    }
                }
            }
            /* into the span state */
#pragma unroll
            for (int h = 0; h < HB; h++) {
                float Mn, a, b;
                ak_coef(Ms[h], m[h], Mn, a, b);
                Ls[h] = ak_fold1(Ls[h], a, l[h], b);
#pragma unroll
                for (int c = 0; c < DPL4; c++) Os[h][c] = ak_fold4(Os[h][c], a, acc[h][c], b);
                Ms[h] = Mn;
            }
        }
        if (!full) { /* the span state, for attn_kv8_combine */
#pragma unroll
            for (int h = 0; h < HB; h++) {
                const int hh = hw + h;
                if (hh >= H) break;
                float *pp = part + (((int64_t)t * H + hh) * nspan + sp) * ak_pst(Dh);
                if (lane == 0) pp[0] = Ms[h], pp[1] = Ls[h];
#pragma unroll
                for (int c = 0; c < DPL4; c++) {
                    const int d = 128 * c + 4 * lane;
                    if (d < Dh) *(float4 *)(pp + 4 + d) = Os[h][c];
                }
            }
        } else { /* into the total */
#pragma unroll
            for (int h = 0; h < HB; h++) {
                if (Ms[h] == -INFINITY) continue;
                float Mn, a, b;
                ak_coef(M[h], Ms[h], Mn, a, b);
                L[h] = ak_fold1(L[h], a, Ls[h], b);
#pragma unroll
                for (int c = 0; c < DPL4; c++) {
                    if (tot) {
                        float4 *o = (float4 *)(Ot + (warp * HB + h) * DPAD + 128 * c + 4 * lane);
                        *o = ak_fold4(*o, a, Os[h][c], b);
                    } else {
                        Os[h][c] = ak_fold4(make_float4(0.0f, 0.0f, 0.0f, 0.0f), a, Os[h][c], b);
                    }
                }
                M[h] = Mn;
            }
        }
    }
    if (full) {
#pragma unroll
        for (int h = 0; h < HB; h++) {
            const int hh = hw + h;
            if (hh >= H) break;
            const float den = ak_den(M[h], L[h], sink[hh]);
#pragma unroll
            for (int c = 0; c < DPL4; c++) {
                const int d = 128 * c + 4 * lane;
                if (d >= Dh) break;
                const float4 o = tot ? *(const float4 *)(Ot + (warp * HB + h) * DPAD + d) : Os[h][c];
                ak_st4(out + ((int64_t)t * H + hh) * Dh + d, Dh - d, ak_rope4(ak_fin4(o, den, 1.0f), d, Dh, R, orope, t), vec);
            }
        }
    }
}

/* one block per (head, query): folds the query's span states in order (the full mode's operations); the states come in
 * AK_CB at a time, all loads in flight, then fold in order */
#define AK_CB 16
__global__ void attn_kv8_combine(const float *part, int H, int Dh, int R, int nspan, const float *sink, float oscale,
                                 float *out, int vec, ak_rope ro) {
    dev_pdl_enter();
    const int h = blockIdx.x, t = blockIdx.y, nq4 = (Dh + 3) >> 2;
    const int64_t pst = ak_pst(Dh);
    const float *pp = part + ((int64_t)t * H + h) * nspan * pst;
    const float sk = sink[h];
    for (int c = threadIdx.x; c < nq4; c += blockDim.x) {
        float M = -INFINITY, L = 0.0f;
        float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s0 = 0; s0 < nspan; s0 += AK_CB) {
            float m[AK_CB], l[AK_CB];
            float4 xs[AK_CB];
#pragma unroll
            for (int u = 0; u < AK_CB; u++) {
                const float *ps = pp + (s0 + u) * pst;
                const bool in = s0 + u < nspan;
                m[u] = in ? ps[0] : -INFINITY;
                l[u] = in ? ps[1] : 0.0f;
                xs[u] = in ? *(const float4 *)(ps + 4 + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < AK_CB; u++) {
                if (m[u] == -INFINITY) continue;
                float Mn, a, b;
                ak_coef(M, m[u], Mn, a, b);
                L = ak_fold1(L, a, l[u], b);
                O = ak_fold4(O, a, xs[u], b);
                M = Mn;
            }
        }
        ak_st4(out + ((int64_t)t * H + h) * Dh + 4 * c, Dh - 4 * c, ak_rope4(ak_fin4(O, ak_den(M, L, sk), oscale), 4 * c, Dh, R, ro, t),
               vec);
    }
}

int ak_combine_launch(const float *part, int T, int H, int Dh, int R, int nspan, const float *sink, float oscale,
                      float *out, int vec, ak_rope ro, cudaStream_t st) {
    dev_launch(attn_kv8_combine, dim3(H, T), 128, 0, st, part, H, Dh, R, nspan, sink, oscale, out, vec, ro);
    return dsv4_cuda_check_launch("attn_kv8_combine");
}

/* launch shapes: (heads per warp, warps per block), most heads per block first */
struct ak_cfg {
    int hb, nw;
};
static const ak_cfg ak_cfgs[] = {{4, 8}, {4, 4}, {2, 4}, {1, 4}, {1, 2}};
#define AK_NCFG 5
static int ak_force_cfg = -1, ak_force_mode = -1;

extern "C" void dsv4_cuda_attn_kv8_force(int cfg, int mode) {
    ak_force_cfg = cfg >= 0 && cfg < AK_NCFG ? cfg : -1;
    ak_force_mode = mode == 0 || mode == 1 ? mode : -1;
}

static size_t ak_smem(int Dh, int R, int dpl4, int hb, int nw, int tot) {
    return sizeof(int) * 2 * AK_S + (size_t)AK_S * dsv4_kv_row_bytes(Dh, R) +
           sizeof(float) * ((size_t)AK_S * 128 * dpl4 + (tot ? (size_t)nw * hb * 128 * dpl4 : 0));
}

extern "C" size_t dsv4_cuda_attn_kv8_scratch(int T, int H, int Dh, int nidx) {
    const ak_geom g = ak_geometry(nidx);
    if (g.nspan <= 1 || T <= 0) return 0;
    return (size_t)(T < AK_PMAX_T ? T : AK_PMAX_T) * H * g.nspan * (size_t)ak_pst(Dh);
}

template <int DPL4, int HB, int NW>
static int ak_launch(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                     const int *idx, int nidx, const float *sink, float scale, float *out, float *scratch, ak_geom g,
                     int full, int vec, ak_rope ro, cudaStream_t st) {
    const size_t smem = ak_smem(Dh, R, DPL4, HB, NW, full && g.nspan > 1);
    if (smem > (size_t)dsv4_cuda_dev.smem_optin) return dsv4_cuda_fail("attn_kv8: %zu bytes of shared memory", smem);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)attn_kv8_kernel<DPL4, HB, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("attn_kv8: cannot raise shared memory to %zu bytes", smem);
    dim3 grid(T, (H + NW * HB - 1) / (NW * HB), full ? 1 : g.nspan);
    dev_launch(attn_kv8_kernel<DPL4, HB, NW>, grid, NW * 32, smem, st, q, H, Dh, R, base, kv2, idx, nidx, sink, scale, out,
               scratch, g.ns, g.sp, g.nspan, vec, ro);
    if (dsv4_cuda_check_launch("attn_kv8")) return -1;
    if (!full) {
        return ak_combine_launch(scratch, T, H, Dh, R, g.nspan, sink, 1.0f, out, vec, ro, st);
    }
    return 0;
}

template <int DPL4>
static int ak_launch_cfg(int ci, const float *q, int T, int H, int Dh, int R, const uint8_t *const *base,
                         const float *kv2, const int *idx, int nidx, const float *sink, float scale, float *out,
                         float *scratch, ak_geom g, int full, int vec, ak_rope ro, cudaStream_t st) {
    switch (ci) {
    case 0: return ak_launch<DPL4, 4, 8>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    case 1: return ak_launch<DPL4, 4, 4>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    case 2: return ak_launch<DPL4, 2, 4>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    case 3: return ak_launch<DPL4, 1, 4>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    default: return ak_launch<DPL4, 1, 2>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    }
}

extern "C" int dsv4_cuda_attn_kv8(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base,
                                  const float *kv2, const int *idx, int nidx, const float *sink, float scale, float *out,
                                  float *scratch, void *stream) {
    return dsv4_cuda_attn_kv8_rope(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, NULL, NULL, out, scratch, stream);
}

extern "C" int dsv4_cuda_attn_kv8_rope(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base,
                                       const float *kv2, const int *idx, int nidx, const float *sink, float scale,
                                       const float *freq, const int *pos, float *out, float *scratch, void *stream) {
    const ak_rope ro = {freq, pos};
    if (T < 0 || H <= 0 || Dh <= R || (Dh - R) % 64 || R % 2 || Dh > AK_MAXD || nidx < 0)
        return dsv4_cuda_fail("attn_kv8: bad shape (T %d H %d Dh %d R %d nidx %d)", T, H, Dh, R, nidx);
    if (!T) return 0;
    cudaStream_t st = DSV4_STREAM(stream);
    if (nidx == 0) { /* no entries anywhere: zeros */
        if (cudaMemsetAsync(out, 0, sizeof(float) * (size_t)T * H * Dh, st) != cudaSuccess)
            return dsv4_cuda_fail("attn_kv8: memset failed");
        return 0; /* zeros rotate to zeros */
    }
    const ak_geom g = ak_geometry(nidx);
    /* the launch shape changes no operation (see the top of the file), so it may depend on T. T <= AK_PMAX_T: a
     * block per span (partial mode), with the fewest heads per block (shortest blocks) that still fit the GPU in
     * one wave (2 blocks per SM: shared memory), else the most; larger T: a block per query and 32 heads (full
     * mode: throughput-bound, the most heads per shared-memory read). Measured on the H200, tests/gpu/test_attn_kv8. */
    const long slots = 2L * dsv4_cuda_dev.sm_count;
    const int full = g.nspan <= 1 || T > AK_PMAX_T ? 1 : ak_force_mode >= 0 ? ak_force_mode : 0;
    int ci = 0;
    if (ak_force_cfg >= 0) ci = ak_force_cfg;
    else if (full) {
        for (ci = AK_NCFG - 2; ci > 0; ci--) /* (1, 2) is never the fastest: two warps dequantize slowly */
            if (ak_cfgs[ci].hb * ak_cfgs[ci].nw >= (H < 32 ? H : 32)) break;
    } else {
        for (ci = AK_NCFG - 2; ci > 0; ci--) {
            const int hpb = ak_cfgs[ci].hb * ak_cfgs[ci].nw;
            if ((long)T * ((H + hpb - 1) / hpb) * g.nspan <= slots) break;
        }
    }
    if (!full && !scratch) return dsv4_cuda_fail("attn_kv8: %d entries need scratch", nidx);
    const int vec = Dh % 4 == 0 && !((uintptr_t)q & 15) && !((uintptr_t)out & 15) && !((uintptr_t)kv2 & 15);
    if (!full && ((uintptr_t)scratch & 15)) return dsv4_cuda_fail("attn_kv8: scratch not 16-byte aligned");
    switch ((Dh + 127) / 128) {
    case 1: return ak_launch_cfg<1>(ci, q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    case 2: return ak_launch_cfg<2>(ci, q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    case 3: return ak_launch_cfg<3>(ci, q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    default: return ak_launch_cfg<4>(ci, q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, g, full, vec, ro, st);
    }
}
