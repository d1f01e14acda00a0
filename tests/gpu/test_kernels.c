/* test_kernels.c - every op of src/cuda/cuda_backend.h against its CPU twin (src/cpu, src/quant), on
 * random inputs at DeepSeek-V4-Flash shapes (dim 4096, 64 heads x 512, rope 64, q_lora 1024, expert
 * inter 2048, indexer 64 x 128) plus odd sizes, then timings (CUDA events; GEMV GB/s against a
 * device-to-device copy measured in the same run, weights rotated through > 256 MiB so that L2 does not serve them).
 *
 * One closeness rule: |got - ref| <= atol + rtol * |ref| per element; the worst element (largest
 * |got - ref| / (atol + rtol * |ref|)) is printed; any failure makes the exit status non-zero.
 * The device-side pieces of the decode step (top-k, MoE grouping, grouped experts, attention index
 * lists, the window ring store) are checked against twins written here from their definitions in
 * src/cuda/cuda_model.h and kv_cache.h.
 * Linears and experts with BF16 activations (dsv4_cuda_weight.act_bf16) against the twin on x rounded to bf16; the FP8
 * prefill GEMM (cuBLASLt) to a bf16-level tolerance (test_linear_gemm says why).
 * Build and run: scripts/gpu_test.sh (make CUDA=1 builds build/tests/gpu/test_kernels).
 * Usage: test_kernels [--no-bench] [--only linear|gemm|multi|mt|hc|moe|moebench|pfb|pf8|topk]   (--only linear: the linear checks and timings
 * alone; --only gemm: those of the FP8 prefill GEMM alone; --only multi: those of the grouped linears, and the single ones
 * they replace; --only mt: those of the multi-token GEMM, timed against the GEMV at Flash's shapes; --only hc: those of
 * mHC pre / post / head; --only moe: the MoE grouping / expert / combine checks and the
 * experts' timings; --only moebench: the experts' timings alone; --only pfb: the BF16 prefill experts' checks (then the FP8 ones'); --only pf8: the FP8 prefill experts' checks; --only topk: the indexer top-k's checks and times) */
