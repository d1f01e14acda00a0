/* mbarrier.cuh - shared-memory mbarriers and bulk copies global -> shared (sm_90; included by .cu files): the
 * transaction-counted barrier a cp.async.bulk completes on, so that the copies of a stage are waited for without any
 * thread tracking them (cp.async groups belong to the thread that issued them) and without a memory barrier (a
 * fence.proxy.async after st.shared also waits for the thread's cp.async copies in flight: MEMBAR.ALL.CTA). */
#ifndef DSV4_CUDA_MBARRIER_CUH
#define DSV4_CUDA_MBARRIER_CUH

#include <stdint.h>

/* bar: a shared address (8-byte aligned); count: arrivals a phase waits for. Then fence_init and a block barrier
 * before any other thread uses it. */
__device__ __forceinline__ void dev_mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void dev_mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
/* one arrival that also expects bytes more of the phase's transactions */
__device__ __forceinline__ void dev_mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void dev_mbar_arrive(unsigned bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }
/* until the phase of parity `parity` has completed */
__device__ __forceinline__ void dev_mbar_wait(unsigned bar, unsigned parity) {
    asm volatile("{ .reg .pred p;\n"
                 "MB_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra MB_WAIT;\n"
                 "}" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* bytes (a multiple of 16; both addresses 16-byte aligned) from global src to shared dst, completing on mbarrier bar */
__device__ __forceinline__ void dev_bulk_g2s(unsigned dst, const void *src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes),
                 "r"(bar)
                 : "memory");
}

/* 16 bytes from global src to shared dst (both 16-byte aligned; L2 only), a thread's own copy (cp.async: any lane, no
 * uniform registers, unlike cp.async.bulk) */
__device__ __forceinline__ void dev_cp16_g2s(unsigned dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
/* an arrival on bar once all of this thread's cp.async copies issued so far have landed (noinc: bar's count must
 * include it) */
__device__ __forceinline__ void dev_cp_mbar_arrive(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

#endif
