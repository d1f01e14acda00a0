/* kv_cache.h - the attention KV cache in its stored format (spec 7: what the reference's simulation
 * leaves in the cache), so that storing an entry adds no error, and the sparse attention that reads it.
 *
 * One entry (a window row or a compressed entry; head_dim Dh = nope + R, nope a multiple of 64) is
 * dsv4_kv_row_bytes(Dh, R) bytes:
 *   [0, nope)                 e4m3 codes of the non-rope dims
 *   [nope, nope + nope/64)    one e8m0 scale per 64 of them (value = code * 2^(scale - 127))
 *   [rope_off, rope_off + 2R) the R rope dims as bf16        (rope_off = nope + nope/64, rounded up to 16)
 *   padding to a multiple of 16 bytes.
 * For V4 (Dh 512, R 64): 592 bytes instead of 2048 in fp32. The non-rope dims went through the FP8
 * act_quant simulation (blocks of 64, power-of-two scales) before they are stored, so their codes and
 * scales hold them exactly; the rope dims are rounded to bf16 (the reference keeps them in its
 * activation dtype, bf16 on the GPU).
 *
 * Plain C; the device functions are in kv_cache.cuh, the kernels in attn_kv8.cu, attn_kv8_tc.cu and attn_kv8_wg.cu
 * (prefill). */
#ifndef DSV4_CUDA_KV_CACHE_H
#define DSV4_CUDA_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define DSV4_KV_HD __host__ __device__
#else
#define DSV4_KV_HD
#endif
static inline DSV4_KV_HD int dsv4_kv_rope_off(int Dh, int R) { return ((Dh - R) + (Dh - R) / 64 + 15) & ~15; }
static inline DSV4_KV_HD int64_t dsv4_kv_row_bytes(int Dh, int R) { return (dsv4_kv_rope_off(Dh, R) + 2 * R + 15) & ~15; }

/* An indexer key (index_head_dim Di, a multiple of 32) in its stored format: Di/2 bytes of e2m1 codes
 * (element 2k in the low nibble of byte k, 2k+1 in the high one), then one e8m0 scale per 32, padded to 16
 * bytes: 80 bytes for Di 128 instead of 512. The keys went through the Hadamard rotation and the FP4
 * act_quant simulation, so the codes and scales hold them exactly. */
static inline DSV4_KV_HD int64_t dsv4_ikey_row_bytes(int Di) { return (Di / 2 + Di / 32 + 15) & ~15; }

/* Packs n fp32 rows (row stride sld; FP4-simulated) into indexer-key rows: row i to dst + rows[i] * bytes
 * (rows NULL = row i). Fails when Di is not a multiple of 32. */
int dsv4_cuda_ikey_pack(const float *src, int64_t sld, int n, int Di, uint8_t *dst, const int *rows, void *stream);

/* Packs n fp32 rows (row stride sld floats; non-rope dims already FP8-simulated) into cache rows:
 * row i goes to dst + rows[i] * row_bytes (rows: device ints; NULL = row i). Fails when (Dh - R) is
 * not a multiple of 64. */
int dsv4_cuda_kv_pack(const float *src, int64_t sld, int n, int Dh, int R, uint8_t *dst, const int *rows,
                      void *stream);
/* The inverse, for tests: cache rows 0..n-1 -> fp32 rows (stride dld). */
int dsv4_cuda_kv_unpack(const uint8_t *src, int n, int Dh, int R, float *dst, int64_t dld, void *stream);

/* Sparse attention with a sink (spec 7.1) over cache entries, for T queries q [T, H, Dh] (fp32, Dh <= 512):
 * entry id >= 0 of query t is cache row id of base[t] (a device array of T device pointers: the
 * query's sequence's cache), id <= -2 is fp32 row -id-2 of kv2 (row stride Dh: a prefill chunk's own
 * keys, not stored yet), -1 is no entry. idx [T, nidx], any nidx >= 0. out [T, H, Dh]. A query with
 * no valid entry gets zeros. The list is taken in sub-splits of 32 entries (a softmax each), folded in
 * order into at most 32 spans and the spans in order into the result (attn_kv8.cu); every sum has an order
 * fixed by the query's own list, so the result never depends on T or on the launch shape (batch invariant)
 * and is the same run to run. Small T runs a block per span, with the span states in scratch (see
 * dsv4_cuda_attn_kv8_scratch, 16-byte aligned). Twin: dsv4_cpu_sparse_attn on the unpacked rows. */