#include "kt.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach a log even if a timeout kills the run (bench/device_run.sh) */
    setenv("DSV4_LINEAR_GEMM_F16", "1", 0); /* the split GEMM's f16 form (opt-in) is checked too */
    setenv("DSV4_MOE_F8", "0", 0); /* the f16 experts kernels' checks (the default); the FP8 kernels' through their mode bit */
    int bench = 1, only_lin = 0, only_gemm = 0, only_hc = 0, only_multi = 0, only_moe = 0, only_mt = 0, only_topk = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-bench")) bench = 0;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "multi")) only_lin = only_multi = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "linear")) only_lin = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "mt")) only_lin = only_mt = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "gemm")) only_lin = only_gemm = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "hc")) only_hc = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "moe")) only_moe = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "moebench")) only_moe = 2, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "pfb")) only_moe = 3, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "pf8")) only_moe = 4, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "topk")) only_topk = 1, i++;
    }
    dsv4_cuda_info info;
    char err[256];
    if (dsv4_cuda_init(0, &info, err, sizeof err)) {
        fprintf(stderr, "cuda init: %s\n", err);
        return 2;
    }
    printf("device: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB, smem/block %d KiB\n", info.name, info.cc_major, info.cc_minor,
           info.sm_count, info.mem_total / 1073741824.0, info.l2_bytes >> 20, info.smem_optin >> 10);

    if (only_hc) goto hc_checks;
    if (only_gemm) goto gemm_checks;
    if (only_multi) goto multi_checks;
    if (only_mt) goto mt_checks;
    if (only_moe == 2) goto checks_done; /* the MoE bench alone (bench/ncu runs) */
    if (only_moe == 3) goto pfb_checks; /* the BF16 prefill experts alone */
    if (only_moe == 4) goto pf8_checks; /* the FP8 prefill experts alone */
    if (only_moe) goto moe_checks;
    if (only_topk) goto topk_checks;
    /* linear: every format, decode (GEMV, 16-byte path) and odd sizes (element path), prefill (GEMM) */
    test_linear("wq_a", DSV4_WF_FP8, 1024, 4096, 1, 0, 1, 0);
    test_linear("wq_b", DSV4_WF_FP8, 4096, 1024, 4, 0, 1, 0);
    test_linear("f32-scale", DSV4_WF_FP8, 512, 1024, 2, 1, 1, 0);
    test_linear("T=16", DSV4_WF_FP8, 640, 4096, 16, 0, 1, 0);
    test_linear("odd", DSV4_WF_FP8, 200, 1000, 3, 0, 1, 0);
    test_linear("odd x:bf16", DSV4_WF_FP8, 130, 520, 2, 0, 1, 1);
    test_linear("gemm", DSV4_WF_FP8, 300, 640, 37, 0, 1, 0);
    test_linear("gemm odd", DSV4_WF_FP8, 129, 1000, 70, 1, 1, 0);
    test_linear("gemm odd", DSV4_WF_FP8, 129, 1000, 300, 1, 1, 0); /* past 256 rows: the tiled GEMM */
    test_linear("gemm odd", DSV4_WF_BF16, 77, 1003, 270, 0, 0, 0);
    test_linear("expert w1", DSV4_WF_MXFP4, 2048, 4096, 1, 0, 0, 0);
    test_linear("expert w2", DSV4_WF_MXFP4, 4096, 2048, 8, 0, 0, 0);
    test_linear("odd", DSV4_WF_MXFP4, 100, 330, 2, 0, 0, 0);
    test_linear("gemm", DSV4_WF_MXFP4, 512, 1024, 70, 0, 0, 0);
    test_linear("expert w1", DSV4_WF_NVFP4, 2048, 4096, 1, 0, 0, 0);
    test_linear("odd rows", DSV4_WF_NVFP4, 333, 4096, 5, 0, 0, 0);
    test_linear("odd", DSV4_WF_NVFP4, 64, 200, 2, 0, 0, 0);
    test_linear("gemm", DSV4_WF_NVFP4, 256, 2048, 40, 0, 0, 0);
    test_linear("x:bf16", DSV4_WF_BF16, 1024, 4096, 1, 0, 0, 1);
    test_linear("odd", DSV4_WF_BF16, 77, 1003, 2, 0, 0, 0);
    test_linear("gemm", DSV4_WF_BF16, 129, 4096, 20, 0, 0, 0);
    test_linear("hc fn", DSV4_WF_F32, 24, 16384, 1, 0, 0, 0);
    test_linear("", DSV4_WF_F16, 256, 4096, 2, 0, 0, 0);
    test_linear("gemm", DSV4_WF_F16, 100, 300, 33, 0, 0, 0);
    /* the tensor-core GEMV at the model's shapes: T = 1..16 (one and two 8-token mma tiles), column slices over
     * warps and clusters (few rows), views, x in bf16, FP8 with and without act quant, FP4 with act quant */
    test_linear("wq_a T=8", DSV4_WF_FP8, 1024, 4096, 8, 0, 1, 0);
    test_linear("wq_a T=16", DSV4_WF_FP8, 1024, 4096, 16, 0, 1, 0);
    test_linear("wkv", DSV4_WF_FP8, 512, 4096, 5, 0, 1, 0);
    test_linear("wo_b", DSV4_WF_FP8, 4096, 8192, 3, 0, 1, 0);
    test_linear("wq_b", DSV4_WF_FP8, 32768, 1024, 2, 0, 1, 0);
    test_linear("shared w1 T=9", DSV4_WF_FP8, 2048, 4096, 9, 0, 1, 0);
    test_linear("Pro wq_a", DSV4_WF_FP8, 1536, 7168, 2, 0, 1, 0);
    test_linear("x:bf16", DSV4_WF_FP8, 1024, 4096, 3, 0, 1, 1);
    test_linear("no aq", DSV4_WF_FP8, 1024, 2048, 4, 0, 0, 0);
    test_linear("no aq T=12", DSV4_WF_FP8, 512, 1024, 12, 1, 0, 0);
    test_linear_v("", DSV4_WF_FP8, 1000, 2048, 4, 0, 1, 0, 40);
    test_linear_v("", DSV4_WF_FP8, 300, 1024, 2, 1, 1, 0, 129);
    test_linear("expert w1 T=16", DSV4_WF_MXFP4, 2048, 4096, 16, 0, 0, 0);
    test_linear("expert w2 T=3", DSV4_WF_MXFP4, 4096, 2048, 3, 0, 0, 0);
    test_linear("aq", DSV4_WF_MXFP4, 2048, 2048, 4, 0, 1, 0);
    test_linear_v("", DSV4_WF_MXFP4, 500, 1024, 2, 0, 0, 0, 3);
    test_linear("T=12", DSV4_WF_NVFP4, 1024, 4096, 12, 0, 0, 0);
    test_linear("expert w2", DSV4_WF_NVFP4, 4096, 2048, 8, 0, 0, 0);
    test_linear("x:bf16", DSV4_WF_NVFP4, 2048, 4096, 2, 0, 0, 1);
    test_linear("head-like", DSV4_WF_BF16, 4096, 4096, 3, 0, 0, 0);
    test_linear("T=16", DSV4_WF_BF16, 512, 4096, 16, 0, 0, 0);
    test_linear("x:bf16 T=9", DSV4_WF_BF16, 1024, 4096, 9, 0, 0, 1);
    test_linear("T=11", DSV4_WF_F16, 256, 4096, 11, 0, 0, 0);
    test_linear("hc fn T=4", DSV4_WF_F32, 24, 16384, 4, 0, 0, 0);
    test_linear("hc fn x:bf16", DSV4_WF_F32, 24, 16384, 2, 0, 0, 1);
    test_linear_invariant("wq_a", DSV4_WF_FP8, 1024, 4096, 1, 0);
    test_linear_invariant("wq_b", DSV4_WF_FP8, 32768, 1024, 1, 0);
    /* wo_b at T = 1 and 8 (x staged in 1 and 8 passes per warp) and bitwise T-invariant */
    test_linear("wo_b", DSV4_WF_FP8, 4096, 8192, 1, 0, 1, 0);
    test_linear("wo_b", DSV4_WF_FP8, 4096, 8192, 8, 0, 1, 0);
    test_linear_invariant("wo_b", DSV4_WF_FP8, 4096, 8192, 1, 0);
    test_linear_invariant("expert", DSV4_WF_MXFP4, 2048, 4096, 0, 0);
    test_linear_invariant("expert", DSV4_WF_NVFP4, 4096, 2048, 0, 0);
    test_linear_invariant("", DSV4_WF_BF16, 4096, 4096, 0, 0);
    test_linear_invariant("hc fn", DSV4_WF_F32, 24, 16384, 0, 0);
    test_linear_invariant("odd", DSV4_WF_FP8, 200, 1000, 1, 0); /* the element path: T-invariant up to 256 rows */
    test_linear_invariant("odd", DSV4_WF_NVFP4, 64, 200, 0, 1);
    test_linear_invariant("odd", DSV4_WF_BF16, 77, 1003, 0, 0);
    /* BF16 activations (act_bf16: linears of models without the FP8 recipe): every format that can carry it (all
     * but act-quant ones), T = 1, 5, 16, 40; odd sizes take the element path (T <= 16) and the tiled GEMM (T = 40) */
    test_linear_bf16act("head-like", DSV4_WF_BF16, 4096, 4096, 0);
    test_linear_bf16act("", DSV4_WF_F16, 256, 4096, 0);
    test_linear_bf16act("", DSV4_WF_F32, 96, 2048, 0);
    test_linear_bf16act("no aq", DSV4_WF_FP8, 1024, 2048, 0);
    test_linear_bf16act("expert w1", DSV4_WF_MXFP4, 2048, 4096, 0);
    test_linear_bf16act("wq_b", DSV4_WF_NVFP4, 4096, 1024, 0);
    test_linear_bf16act("wo_b", DSV4_WF_NVFP4, 1024, 8192, 0);
    test_linear_bf16act("", DSV4_WF_NVFP4, 300, 1024, 17);
    test_linear_bf16act("odd", DSV4_WF_BF16, 77, 1003, 0);
    test_linear_bf16act("odd", DSV4_WF_NVFP4, 64, 200, 0);
    test_linear_bf16act("odd", DSV4_WF_MXFP4, 100, 330, 0);
    test_linear_bf16act("odd", DSV4_WF_FP8, 129, 1000, 0);
    test_linear_ab("x:bf16", DSV4_WF_NVFP4, 1024, 4096, 3, 0, 0, 1, 0, 1); /* bf16 input: the rounding is a no-op */
    test_linear_ab("ignored with aq", DSV4_WF_FP8, 1024, 4096, 5, 0, 1, 0, 0, 1); /* the twin: act quant of fp32 x */
    test_linear_ab("ignored with aq", DSV4_WF_MXFP4, 2048, 2048, 40, 0, 1, 0, 0, 1);
    test_linear_invariant("", DSV4_WF_NVFP4, 4096, 2048, 0, 1);
    test_linear_invariant("", DSV4_WF_BF16, 4096, 4096, 0, 1);
    test_linear_invariant("", DSV4_WF_F16, 256, 4096, 0, 1);
    /* grouped linears (dsv4_cuda_linear_multi): bitwise the separate calls, T = 1, 3, 16, 40 */
