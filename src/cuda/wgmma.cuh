/* wgmma.cuh - Hopper warpgroup MMA (sm_90a) for kernels of src/cuda (C++, included by .cu files): wgmma.mma_async
 * m64nNk16 f16 x f16 -> fp32 with A from registers and B from shared memory (or both from shared memory, or B read
 * N-major), its fences, commit and wait, and the shared-memory descriptor of a tile in core matrices without swizzle.
 *
 * A: each warp of the warpgroup holds 16 of the 64 rows (warp w: rows 16 w ..) as mma.sync m16n8k16's A fragment
 * (linear_tc.cuh's tc_mma: a0 row g, columns 2c, 2c+1; a1 row g+8; a2 / a3 columns 2c+8, 2c+9). D: per warp the
 * same rows, n-tile j of 8 columns in d[j][0..3] as tc_mma's D. Measured on the H200 (2026-12-01): a chain of these
 * k-steps gives the bits of the same chain of mma.sync m16n8k16 (6.5 M outputs of 64-step chains, operand
 * exponents spread over +-14 binades, accumulators over +-20), so a kernel may use either and keep its results.
 *
 * The registers of A and D are read / written asynchronously: after wg_wait, wg_keep on them stops the compiler
 * from reusing A's registers or reading D before the wait (CUTLASS's fence_operand idea). */
#ifndef DSV4_CUDA_WGMMA_CUH
#define DSV4_CUDA_WGMMA_CUH

#include <stdint.h>

/* between register writes (accumulators, A fragments) by ordinary instructions and the wgmma that read them */
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/* until at most N committed groups of this warp are in flight */
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void wg_keep(float &v) { asm volatile("" : "+f"(v)::"memory"); }
__device__ __forceinline__ void wg_keep(uint32_t &v) { asm volatile("" : "+r"(v)::"memory"); }
/* cp.async / st.shared data of this thread visible to the tensor cores' (async proxy) reads, after a barrier */
__device__ __forceinline__ void wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* descriptor of a K-major B tile at shared address sa (16-byte aligned) without swizzle: core matrices of 8 rows (N)
 * x 16 bytes (8 f16 of K) stored as 128 contiguous bytes; lbo: bytes between the two core matrices of a k16 step
 * (K direction), sbo: bytes between 8-row groups (N direction); the layout bench/wgmma_eq.cu checks. The same for A
 * (rows M), and for an N-major B (trans-b: a core matrix's 8 rows are 8 values of K, its 16 bytes 8 of N): lbo still
 * steps K (8 rows), sbo N (8 values); attn_kv8_wg.cu reads one tile both ways. */
__device__ __forceinline__ uint64_t wg_desc(unsigned sa, unsigned lbo, unsigned sbo) {
    return (uint64_t)((sa & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) | ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32);
}

#define WG_D4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
/* d[0 .. N/8 - 1] += A (64 x 16, registers) . B (16 x N, descriptor), N = 8 NT for NT 4, 6, 8 */
template <int NT> __device__ __forceinline__ void wg_mma_f16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
    static_assert(NT == 4 || NT == 6 || NT == 8, "n-tiles of a wgmma: 4, 6 or 8");
    if (NT == 4)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15},"
                     " {%16,%17,%18,%19}, %20, p, 1, 1, 0; }"
                     : WG_D4(0), WG_D4(1), WG_D4(2), WG_D4(3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
                     : "memory");
    else if (NT == 6)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23}, {%24,%25,%26,%27}, %28, p, 1, 1, 0; }"
                     : WG_D4(0), WG_D4(1), WG_D4(2), WG_D4(3), WG_D4(4), WG_D4(5)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
                     : "memory");
    else
        asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0; }"
                     : WG_D4(0), WG_D4(1), WG_D4(2), WG_D4(3), WG_D4(4), WG_D4(5), WG_D4(6), WG_D4(7)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
                     : "memory");
}

/* d[0 .. 3] (= or, acc != 0, +=) A (64 x 16, descriptor da: K-major, shared memory) . B (16 x 32, descriptor db:
 * K-major), wgmma m64n32k16 with both operands in shared memory */
__device__ __forceinline__ void wg_mma_ss_n32(float (&d)[4][4], uint64_t da, uint64_t db, int acc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15},"
                 " %16, %17, p, 1, 1, 0, 0; }"
                 : WG_D4(0), WG_D4(1), WG_D4(2), WG_D4(3)
                 : "l"(da), "l"(db), "r"(acc)
                 : "memory");
}
/* d[0 .. 31] += A (64 x 16, registers) . B (16 x 256, descriptor: N-major, i.e. B's rows of 8 N-values are the 16-byte
 * rows of its core matrices; the descriptor's lbo steps K, sbo steps N), wgmma m64n256k16 with B transposed */
__device__ __forceinline__ void wg_mma_rs_n256t(float (&d)[32][4], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127},"
                 " {%128,%129,%130,%131}, %132, p, 1, 1, 1; }"
                 : WG_D4(0), WG_D4(1), WG_D4(2), WG_D4(3), WG_D4(4), WG_D4(5), WG_D4(6), WG_D4(7), WG_D4(8), WG_D4(9), WG_D4(10), WG_D4(11), WG_D4(12), WG_D4(13), WG_D4(14), WG_D4(15), WG_D4(16), WG_D4(17), WG_D4(18), WG_D4(19), WG_D4(20), WG_D4(21), WG_D4(22), WG_D4(23), WG_D4(24), WG_D4(25), WG_D4(26), WG_D4(27), WG_D4(28), WG_D4(29), WG_D4(30), WG_D4(31)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
                 : "memory");
}
#undef WG_D4

#endif