int dsv4_cuda_attn_kv8(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                       const int *idx, int nidx, const float *sink, float scale, float *out, float *scratch,
                       void *stream);
/* The same, then the inverse RoPE of each output row's last R dims (pair i at angle pos[t] x freq[i]): the bits of
 * dsv4_cuda_attn_kv8 followed by dsv4_cuda_rope(out, T, H, Dh, R / 2, freq, pos, 1), in one pass over out (freq
 * NULL: no rotation). */
int dsv4_cuda_attn_kv8_rope(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                            const int *idx, int nidx, const float *sink, float scale, const float *freq, const int *pos,
                            float *out, float *scratch, void *stream);
/* Floats of scratch dsv4_cuda_attn_kv8 needs for T queries, H heads, nidx entries (0 when nidx <= 32; never
 * more than for T = 32). */
size_t dsv4_cuda_attn_kv8_scratch(int T, int H, int Dh, int nidx);
/* Tests only: force dsv4_cuda_attn_kv8's launch shape (cfg 0..4: 4 x 8, 4 x 4, 2 x 4, 1 x 4, 1 x 2 heads per warp
 * x warps per block; mode 1: one block per query and head group, 0: one per span when T <= 32), -1 = automatic. The result
 * must not change. */
void dsv4_cuda_attn_kv8_force(int cfg, int mode);
/* The same attention on tensor cores (attn_kv8_tc.cu): a block per (query, 64 heads) or, for decode steps of few
 * queries, per (query, 64 heads, span of the list). Scores and weights in f16 terms with fp32 sums (hi + lo terms,
 * near fp32; prefill passes one term by default: below), the order fixed by the query's own list (batch invariant),
 * but not dsv4_cuda_attn_kv8's bits. kv2 rows' non-rope dims must be FP8-simulated (as forward_cuda's kv is). Fail
 * when !dsv4_cuda_attn_kv8_tc_fits(H, Dh, R) (R <= 64, Dh - R + 64 <= 512, the shared memory).
 * Prefill passes: spans of 1024 entries, no scratch, any T, no rotation of the output. */
int dsv4_cuda_attn_kv8_tc(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                          const int *idx, int nidx, const float *sink, float scale, float *out, void *stream);
/* The prefill form with one f16 term on Hopper's warpgroup MMA (attn_kv8_wg.cu): dsv4_cuda_attn_kv8_tc's one-term form
 * (its sums in the same order; e^x on the SFU), a block per (query, 64 heads), the forward's prefill attention where it
 * fits. q 16-byte aligned, out 8-byte. kv2 holds nkv2 rows (ids
 * -2 .. -nkv2-1), first packed into scratch (dsv4_cuda_attn_kv8_wg_scratch bytes, 16-byte aligned; their rope dims
 * as f16, as the one-term form takes them). Needs dsv4_cuda_attn_kv8_wg_fits (Dh <= 512, R % 8 == 0, (Dh - R) % 64
 * == 0). DSV4_CUDA_ATTN_WG=0 turns it off (dsv4_cuda_attn_kv8_wg_enabled: the forward takes dsv4_cuda_attn_kv8_tc). */
int dsv4_cuda_attn_kv8_wg(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                          int nkv2, const int *idx, int nidx, const float *sink, float scale, float *out, void *scratch,
                          void *stream);
int dsv4_cuda_attn_kv8_wg_fits(int H, int Dh, int R);
int dsv4_cuda_attn_kv8_wg_enabled(void);
size_t dsv4_cuda_attn_kv8_wg_scratch(int nkv2, int Dh, int R);
/* The same attention with its output's inverse RoPE (freq, pos: dsv4_cuda_rope(out, T, H, Dh, R / 2, freq, pos, 1)'s
 * arithmetic; freq NULL: none) and wo_a's split terms in place of the fp32 output (dsv4_cuda_linear_gemm_terms reads
 * them): query t's row of out (H x Dh floats) holds, for each of the G head groups gi, hi = bf16(v) at bf16 element
 * gi * 2 gin and, with nt 2, mid = bf16(v - hi) at (2 gi + 1) gin (gin = H / G x Dh; within a group head-major, as the
 * fp32 row), the bits dsv4_cuda_linear_gemm_split makes of the fp32 output after dsv4_cuda_rope. Needs
 * dsv4_cuda_attn_kv8_wg_terms_fits (G divides H, a block of 64 heads holds whole groups). qh: q's rows as
 * dsv4_cuda_norm_rope_h16 leaves them (f16 in the first half of each fp32 row's bytes; the same values the kernel
 * rounds fp32 q to). f16s (device, NULL: the bf16 terms above): one f16 term, f16(v x *f16s) at gi * 2 gin (nt 1;
 * *f16s a power of two that keeps every |v| x *f16s in f16's range: dsv4_cuda_wo_a_f16_scale), wo_a's input for
 * dsv4_cuda_linear_gemm_terms_f16. */