multi_checks: {
        mspec wo8[8], b20[20];
        ms_wo_a(wo8, 8), ms_b20(b20);
        const mspec mx[3] = {{DSV4_WF_MXFP4, 2048, 2048, 0, 0, 0}, {DSV4_WF_MXFP4, 512, 2048, 0, 0, 0}, {DSV4_WF_MXFP4, 100, 2048, 0, 0, 0}};
        const mspec nv[2] = {{DSV4_WF_NVFP4, 1024, 4096, 0, 0, 0}, {DSV4_WF_NVFP4, 333, 4096, 0, 0, 0}};
        const mspec f32[2] = {{DSV4_WF_F32, 24, 2048, 0, 0, 0}, {DSV4_WF_F32, 48, 2048, 0, 0, 0}};
        const mspec f16[2] = {{DSV4_WF_F16, 256, 4096, 0, 0, 0}, {DSV4_WF_F16, 128, 4096, 0, 0, 0}};
        const mspec f8s[2] = {{DSV4_WF_FP8, 512, 1024, 0, 1, 0}, {DSV4_WF_FP8, 640, 1024, 0, 1, 0}};
        const mspec odd[2] = {{DSV4_WF_FP8, 200, 1000, 1, 0, 0}, {DSV4_WF_FP8, 130, 1000, 1, 0, 0}};
        test_linear_multi_T("wo_a groups Flash", wo8, 8, 1, 1, 1, 0);
        { /* its own random stream: the checks after it keep their inputs (added in session 15) */
            const uint64_t rs = rnd_state_get();
            mspec wx[8];
            ms_wo_a_x32(wx, 8);
            test_linear_multi_T("wo_a groups Flash, fp32 x", wx, 8, 1, 1, 1, 0);
            rnd_state_set(rs);
        }
        test_linear_multi_T("wq_a+wkv", qkv, 2, 0, 0, 0, 0);
        test_linear_multi_T("compressors+wproj", cmp, 5, 0, 0, 0, 0);
        test_linear_multi_T("gate+sw1+sw3", moe3, 3, 0, 0, 1, 0);
        test_linear_multi_T("", mx, 3, 0, 1, 1, 0);
        test_linear_multi_T("", nv, 2, 0, 0, 1, 0);
        test_linear_multi("act:bf16", nvab, 2, 0, 1, 1, 0, 5);
        test_linear_multi("", f32, 2, 0, 1, 1, 0, 3);
        test_linear_multi("", f16, 2, 0, 0, 1, 0, 5);
        test_linear_multi("no aq", f8s, 2, 0, 1, 1, 0, 12);
        test_linear_multi("no aq", f8s, 2, 0, 1, 1, 0, 40);
        test_linear_multi("wq_a+wkv", qkv, 2, 0, 1, 1, 1, 3);
        test_linear_multi("wq_a+wkv", qkv, 2, 0, 0, 1, 1, 17);
        test_linear_multi("20 jobs", b20, 20, 0, 1, 1, 0, 2);
        test_linear_multi("element path", odd, 2, 0, 1, 1, 0, 3);
        test_linear_multi("element path", odd, 2, 0, 1, 1, 0, 40);
        test_linear_multi("mixed", mix, 4, 0, 1, 1, 0, 3);
        test_linear_multi("mixed", mix, 4, 0, 1, 0, 0, 20);
        if (only_multi) goto checks_done;
    }
    /* the multi-token GEMM (dsv4_cuda_linear_ws): bitwise the GEMV for every format and x kind it takes, rows not a
     * multiple of its 128-row blocks, views, few rows (many column slices; less than a wave of blocks: a slice a block,
     * then their sums in order), T from its minimum to more than one pass;
     * grouped jobs (dsv4_cuda_linear_multi_ws) against the GEMV's single calls; F32 and odd shapes keep the GEMV */
mt_checks: {
        test_linear_mt("head-like", DSV4_WF_BF16, 1000, 4096, 200, 0, 0, 0, 0, 0);
        test_linear_mt("", DSV4_WF_BF16, 4096, 4096, DSV4_CUDA_LINEAR_WS_MIN_T, 0, 0, 0, 0, 0);
        test_linear_mt("GEMV kept", DSV4_WF_BF16, 4096, 4096, DSV4_CUDA_LINEAR_WS_MIN_T - 1, 0, 0, 0, 0, 0);
        test_linear_mt("2 passes", DSV4_WF_BF16, 512, 4096, 300, 0, 0, 0, 0, 0);
        test_linear_mt("", DSV4_WF_BF16, 1024, 4096, 64, 0, 0, 0, 1, 0);
        test_linear_mt("", DSV4_WF_BF16, 768, 2048, 177, 0, 0, 1, 0, 0);
        test_linear_mt("gate", DSV4_WF_BF16, 256, 4096, 256, 0, 0, 0, 0, 0);
        test_linear_mt("few rows", DSV4_WF_BF16, 64, 4096, 140, 0, 0, 0, 0, 0);
        test_linear_mt("wo_b", DSV4_WF_FP8, 4096, 8192, 64, 0, 1, 0, 0, 0);
        test_linear_mt("wq_b", DSV4_WF_FP8, 32768, 1024, 80, 0, 1, 0, 0, 0);
        test_linear_mt("4 slices, a wave", DSV4_WF_FP8, 8192, 4096, 256, 0, 1, 0, 0, 0);
        test_linear_mt("", DSV4_WF_FP8, 1000, 2048, 100, 0, 1, 0, 0, 128);
        test_linear_mt("f32 scales", DSV4_WF_FP8, 640, 1024, 150, 1, 1, 0, 0, 0);
        test_linear_mt("no aq", DSV4_WF_FP8, 1024, 2048, 130, 0, 0, 0, 0, 0);
        test_linear_mt("x:bf16", DSV4_WF_FP8, 1024, 4096, 133, 0, 1, 0, 1, 0);
        test_linear_mt("expert w1", DSV4_WF_MXFP4, 2048, 4096, 96, 0, 0, 0, 0, 0);
        test_linear_mt("aq", DSV4_WF_MXFP4, 2048, 2048, 130, 0, 1, 0, 0, 0);
        test_linear_mt("", DSV4_WF_MXFP4, 500, 1024, 170, 0, 0, 0, 0, 3);
        test_linear_mt("", DSV4_WF_NVFP4, 1024, 4096, 64, 0, 0, 0, 0, 0);
        test_linear_mt("", DSV4_WF_NVFP4, 300, 1024, 133, 0, 0, 0, 0, 17);
        test_linear_mt("", DSV4_WF_NVFP4, 2048, 4096, 140, 0, 0, 1, 0, 0);
        test_linear_mt("", DSV4_WF_F16, 256, 4096, 150, 0, 0, 0, 0, 0);
        test_linear_mt("", DSV4_WF_F16, 256, 4096, 150, 0, 0, 1, 0, 0);
        test_linear_mt("GEMV kept", DSV4_WF_F32, 24, 2048, 130, 0, 0, 0, 0, 0);
        test_linear_mt("element path kept", DSV4_WF_FP8, 200, 1000, 130, 0, 1, 0, 0, 0);
        mspec wo8[8], b20[20];
        ms_wo_a(wo8, 8), ms_b20(b20);
        g_lwsb = dsv4_cuda_linear_ws_bytes(300, 20 * 4096, 20);
        g_lws = dsv4_cuda_alloc(g_lwsb);
        test_linear_multi("wo_a groups Flash", wo8, 8, 1, 1, 1, 0, 64);
        test_linear_multi("wo_a groups Flash", wo8, 8, 1, 1, 1, 0, 256);
        test_linear_multi("wo_a groups Flash", wo8, 8, 1, 1, 1, 0, 300);
        test_linear_multi("wq_a+wkv", qkv, 2, 0, 0, 0, 0, 128);
        test_linear_multi("wq_a+wkv x:bf16", qkv, 2, 0, 1, 1, 1, 140);
        test_linear_multi("compressors+wproj", cmp, 5, 0, 0, 0, 0, 100);
        test_linear_multi("gate+sw1+sw3", moe3, 3, 0, 0, 1, 0, 133);
        test_linear_multi("act:bf16", nvab, 2, 0, 1, 1, 0, 148);
        test_linear_multi("20 jobs", b20, 20, 0, 1, 1, 0, 130);
        test_linear_multi("mixed", mix, 4, 0, 1, 1, 0, 150);
        dsv4_cuda_free(g_lws);
        g_lws = NULL, g_lwsb = 0;
        if (only_mt) goto checks_done;
    }
    /* the FP8 prefill GEMM (cuBLASLt) at Flash shapes: T = 64 .. 2048, K = 1024 .. 8192, N = 512 .. 32768 */
gemm_checks:
    test_linear_gemm_declines();
    test_linear_gemm("wq_a", 1024, 4096, 64, 0, 0);
    test_linear_gemm("wkv", 512, 4096, 512, 0, 0);
    test_linear_gemm("tail", 2048, 4096, 67, 0, 0);
    test_linear_gemm("wo_a group", 1024, 4096, 130, 1, 1024);
    test_linear_gemm("wq_b", 32768, 1024, 2048, 0, 0);
    test_linear_gemm("wo_b", 4096, 8192, 512, 0, 0);
    test_linear_gemm("shared w1", 2048, 4096, 2048, 0, 0);
    test_linear_gemm("shared w2", 4096, 2048, 1021, 0, 0);
    test_linear_gemm_split("gate", DSV4_WF_BF16, 256, 4096, 130, 0, 0, 0);
    test_linear_gemm_split("compressor", DSV4_WF_BF16, 1024, 4096, 512, 0, 0, 0);
    test_linear_gemm_split("compressor", DSV4_WF_BF16, 1024, 4096, 67, 0, 1, 0);
    test_linear_gemm_split("wo_a group", DSV4_WF_FP8, 1024, 4096, 257, 3072, 0, 1);
    test_linear_gemm_split("wo_a group", DSV4_WF_FP8, 1024, 4096, 64, 0, 1, 1);
    test_linear_gemm_split("wo_a group", DSV4_WF_FP8, 1024, 4096, 96, 1024, 0, 0);
    test_linear_gemm_split("odd", DSV4_WF_BF16, 200, 520, 99, 8, 0, 1);
    if (only_lin) goto checks_done;

    test_rmsnorm(4, 4096, 4096, 1);
    test_rmsnorm(3, 1024, 1024, 1);
    test_rmsnorm(4 * 64, 512, 512, 0);
    test_rmsnorm(5, 1000, 1024, 1);
    test_rope(5, 64, 512, 32, 0);
    test_rope(5, 64, 512, 32, 1);
    test_rope(3, 64, 128, 32, 0);
    test_rope(2, 3, 70, 5, 1);
    test_norm_rope_q8(1, 1, 512, 32, 1, 448, 64);   /* the kv row (Flash) */
    test_norm_rope_q8(7, 1, 512, 32, 1, 448, 64);
    test_norm_rope_q8(3, 64, 512, 32, 0, 0, 0);     /* the query heads */
    test_norm_rope_q8(5, 1, 128, 32, 1, 64, 64);    /* a compressor entry of head dim 128 */
    test_norm_rope_q8(2, 3, 4096, 32, 1, 4032, 128); /* RQ 4 */
    test_norm_rope_q8(2, 2, 70, 5, 1, 60, 32);       /* the unfused fallback (n % 4 != 0) */
    test_norm_rope_h16(3, 64, 512, 32, 0);           /* the prefill attention's q (f16) */
    test_norm_rope_h16(2, 3, 4096, 32, 1);           /* RQ 4 */
    test_norm_rope_h16(5, 2, 136, 4, 1);
    test_norm_rope_h16(4, 5, 136, 3, 1);             /* the first rotated pair in a quad's second half */
    test_norm_rope_h16(3, 7, 512, 32, 1);            /* weighted; rows not a multiple of a block's 8 warps */
    test_rope_hq4(3, 64, 128, 32, 0, 0);  /* the indexer's queries (Flash) */
    test_rope_hq4(1, 64, 128, 32, 0, 0);
    test_rope_hq4(5, 1, 128, 32, 1, 1);   /* an indexer compressor entry */
    test_rope_hq4(37, 64, 128, 32, 0, 0); /* the warp form: a prefill's queries, rows not a multiple of 8 */
    test_rope_hq4(7, 1, 128, 32, 1, 0);   /* the warp form's norm without weights */
    test_rope_hq4(3, 5, 256, 32, 0, 0);   /* the warp form at n 256, 512 */
    test_rope_hq4(2, 3, 512, 64, 0, 0);
    test_rope_hq4(2, 9, 128, 0, 0, 0);    /* no RoPE pairs */
    test_rope_hq4(3, 2, 256, 32, 1, 1);   /* a norm past 128 values: the block form */
    test_rope_hq4(2, 1, 1024, 32, 1, 1);  /* RQ 1 at its widest, 8 KB of doubles */
    test_rope_hq4(2, 2, 4096, 32, 1, 0);  /* past 48 KB of shared memory: the separate kernels */
    test_quant(0, 16, 448, 512, 64);   /* window / compressed keys: first Dh - rope values */
    test_quant(0, 8, 4096, 4096, 128); /* act quant of linear inputs */
    test_quant(0, 3, 1000, 1003, 128);
    test_quant(1, 64, 128, 128, 32); /* indexer */
    test_quant(1, 5, 100, 101, 32);
    test_quant(2, 64, 128, 128, 0);
    test_quant(2, 4, 4096, 4096, 0);
    test_quant(2, 37, 32, 35, 0);      /* the warp-per-row kernel: n 32 .. 512, rows not a multiple of 8, ld > n */
    test_quant(2, 11, 64, 64, 0);
    test_quant(2, 9, 256, 260, 0);
    test_quant(2, 5, 512, 512, 0);
    test_quant(2, 3, 1024, 1024, 0);   /* the block-per-row kernel */
    test_quant(3, 64, 128, 128, 32);
    test_quant(3, 7, 512, 512, 32);