int dsv4_cuda_attn_kv8_wg_terms(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                                int nkv2, const int *idx, int nidx, const float *sink, float scale, const float *freq,
                                const int *pos, int G, int nt, int qh, const float *f16s, float *out, void *scratch, void *stream);
int dsv4_cuda_attn_kv8_wg_terms_fits(int H, int Dh, int R, int G);
/* whether the forward takes the terms form where it can (DSV4_CUDA_ATTN_TERMS, on by default since session 30; =0: the
 * fp32 output, dsv4_cuda_rope and the split; read once) */
int dsv4_cuda_attn_kv8_wg_terms_enabled(void);
/* The precision of a form (dec 0: prefill passes, dsv4_cuda_attn_kv8_tc; 1: decode steps, dsv4_cuda_attn_kv8_tc_dec):
 * on 0 q, p and the rope dims as one f16 term each, ~2^-12 relative per operand (the official model computes attention
 * in bf16, 2^-9), the prefill form's default (DSV4_CUDA_ATTN_TC_HILO); 1 hi + lo terms, near fp32, the decode form's
 * default (DSV4_CUDA_ATTN_TC_DEC_HILO); -1: back to the environment's choice; -2: unchanged. Returns the mode now in
 * force. Tests and measurements. */
int dsv4_cuda_attn_kv8_tc_hilo(int dec, int on);
/* Decode steps: spans of DSV4_CUDA_ATTN_TC_SPT tiles of 32 entries (default 2; lists under 512 entries
 * DSV4_CUDA_ATTN_TC_SPT_SHORT, default 1; more when the list has more than 32 spans of that size), each span's state folded in order into the total, by the query's block or, up to 32 queries,
 * by a combine kernel over the spans' states in scratch (dsv4_cuda_attn_kv8_tc_scratch floats, 16-byte aligned);
 * blocks of 16 heads when they fit in one wave, else of 64 (DSV4_CUDA_ATTN_TC_H16=0 / 1: never / always): the same
 * bits for any T. Then the inverse RoPE as dsv4_cuda_attn_kv8_rope does it (freq NULL: none). */
int dsv4_cuda_attn_kv8_tc_dec(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                              const int *idx, int nidx, const float *sink, float scale, const float *freq, const int *pos,
                              float *out, float *scratch, void *stream);
size_t dsv4_cuda_attn_kv8_tc_scratch(int T, int H, int Dh, int nidx);
int dsv4_cuda_attn_kv8_tc_fits(int H, int Dh, int R);
/* Tests only: dsv4_cuda_attn_kv8_tc_dec's launch shape (bit 0: 0 a block per span when T <= 32, 1 per query; bit 1:
 * 0 64 heads a block, 1 16 heads; 4: query blocks of 64 heads on warpgroup MMA where the shape takes it (Dh 512, 64
 * rope dims); -1: auto). Every shape gives the same bits. */
void dsv4_cuda_attn_kv8_tc_force(int mode);
/* dsv4_cuda_attn_kv8_tc_dec's query blocks of 64 heads on warpgroup MMA (1), not (0), or as DSV4_CUDA_ATTN_TC_WG
 * says (-1; default on). The same bits either way. */
void dsv4_cuda_attn_kv8_tc_wg(int on);
/* 0 when DSV4_CUDA_ATTN_TC=0 (read once): prefill passes then take dsv4_cuda_attn_kv8 */
int dsv4_cuda_attn_tc_enabled(void);
/* Whether a decode step's attention over lists of nidx entries (a layer's, fixed for the model: never by T) takes
 * dsv4_cuda_attn_kv8_tc_dec: it fits, DSV4_CUDA_ATTN_TC_DECODE is not 0 and nidx >= DSV4_CUDA_ATTN_TC_DECODE_MIN
 * (default 0; read once); else dsv4_cuda_attn_kv8_rope. */
int dsv4_cuda_attn_tc_decode_takes(int H, int Dh, int R, int nidx);

#ifdef __cplusplus
}
#endif
#endif