hc_checks:
    test_hc(3, 4, 4096, DSV4_WF_F32, 20);
    test_hc(2, 4, 1000, DSV4_WF_BF16, 3);
    test_hc(1, 3, 64, DSV4_WF_F32, 0);
    test_hc(1, 4, 4096, DSV4_WF_F32, 20); /* Flash shapes: the few-token path, then (T >= 32) the tiled one */
    test_hc(8, 4, 4096, DSV4_WF_F32, 20);
    test_hc(31, 4, 4096, DSV4_WF_F32, 20);  /* the most tokens of the fused post + mixes (hc_post_pre), a partial block */
    test_hc(300, 4, 4096, DSV4_WF_F32, 20);
    test_hc(40, 4, 1000, DSV4_WF_BF16, 3);   /* many tokens, the few-token path (BF16 fn, ragged super-chunk) */
    test_hc(37, 3, 1024, DSV4_WF_F32, 20);   /* tiled path, M 3 (15 rows), a partial token tile */
    if (only_hc) goto checks_done;

    {
        int nv[3] = {640, 200, 0};
        test_attn(3, 64, 512, 3000, 640, nv, 0);
        int nv2[2] = {37, 5};
        test_attn(2, 10, 96, 50, 37, nv2, 0);
        int nv3[1] = {2048};
        test_attn(1, 64, 512, 4096, 2048, nv3, 0);
        int nv4[12] = {128, 100, 1, 128, 64, 0, 128, 128, 77, 128, 128, 3}; /* 4 heads per block */
        test_attn(12, 64, 512, 1000, 128, nv4, 0);
        int nv5[40];
        for (int i = 0; i < 40; i++) nv5[i] = i % 7 ? 128 : 50;
        test_attn(40, 64, 512, 1000, 128, nv5, 0); /* 16 heads per block */
    }
    test_router(7, 256, 6, 0);
    test_router(5, 384, 6, 0);
    test_router(4, 256, 6, 1);
    test_router(3, 37, 5, 0);
    test_swiglu(4, 2048, 2048, 10.0f, 1);
    test_swiglu(3, 1000, 1003, 0.0f, 0);

    /* device-side decode step pieces: top-k, MoE grouping, grouped experts, attention index lists */
topk_checks:
    test_topk(6, 1024, 512, 0);      /* Flash: top-512 of context 4096's entries */
    test_topk(5, 4096, 1024, 0);     /* Pro */
    test_topk(7, 300, 16, 5);        /* exact ties (few levels, many zeros): torch's choice and order */
    test_topk(9, 8, 4, 3);           /* tiny models: 8 entries, top-4, mostly ties */
    test_topk(4, 40000, 64, 3);
    test_topk(3, 50, 64, 0);         /* k > n: every entry, sorted */
    test_topk(6, 3000, 40, 2);       /* k * 64 <= n: torch's partial_sort path, with ties */
    test_topk(256, 2048, 512, 0);    /* batch 256 at 8K (ratio 4), distinct scores: the radix select + sort alone */
    test_topk(4096, 2048, 512, -2);  /* the second 4096-row pass of an 8K prefill: its whole list, the later entries masked */
    test_topk(256, 4096, 1024, -2);  /* Pro-like prefill rows past 2048 causal entries (the fast form's uncached tail) */
    test_topk(5, 4096, 2048, 0);     /* k 2048: the fast form's compaction in two rounds */
    test_topk(256, 2048, 512, 3);    /* batch 256 at 8K (ratio 4), every row tied: the tie path in shared memory */
    test_topk(256, 2048, 512, -1);   /* batch 256 at 8K, pairs of equal values: mostly order ties (the fast path's order) */
    test_topk(7, 3000, 40, -1);
    test_topk(4, 8192, 512, 3);      /* the longest rows it takes; 8193 and more: the scratch (40000 above) */
    test_topk(3, 8193, 512, 3);
    if (only_topk) goto checks_done;
moe_checks:
    /* the router and the grouping in one kernel (T <= 8, E <= 256), and the two launches past it */
    test_moe_route(1, 256, 6, 0);
    test_moe_route(4, 256, 6, 1);
    test_moe_route(8, 256, 6, 0);
    test_moe_route(5, 37, 5, 0);
    test_moe_route(9, 256, 6, 0);
    test_moe_route(3, 384, 6, 0);
    test_moe_group(1, 6, 256, 0);
    test_moe_group(8, 6, 256, 0);
    test_moe_group(256, 6, 256, 0);
    test_moe_group(100, 8, 384, 0);
    test_moe_group(33, 2, 8, 0);
    test_moe_experts("flash", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 0, 0, 3, 6, 8, 4096, 2048);
    test_moe_experts("batch", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 0, 0, 40, 2, 8, 512, 256); /* > 8 rows per expert */
    test_moe_experts("", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 0, 0, 9, 3, 8, 512, 256);
    test_moe_experts("", DSV4_WF_FP8, DSV4_WF_FP8, 1, 0, 5, 2, 6, 512, 384);
    test_moe_experts("", DSV4_WF_BF16, DSV4_WF_BF16, 0, 0, 4, 2, 8, 64, 32);
    test_moe_experts("odd", DSV4_WF_FP8, DSV4_WF_BF16, 1, 0, 6, 2, 5, 200, 72);
    test_moe_experts("T=1", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 0, 0, 1, 6, 32, 1024, 512);
    /* BF16 activations (NVFP4-only / BF16 models) */
    test_moe_experts("", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 0, 1, 9, 3, 8, 512, 256);
    test_moe_experts("batch", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 0, 1, 40, 2, 8, 512, 256);
    test_moe_experts("", DSV4_WF_BF16, DSV4_WF_BF16, 0, 1, 4, 2, 8, 64, 32);
    test_moe_experts("odd", DSV4_WF_FP8, DSV4_WF_BF16, 0, 1, 6, 2, 5, 200, 72);
    test_moe_group(2048, 6, 256, 0);
    test_moe_group(4096, 6, 256, 0); /* the largest group: bitmap + prefix counts in shared memory */
    /* the many-block grouping (the forward's plans carry its scratch): partial last blocks, Pro's experts, 640 experts
     * past the single block's limit, 8 picks */
    test_moe_group(4096, 6, 256, 1);
    test_moe_group(401, 6, 256, 1);
    test_moe_group(2050, 6, 384, 1);
    test_moe_group(4096, 8, 384, 1);
    test_moe_group(3001, 6, 640, 1);
    test_moe_group(8192, 6, 256, 1); /* an 8192-row pass in one group (forward_cuda.c: the whole pass) */
    test_moe_combine(37, 6, 4096, 1);
    test_moe_combine(300, 6, 1024, 0);
    test_moe_combine(5, 9, 2052, 1); /* K past one round of 8; 513 column quads */
    test_moe_combine(3, 2, 70, 1);   /* D % 4 != 0: one column a thread either way */
    test_moe_group_limit();
    /* tensor cores: act quant at decode sizes (8 / 16 tokens a chunk) and on the pre-quantized 64-token path (>= 16
     * rows per expert on average; more than 64 rows: several chunks), every format */
    test_moe_experts("T=1 aq", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 1, 6, 32, 4096, 2048);
    test_moe_experts("T=12 aq", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 12, 6, 16, 1024, 512);
    test_moe_experts("pq", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 160, 2, 8, 512, 256);
    test_moe_experts("pq flash", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 48, 2, 4, 4096, 2048);
    test_moe_experts("pq chunks", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 300, 2, 4, 512, 512);
    test_moe_experts("pq", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 1, 0, 100, 2, 4, 1024, 512);
    test_moe_experts("pq", DSV4_WF_FP8, DSV4_WF_FP8, 1, 0, 100, 2, 4, 512, 512);
    test_moe_experts("T=16", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 1, 0, 16, 3, 8, 1024, 512);
    test_moe_experts("T=12", DSV4_WF_FP8, DSV4_WF_FP8, 1, 0, 12, 3, 8, 1024, 512);
    test_moe_invariant("pq", DSV4_WF_MXFP4, 1, 200, 6, 16, 1024, 512);
    /* prefill sizes with unit counts that are not a multiple of 4 (NU 3 / 5 / 6 / 2): the decode ring at many tokens an
     * expert (not the pre-quantized path, which needs NU % 4 == 0) */
    test_moe_experts("pf", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 2048, 6, 256, 384, 256);
    test_moe_experts("pf chunks", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 700, 6, 32, 640, 384);
    test_moe_invariant("pf", DSV4_WF_MXFP4, 1, 300, 6, 16, 768, 768);
    /* the MXFP4 prefill pipeline (moe_pf2_kernel on wgmma: NU % 4 == 0 and S <= 2, i.e. Flash's widths): ~175 tokens an
     * expert (chunks of 64, 64 and a rest), gate/up and down, against the register kernels and tokens alone (the ring);
     * "pq flash" above has one partial chunk an expert; moebench compares it with every other kernel at Flash's E */
    test_moe_invariant("pf flash", DSV4_WF_MXFP4, 1, 700, 2, 8, 4096, 2048);
    test_moe_invariant("pf flash", DSV4_WF_NVFP4, 1, 700, 2, 8, 4096, 2048); /* NVFP4 on the same pipeline */
    test_moe_experts("pf flash", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 1, 0, 700, 2, 8, 4096, 2048);
    test_moe_invariant("decode", DSV4_WF_MXFP4, 1, 12, 6, 16, 1024, 512);
    /* decode with many expert slots (the ring kernels at a large batch) */
    test_moe_invariant("decode, many experts", DSV4_WF_MXFP4, 1, 64, 6, 256, 2048, 1024);
    test_moe_invariant("decode, many experts", DSV4_WF_NVFP4, 0, 64, 6, 256, 2048, 1024);
    test_moe_invariant("", DSV4_WF_MXFP4, 0, 40, 2, 8, 512, 256);
    test_moe_invariant("pq", DSV4_WF_NVFP4, 1, 200, 6, 16, 1024, 512);
    test_moe_invariant("pq", DSV4_WF_FP8, 1, 200, 6, 16, 512, 512);
    /* the FP8 experts path (opt in: other numerics): 8-, 16- and 32-token chunks, x quantized by the blocks or once */
    test_moe_f8(1, 6, 32, 4096, 2048);
    test_moe_f8(8, 6, 16, 4096, 2048);
    test_moe_f8(40, 6, 16, 1024, 512);
    test_moe_f8(2, 6, 8, 7168, 3072); /* Pro's widths */
    test_moe_f8(1, 6, 8, 7168, 3072); /* Pro's widths, one token: its x staged as one row (X1) */
    test_moe_f8(1, 2, 8, 256, 128);   /* X1 with 2 and 1 units */
    test_moe_f8(200, 6, 16, 1024, 512); /* 32-token chunks (prefill sizes) */
    test_moe_f8(64, 6, 8, 4096, 2048);
    test_moe_f8(80, 6, 64, 4096, 2048); /* 8-token chunks with x quantized per row (the decode of batch 16-85 and 256): a
                                          * third of the experts past 8 tokens, their chunks over 2 blocks, scale groups */
    test_moe_f8(8, 2, 8, 256, 256); /* the unseen-shape models' widths: 2 units, 1 a slice */
    test_moe_f8(96, 2, 8, 256, 128);
    test_moe_f8(48, 6, 64, 1024, 512); /* 8-token chunks at small widths (the down projection on two row tiles: 8 of them) */
    test_moe_f8(16, 6, 64, 7168, 3072); /* Pro's widths at 8-token chunks */
pfb_checks:
    /* the prefill pass's experts on BF16 tensor cores (moe_bf16.cuh): several chunks of 128 tokens an expert, partial ones,
     * Flash's widths (a sample of the slots against the CPU), scales above 2^1; (T2: the first tokens alone, still >= 32 an
     * expert on average so that they take these kernels too) */
    test_moe_pfb(DSV4_WF_MXFP4, 512, 6, 16, 1024, 512, 1, 0, 200);
    test_moe_pfb(DSV4_WF_MXFP4, 300, 2, 16, 512, 256, 1, 1, 256);
    test_moe_pfb(DSV4_WF_MXFP4, 400, 6, 64, 4096, 2048, 13, 0, 380);
    test_moe_pfb(DSV4_WF_NVFP4, 512, 6, 16, 1024, 512, 1, 0, 200);
    test_moe_pfb(DSV4_WF_NVFP4, 300, 2, 16, 512, 256, 1, 1, 256);
    test_moe_pfb(DSV4_WF_NVFP4, 300, 2, 16, 512, 256, 1, 2, 256); /* every scale of expert 0 at an end of E4M3 */
    test_moe_pfb(DSV4_WF_NVFP4, 400, 6, 64, 4096, 2048, 13, 0, 380);
    /* Pro's widths (D 7168, I 3072: 56 and 24 units, other n-group counts) in both formats */
    test_moe_pfb(DSV4_WF_MXFP4, 200, 6, 32, 7168, 3072, 23, 0, 176);
    test_moe_pfb(DSV4_WF_NVFP4, 200, 6, 32, 7168, 3072, 23, 0, 176);
pf8_checks:
    /* the same on FP8 tensor cores with a promotion per 128 columns (moe_f8p.cuh; widths multiples of 512) */
    test_moe_pf8(512, 6, 16, 1024, 512, 1, 0, 200);
    test_moe_pf8(300, 2, 16, 512, 1024, 1, 1, 256);
    test_moe_pf8(300, 2, 16, 512, 512, 1, 2, 256);
    test_moe_pf8(400, 6, 64, 4096, 2048, 13, 0, 380);
    test_moe_pf8(200, 6, 32, 7168, 3072, 23, 0, 176);
    /* ~770 tokens an expert: full and partial second chunks, several 256-token super chunks a block (SC, form 5) */
    test_moe_pf8(1024, 6, 8, 512, 512, 3, 0, 512);
    if (only_moe) goto checks_done;
    {
        int p0a[4] = {0, 5, 300, 0}, na[4] = {3, 1, 1, 0}; /* decode-like: ring + own rows */
        test_attn_index(4, 8, 4, 16, p0a, na);
        test_attn_index(4, 8, 128, 16, p0a, na);
        test_attn_index(4, 8, 0, 16, p0a, na);
        int p0b[3] = {10, 0, 0}, nb[3] = {40, 17, 0}; /* prefill chunks longer than the window */
        test_attn_index(3, 16, 4, 32, p0b, nb);
        test_attn_index(3, 16, 16, 32, p0b, nb);
        int p0c[5] = {0, 7, 300, 4095, 0}, nc[5] = {1, 1, 1, 1, 0}; /* decode: one row per slot, Flash head_dim */
        test_ring_store(5, 128, 512, 64, p0c, nc);
        int p0d[3] = {10, 0, 5}, nd[3] = {40, 17, 3}; /* prefill chunks longer and shorter than the window */
        test_ring_store(3, 16, 512, 64, p0d, nd);
        test_ring_store(3, 16, 192, 64, p0d, nd); /* two 64-blocks */
        test_ring_store(3, 8, 704, 128, p0d, nd); /* more 64-blocks than warps */
        /* the compressor over passes that cut windows anywhere (decode-like single rows, chunks shorter and longer
         * than a window, a long pass): CSA (m 4, overlap), HCA (m 128), the indexer's (m 4, d 128) */
        const int cuts[] = {1, 3, 1, 1, 6, 9, 1, 40, 2, 300, 1, 5};
        test_cmp_batch(4, 512, 1, cuts, 12);
        test_cmp_batch(4, 128, 1, cuts, 12);
        test_cmp_batch(128, 512, 0, cuts, 12);
        test_cmp_batch(8, 64, 0, cuts, 12);
        test_cmp_batch(3, 96, 1, cuts, 12);
    }

checks_done:
    printf("%d checks, %d failed\n", g_checks, g_fail);

    if (bench && only_moe) {
        bench_copy();
        bench_moe();
    } else if (bench) {
        /* Flash (dim 4096, q_lora 1024, 64 x 512 heads, expert 2048) and Pro (dim 7168, q_lora 1536, 128 heads,
         * expert 3072) decode shapes; FP4 experts take 1..8 rows each */
        static const int T16[6] = {1, 2, 4, 8, 12, 16}, T8[4] = {1, 2, 4, 8}, T1[2] = {1, 4};
        static const int TP[2] = {512, 2048};
        if (only_hc) {
            bench_hc(1), bench_hc(8), bench_hc(2048);
            return g_fail ? 1 : 0;
        }
        if (only_gemm) goto gemm_bench;
        if (only_mt) { /* Flash's linears at batch 32 .. 256 (decode): GEMV against the multi-token GEMM */
            static const int TM[4] = {32, 64, 128, 256};
            bench_mt("head Flash", DSV4_WF_BF16, 129280, 4096, 0, 1, TM, 4);
            bench_mt("wo_a groups Flash", DSV4_WF_FP8, 1024, 4096, 1, 8, TM, 4);
            bench_mt("wo_a groups Flash, fp32 x", DSV4_WF_FP8, 1024, 4096, 0, 8, TM, 4);
            bench_mt("wo_b Flash", DSV4_WF_FP8, 4096, 8192, 1, 1, TM, 4);
            bench_mt("wq_b Flash", DSV4_WF_FP8, 32768, 1024, 1, 1, TM, 4);
            bench_mt("gate Flash", DSV4_WF_BF16, 256, 4096, 0, 1, TM, 4);
            bench_mt("shared w2 Flash", DSV4_WF_FP8, 4096, 2048, 1, 1, TM, 4);
            return g_fail ? 1 : 0;
        }
        bench_copy();
        {
            mspec wo8[16];
            ms_wo_a(wo8, 16);
            const mspec sw[2] = {{DSV4_WF_FP8, 2048, 4096, 1, 0, 0}, {DSV4_WF_FP8, 2048, 4096, 1, 0, 0}};
            bench_linear_multi("wo_a 8 groups Flash", wo8, 8, 1, 1, 1);
            bench_linear_multi("wo_a 8 groups Flash", wo8, 8, 1, 1, 8);
            {
                mspec wx[16];
                ms_wo_a_x32(wx, 16);
                bench_linear_multi("wo_a 8 groups Flash, fp32 x", wx, 8, 1, 1, 1);
                bench_linear_multi("wo_a 8 groups Flash, fp32 x", wx, 8, 1, 1, 8);
                bench_linear_multi("wo_a 16 groups Pro, fp32 x", wx, 16, 1, 1, 1);
            }
            bench_linear_multi("wo_a 16 groups Pro", wo8, 16, 1, 1, 1);
            bench_linear_multi("wq_a+wkv Flash", qkv, 2, 0, 0, 1);
            bench_linear_multi("wq_a+wkv Flash", qkv, 2, 0, 0, 8);
            bench_linear_multi("cmp+idx cmp+wproj Flash", cmp, 5, 0, 0, 1);
            bench_linear_multi("cmp wkv+wgate Flash c4", cmp, 2, 0, 0, 1);
            bench_linear_multi("shared w1+w3 Flash", sw, 2, 0, 0, 1);
            bench_linear_multi("shared w1+w3 Flash", sw, 2, 0, 0, 8);
        }
        if (only_multi) { /* the single linears the grouped ones replace, for comparison with older builds */
            bench_linear("wq_a Flash", DSV4_WF_FP8, 1024, 4096, T16, 6, 1);
            bench_linear("wkv Flash", DSV4_WF_FP8, 512, 4096, T8, 4, 1);
            bench_linear("wo_b Flash", DSV4_WF_FP8, 4096, 8192, T16, 6, 1);
            bench_linear("shared w1/w3 Flash", DSV4_WF_FP8, 2048, 4096, T8, 4, 1);
            bench_linear("expert w1 Flash", DSV4_WF_MXFP4, 2048, 4096, T8, 4, 0);
            bench_linear("head-like", DSV4_WF_BF16, 4096, 4096, T1, 2, 0);
            return g_fail ? 1 : 0;
        }
        bench_linear("wq_b Flash", DSV4_WF_FP8, 32768, 1024, T16, 6, 1);
        bench_linear("wq_a Flash", DSV4_WF_FP8, 1024, 4096, T16, 6, 1);
        bench_linear("wkv Flash", DSV4_WF_FP8, 512, 4096, T8, 4, 1);
        bench_linear("wo_b Flash", DSV4_WF_FP8, 4096, 8192, T16, 6, 1);
        bench_linear("shared w1/w3 Flash", DSV4_WF_FP8, 2048, 4096, T8, 4, 1);
        bench_linear("shared w2 Flash", DSV4_WF_FP8, 4096, 2048, T8, 4, 1);
        bench_linear("wq_b Pro", DSV4_WF_FP8, 65536, 1536, T16, 6, 1);
        bench_linear("wo_b Pro", DSV4_WF_FP8, 7168, 16384, T8, 4, 1);
        bench_linear("expert w1 Flash", DSV4_WF_MXFP4, 2048, 4096, T8, 4, 0);
        bench_linear("expert w2 Flash", DSV4_WF_MXFP4, 4096, 2048, T8, 4, 0);
        bench_linear("expert w1 Flash", DSV4_WF_NVFP4, 2048, 4096, T8, 4, 0);
        bench_linear("expert w1 Pro", DSV4_WF_MXFP4, 3072, 7168, T8, 4, 0);
        bench_linear("8 experts w1 stacked", DSV4_WF_MXFP4, 16384, 4096, T8, 4, 0);
        bench_linear("head Flash", DSV4_WF_BF16, 129280, 4096, T1, 2, 0);
        bench_linear("hc fn Flash", DSV4_WF_F32, 24, 16384, T1, 1, 0);
        bench_hc(1), bench_hc(8), bench_hc(2048);
        bench_linear("prefill", DSV4_WF_FP8, 4096, 4096, TP, 2, 1);
        bench_linear("prefill wq_b Flash", DSV4_WF_FP8, 32768, 1024, TP + 1, 1, 1);
        bench_linear("prefill", DSV4_WF_MXFP4, 2048, 4096, TP, 1, 0);
    gemm_bench:
        bench_linear_gemm("", 4096, 4096, 512);
        bench_linear_gemm("", 4096, 4096, 2048);
        bench_linear_gemm("wq_a Flash", 1024, 4096, 1024);
        bench_linear_gemm("wq_b Flash", 32768, 1024, 1024);
        bench_linear_gemm("wq_b Flash", 32768, 1024, 2048);
        bench_linear_gemm("wkv Flash", 512, 4096, 1024);
        bench_linear_gemm("wo_b Flash", 4096, 8192, 1024);
        bench_linear_gemm("shared w1 Flash", 2048, 4096, 1024);
        bench_linear_gemm("shared w2 Flash", 4096, 2048, 1024);
        bench_linear_gemm("wq_b Pro", 65536, 1536, 2048);
        if (!only_lin) {
            int nv[1] = {640}, nv8[8] = {640, 640, 640, 640, 640, 640, 640, 640};
            test_attn(1, 64, 512, 100000, 640, nv, 1);
            test_attn(8, 64, 512, 100000, 640, nv8, 1);
        }
    }
    return g_fail ? 1 : 0;
}
