#!/bin/sh
# device_run.sh - bench/RESULTS.md's standard commands for one device call, so that none is forgotten (Pro's prefill
# went unrun for eight sessions and had broken meanwhile). Each part's output goes to DIR/PART.txt (DIR: $OUT when
# the device tool sets it, else ./device-run), and a summary line per run to stdout.
#   sh bench/device_run.sh [PART...]     PART: suite attn flash pro hf profile trace ncusrc nvfp4 serve ab abdec abcheck chain
#                                        mf8trace branch allsw
#                                        switch (default: flash pro)
#     suite  scripts/gpu_test.sh --no-bench (BUILD=build-dev, DSV4_DEPS=build-gfw-deps when present; ~260 s with
#            the build; with build-bin/gpu-bins.tar.xz from scripts/gpu_bins.sh carried, its binaries and no build)
#     attn   tests/gpu/test_attn_kv8's tensor-core paths with their timings: --only-tc (prefill passes, the prefill and
#            decode forms) and --only-dec (decode shapes, long lists) (~60 s; needs the suite's build or the pack)
#     flash  Flash, 4 layers: batch 1, 8, 64 at 4K with the 8K prefill; batch 256 at 8K; batch 1 at 64K (~60 s)
#     pro    Pro, 3 layers: batch 1, 8 at 4K with the 8K prefill (~60 s; a 45.6 GB checkpoint in /dev/shm, kept)
#     hf     Hugging Face transformers' DeepSeek-V4 (bench/hf_bench.py) against dsv4 bench on the same Flash layers
#            (HF_LAYERS, default 4): batch 1, 8 at 4K and a 2,048-token prefill, HF time / dsv4 time (issue 5 item 3)
#     profile  op profiles (`--profile`) of the Flash 8K prefill (4 layers) and of a batch-256 step at 8K (~40 s)
#     trace  the GPU's own kernel timelines (`--trace`, CUPTI): Flash 4 layers, the 8K prefill with batch 1 at 4K, then
#            batch 256 at 8K; bench/trace_report.py's tables (median replay, kernels by solo time, batch 1's timeline)
#     nvfp4  Flash 4 layers and Pro 3 layers with NVFP4 experts: batch 1, 8 at 4K with the 8K prefill (checkpoints
#            removed afterwards)
#     serve  dsv4 serve --device cuda on the Flash 4-layer synthetic checkpoint, loaded by bench/serve_load.py with 1,
#            64 and 256 clients (1,024-token prompts, 128-256 output tokens); SERVE_ARGS adds serve options (~2 min)
#     ab     the Flash 8K prefill (4 layers) under each setting of AB="name=VAR=v[,VAR=v] ..." (a bare name: the
#            defaults; name=@BINARY[,VAR=v...]: another dsv4, e.g. build-bin/dsv4-prev), interleaved by bench/ab.sh, 2 rounds
#     abdec  decode steps (Flash 4 layers, batch 1, 8, 64, 256 at 4K) under each setting of AB as in ab, 2 rounds
#     abcheck  each setting of AB: test_decode (fixtures, a synthetic model; this build's settings only) and a greedy
#            run's text against the first setting's
#     chain  test_kernels --only multi: the grouped linears' and the linear chains' checks, then their timings (chain
#            against the separate calls: "time linear chain" / "time linear route" lines; session 36) (~60 s)
#     mf8trace  the routed experts' clock trace (s38-mf8trace's -DDSV4_MF8_TRACE build of test_kernels, packed as
#            build-bin/test_kernels-mf8trace.xz: NOTES "Session 38 summary"): `--only moebench`, its "trace mf8" tables
#            (T = 1, 8 and 256)
#     ncusrc Nsight Compute's source page of the 8K prefill's kernels named by NCU_KERNELS (regexes, default
#            "attn_kv8_wg_kernel mb_kernel topk_kernel"; NCU_COUNT launches each, default 4): `ncu --set full`, the
#            page as CSV (xz) and bench/ncu_source.py's summary of every launch (~50 s a kernel; session 52 found the
#            attention's serial copy loop this way)
#     branch each NAME of BR="NAME ..." (its binaries NAME/build-dev/..., scripts/branch_bins.sh's build-bin/branches.tar.xz)
#            against main's pack: test_attn_kv8 $BR_KV8 (default --only-tc: the prefill attention; "" runs it all, the
#            indexer's checks and timings too: ~2 min a binary) (every non-timing line must be main's: bitwise), a greedy
#            `dsv4 run` on a synthetic model (the same text), the attention's clock traces of the 8K prefill
#            (DSV4_ATTN_WG_TRACE, bench/wa_trace.py: cycles a tile by phase, each call); then `ab` with
#            AB="main NAME=@NAME/build-dev/dsv4 ..." times them (~40 s a branch)
#     allsw  the suite with every session-28/29 switch exported as 1, the two off by default too (DSV4_MOE_PFB_XTOK,
#            DSV4_LINEAR_TERMS_CAT; into DIR/allsw/)
#     switch the Flash 8K prefill (4 layers), interleaved by bench/ab.sh (2 rounds, ~120 s): the defaults, every
#            session-28/29 prefill switch that is on by default (session 30) off, each alone off, the two off by
#            default on, and 4096-row passes (DSV4_CUDA_TMAX=4096; the default is 8192 where it fits, session 30)
# DSV4=path picks the binary (default build-dev/dsv4, else build-cuda/dsv4). Exit status 1 if a part failed; 3 with
# DEVRUN_REQUIRE_PACK=1 when build-bin/gpu-bins.tar.xz is missing or not this tree's code (src, tests, include, Makefile).
set -u
parts=${*:-flash pro}
dir=${OUT:-device-run}
mkdir -p "$dir"
export TMPDIR="${TMPDIR:-/dev/shm}"
if [ -d build-gfw-deps ]; then
    deps=$(cd build-gfw-deps && pwd)
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
bin=${DSV4:-}
# binaries built elsewhere (scripts/gpu_bins.sh): unpacked over build-dev for every part (a warm machine may still hold
# an older build there). Which code they are is said first: the pack's commit against this tree's HEAD (the device tool
# copies the repository root's working tree, so a pack made in another checkout or worktree is not carried: session 35's
# first call ran the old code that way, and built it on the device). DEVRUN_REQUIRE_PACK=1: no pack, or a pack whose
# src, tests, include or Makefile differ from HEAD's, is an error (exit 3) instead of a note.
head=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -f build-bin/gpu-bins.tar.xz ]; then
    pc=$(head -n 1 build-bin/gpu-bins.commit 2>/dev/null || echo unknown)
    # the files' digest first (scripts/gpu_bins.sh): it holds even where this copy's .git lags behind its working tree
    tsum=$(find src tests include Makefile -type f | LC_ALL=C sort | xargs cat | md5sum | cut -c1-32)
    if [ -f build-bin/gpu-bins.tree ] && [ "$(cat build-bin/gpu-bins.tree)" = "$tsum" ]; then
        echo "device_run: pack of $pc: built from this tree's src, tests, include and Makefile (digest $tsum)"
    elif [ -f build-bin/gpu-bins.tree ]; then
        echo "device_run: pack of $pc: built from other files than this tree's src, tests, include and Makefile"
        [ "${DEVRUN_REQUIRE_PACK:-0}" = 1 ] && exit 3
    elif [ "$pc" = "$head" ]; then
        echo "device_run: pack of $pc (HEAD)"
    elif git diff --quiet "$pc" HEAD -- src tests include Makefile 2>/dev/null; then
        echo "device_run: pack of $pc: src, tests, include and Makefile as at HEAD ($head)"
    else
        echo "device_run: pack of $pc, HEAD is $head: the binaries are not this tree's code"
        [ "${DEVRUN_REQUIRE_PACK:-0}" = 1 ] && exit 3
    fi
else
    echo "device_run: no pack (build-bin/gpu-bins.tar.xz): the suite builds here (~150 s more); HEAD $head"
    [ "${DEVRUN_REQUIRE_PACK:-0}" = 1 ] && exit 3
fi
if [ -z "$bin" ] && [ -f build-bin/gpu-bins.tar.xz ]; then
    tar xJf build-bin/gpu-bins.tar.xz && export GPU_TEST_PREBUILT=1
fi
# other branches' binaries (scripts/branch_bins.sh): NAME/build-dev/dsv4 etc., for AB="main NAME=@NAME/build-dev/dsv4"
if [ -f build-bin/branches.tar.xz ]; then
    tar xJf build-bin/branches.tar.xz && echo "device_run: branches: $(tar tJf build-bin/branches.tar.xz | grep '/dsv4$' | tr '\n' ' ')"
fi
# a previous commit's dsv4 for A/B runs between binaries (AB="new prev=@build-bin/dsv4-prev"; build-bin/dsv4-prev.commit)
if [ -f build-bin/dsv4-prev.xz ]; then xz -dc build-bin/dsv4-prev.xz >build-bin/dsv4-prev && chmod +x build-bin/dsv4-prev; fi
if [ -z "$bin" ]; then
    if [ -x build-dev/dsv4 ]; then bin=build-dev/dsv4; else bin=build-cuda/dsv4; fi
fi
fail=0

# one `dsv4 bench` run: its tables into the part's file, the step / prefill lines to stdout
run() {
    part=$1
    shift
    echo "== $part: dsv4 bench $*" | tee -a "$dir/$part.txt"
    if ! timeout 300 "$bin" bench "$@" >>"$dir/$part.txt" 2>>"$dir/$part.err"; then
        echo "$part: dsv4 bench $* failed: $(tail -n 1 "$dir/$part.err")"
        fail=1
    fi
    grep -E '^prefill|^ +[0-9]+ +[0-9]+ \|' "$dir/$part.txt" | tail -n 4
}

# the synthetic model of abcheck's and branch's greedy runs ($TMPDIR/dsv4-synth, made once by `dsv4 synth`); 1 if it fails
synth_model() {
    [ -f "$TMPDIR/dsv4-synth/config.json" ] || "$bin" synth -o "$TMPDIR/dsv4-synth" >/dev/null 2>"$dir/synth.err" ||
        { echo "$1: dsv4 synth failed: $(tail -n 1 "$dir/synth.err")"; fail=1; return 1; }
}
# a greedy `dsv4 run --device cuda` of 24 tokens on that model by binary $1 (under the env list GENV), its text in
# $OUTF -> rr (exit status; ", no text" appended when it wrote none) and sum (the text's md5, 8 digits)
greedy() {
    # shellcheck disable=SC2086
    env ${GENV:-X=1} timeout 60 "$1" run -m "$TMPDIR/dsv4-synth" --device cuda -p "The quick brown fox" --temperature 0 \
        --max-tokens 24 --ignore-eos -q >"$OUTF" 2>"$OUTF.err"
    rr=$?
    [ -s "$OUTF" ] || rr="$rr, no text" # a failure even with exit 0
    sum=$(md5sum <"$OUTF" | cut -c1-8)
}

# one setting of $AB: "name" (the defaults), "name=VAR=v[,VAR=v...]", or "name=@BINARY[,VAR=v...]" (another dsv4, e.g.
# build-bin/dsv4-prev, unpacked above) -> n (its name), b (the binary), v (the VAR=v list with commas, or empty)
ab_setting() {
    n=${1%%=*} v=${1#*=} b=$bin
    [ "$n" = "$1" ] && v=""
    case $v in @*) b=${v#@} b=${b%%,*} v=${v#@"$b"} v=${v#,} ;; esac
}

# ab / abdec: the Flash 4-layer bench (the given arguments) under each setting of $AB ("name=VAR=v[,VAR=v] ..."; the first
# is the reference; a bare name runs the defaults), interleaved by bench/ab.sh (2 rounds); PART.txt, its last N lines shown
ab_part() {
    part=$1 nl=$2
    shift 2
    vs=""
    for a in ${AB:-default}; do
        ab_setting "$a"
        if [ -z "$v" ]; then vs="$vs $n=$b"; else vs="$vs $n=$b,$v"; fi
    done
    echo "== $part: bench/ab.sh -r 2$vs" | tee -a "$dir/$part.txt"
    # shellcheck disable=SC2086
    AB_DIR="$dir/$part" timeout 560 sh bench/ab.sh -r 2 $vs -- --synthetic flash --layers 4 "$@" --keep >>"$dir/$part.txt" 2>&1 ||
        { echo "$part: ab.sh failed"; fail=1; }
    tail -n "$nl" "$dir/$part.txt"
}

for p in $parts; do
    case $p in
    suite)
        if [ -f build-bin/gpu-bins.tar.xz ]; then # binaries built elsewhere (scripts/gpu_bins.sh): no build here
            [ -n "${GPU_TEST_PREBUILT:-}" ] || tar xJf build-bin/gpu-bins.tar.xz
            export GPU_TEST_PREBUILT=1
            echo "suite: prebuilt binaries of $(head -n 1 build-bin/gpu-bins.commit 2>/dev/null)"
        fi
        # the BF16 experts' checks first (~1-2 min), on a leash: a hang of a form with new barriers (the producer warpgroup)
        # would otherwise hold the suite to its timeout; if it hangs, the suite and 'switch' run without that form
        if [ -x build-dev/tests/gpu/test_kernels ] && [ "${DEVRUN_PFB_FIRST:-1}" != 0 ]; then
            timeout 300 build-dev/tests/gpu/test_kernels --no-bench --only pfb >"$dir/pfb.txt" 2>&1
            rc=$?
            grep -E 'FAIL|passed|checks,' "$dir/pfb.txt" | tail -n 6
            if [ "$rc" = 124 ]; then
                echo "suite: test_kernels --only pfb timed out: the producer form is left out from here on"
                export DSV4_TEST_PFB_NOPROD=1 DSV4_MOE_PFB_PRODUCER=0
                : >"$dir/pfb-hang"
            fi
        fi
        # the linear chains' checks next (their blocks wait for each other at grid-wide barriers; session 36, unrun until
        # then), on a leash too: a hang leaves them out of the suite (DSV4_TEST_NOCHAIN=1) and of the forward (the
        # chains are off by default); only where test_kernels has them
        if [ -x build-dev/tests/gpu/test_kernels ] && grep -q DSV4_TEST_NOCHAIN build-dev/tests/gpu/test_kernels; then
            timeout 120 build-dev/tests/gpu/test_kernels --only chain >"$dir/chain-checks.txt" 2>&1
            rc=$?
            grep -E 'FAIL|checks,' "$dir/chain-checks.txt" | tail -n 8
            if [ "$rc" = 124 ]; then
                echo "suite: test_kernels --only chain timed out: the chain checks are left out from here on"
                export DSV4_TEST_NOCHAIN=1
                : >"$dir/chain-hang"
            fi
        fi
        if [ -n "${deps:-}" ]; then
            BUILD=build-dev DSV4_DEPS=build-gfw-deps timeout 560 sh scripts/gpu_test.sh --no-bench >"$dir/suite.txt" 2>&1
        else
            BUILD=build-dev timeout 560 sh scripts/gpu_test.sh --no-bench >"$dir/suite.txt" 2>&1
        fi
        rc=$?
        grep -E 'FAIL|all passed|checks,|scenarios|passed,' "$dir/suite.txt" | tail -n 12
        echo "suite: exit $rc"
        [ "$rc" = 0 ] || fail=1
        if [ -z "${DSV4:-}" ] && [ -x build-dev/dsv4 ]; then bin=build-dev/dsv4; fi
        ;;
    attn)
        ta=build-dev/tests/gpu/test_attn_kv8
        [ -x "$ta" ] || ta=build-cuda/tests/gpu/test_attn_kv8
        for m in --only-tc --only-dec; do
            echo "== attn: test_attn_kv8 $m" | tee -a "$dir/attn.txt"
            timeout 200 "$ta" $m >>"$dir/attn.txt" 2>&1 || { echo "attn: test_attn_kv8 $m failed"; fail=1; }
        done
        grep -E 'FAIL|time attn|passed' "$dir/attn.txt" | sed 's/ (64 x 512)//; s/of the tolerance/tol/' | cut -c1-170
        ;;
    flash)
        F="--synthetic flash --layers 4"
        run flash $F --batch 1,8,64 --context 4096 --prompt 8192 --steps 10 --keep
        run flash $F --batch 256 --context 8192 --prompt 0 --steps 3 --replays 20 --keep
        run flash $F --batch 1 --context 65536 --prompt 0 --steps 10 --keep
        ;;
    pro)
        run pro --synthetic pro --layers 3 --batch 1,8 --context 4096 --prompt 8192 --steps 10 --keep
        ;;
    hf)
        # issue 5 item 3: Hugging Face transformers' DeepSeek-V4 (the device image's torch / transformers; bf16 weights,
        # eager: bench/hf_bench.py's docstring says what it can not run) on the same synthetic layers as a dsv4 bench run
        # of the same shapes, and the ratios HF time / dsv4 time (RESULTS session 8: 2 layers, 28.5x at batch 1).
        # HF_LAYERS (default 4: the four layer kinds; ~60 GB of bf16 weights, an H200's; 2 fits an H100)
        H="--synthetic flash --layers ${HF_LAYERS:-4} --batch 1,8 --context 4096 --prompt 2048"
        run hf $H --steps 20 --keep --json-file "$dir/hf-dsv4.json"
        echo "== hf: python3 bench/hf_bench.py $H --steps 20 --compare $dir/hf-dsv4.json" | tee -a "$dir/hf.txt"
        # shellcheck disable=SC2086
        if ! PYTHONUNBUFFERED=1 timeout 560 python3 bench/hf_bench.py $H --steps 20 --compare "$dir/hf-dsv4.json" \
            --json-file "$dir/hf.json" >>"$dir/hf.txt" 2>&1; then
            echo "hf: bench/hf_bench.py failed: $(tail -n 1 "$dir/hf.txt")"
            fail=1
        fi
        sed -n '/^dsv4 (/,$p' "$dir/hf.txt"
        ;;
    profile)
        P="--synthetic flash --layers 4 --keep --profile"
        run profile $P --batch 1 --context 4096 --prompt 8192 --steps 1
        run profile $P --batch 256 --context 8192 --prompt 0 --steps 1
        ;;
    trace)
        F="--synthetic flash --layers 4 --keep"
        run trace $F --batch 1 --context 4096 --prompt 8192 --steps 3 --replays 20 --trace "$dir/trace-b1.txt"
        run trace $F --batch 256 --context 8192 --prompt 0 --steps 2 --replays 10 --trace "$dir/trace-b256.txt"
        for f in "$dir/trace-b1.txt" "$dir/trace-b256.txt"; do
            [ -s "$f" ] || { echo "trace: no $f ($(tail -n 1 "$dir/trace.err"))"; fail=1; continue; }
            python3 bench/trace_report.py "$f" --timeline --top 30 >>"$dir/trace.txt" 2>&1 || fail=1
        done
        grep -E '^==|span|replay spans' "$dir/trace.txt"
        ;;
    ncusrc)
        command -v ncu >/dev/null || PATH="$PATH:/usr/local/cuda/bin"
        for k in ${NCU_KERNELS:-attn_kv8_wg_kernel mb_kernel topk_kernel}; do
            rep="$dir/ncu-$k"
            echo "== ncusrc: ncu --set full -k regex:$k -c ${NCU_COUNT:-4}" | tee -a "$dir/ncusrc.txt"
            if ! timeout 240 ncu -k "regex:$k" -c "${NCU_COUNT:-4}" --set full --import-source no -o "$rep" "$bin" bench \
                --synthetic flash --layers 4 --batch 1 --context 4096 --prompt 8192 --steps 1 --replays 1 \
                >"$rep.log" 2>&1 || [ ! -f "$rep.ncu-rep" ]; then
                echo "ncusrc: ncu $k failed: $(tail -n 1 "$rep.log")"
                fail=1
                continue
            fi
            ncu --import "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>>"$rep.log"
            n=$(grep -c '^"Kernel Name"' "$rep.csv")
            i=0
            while [ "$i" -lt "$n" ]; do
                python3 bench/ncu_source.py "$rep.csv" --kernel "$i" --top 10 >>"$dir/ncusrc.txt" 2>&1
                i=$((i + 1))
            done
            xz -9 -f "$rep.csv" && rm -f "$rep.ncu-rep"
        done
        grep -E '^==|^stall reasons|SASS lines' "$dir/ncusrc.txt"
        ;;
    nvfp4)
        run nvfp4 --synthetic flash --layers 4 --experts nvfp4 --batch 1,8 --context 4096 --prompt 8192 --steps 10
        run nvfp4 --synthetic pro --layers 3 --experts nvfp4 --batch 1,8 --context 4096 --prompt 8192 --steps 10
        ;;
    serve)
        # dsv4 serve on the Flash 4-layer synthetic checkpoint (made by `flash` or here) with the tokenizer of the
        # fixtures, under bench/serve_load.py: one client, then 64 and 256 at once (1,024-token prompts)
        ck=$(ls -d "$TMPDIR"/dsv4-bench-flash-4L-mxfp4-* 2>/dev/null | head -n 1)
        if [ -z "$ck" ]; then
            run serve --synthetic flash --layers 4 --batch 1 --context 4096 --prompt 0 --steps 2 --keep
            ck=$(ls -d "$TMPDIR"/dsv4-bench-flash-4L-mxfp4-* 2>/dev/null | head -n 1)
        fi
        if [ -z "$ck" ] || ! cp tests/fixtures/tokenizer/tokenizer.json tests/fixtures/tokenizer/tokenizer_config.json "$ck"/; then
            echo "serve: no Flash 4-layer checkpoint (or the tokenizer could not be copied into it)"
            fail=1
            continue
        fi
        # shellcheck disable=SC2086
        "$bin" serve -m "$ck" --device cuda --port 18300 --max-context 8192 ${SERVE_ARGS:-} 2>"$dir/serve.log" &
        spid=$!
        for i in $(seq 1 120); do
            grep -q "listening" "$dir/serve.log" && break
            kill -0 $spid 2>/dev/null || break
            sleep 1
        done
        if ! grep -q "listening" "$dir/serve.log"; then
            echo "serve: the server did not start: $(tail -n 1 "$dir/serve.log")"
            kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
            fail=1
            continue
        fi
        grep -h "loaded in" "$dir/serve.log" | tee -a "$dir/serve.txt"
        for cr in "1 8 128" "64 256 256" "256 512 256"; do
            set -- $cr
            echo "== serve: serve_load.py --concurrency $1 --requests $2 --prompt-tokens 1024 --max-tokens $3" | tee -a "$dir/serve.txt"
            timeout 200 python3 bench/serve_load.py --url http://127.0.0.1:18300 --concurrency $1 --requests $2 \
                --prompt-tokens 1024 --max-tokens $3 >"$dir/serve-load.txt" 2>&1 || fail=1
            cat "$dir/serve-load.txt" | tee -a "$dir/serve.txt"
        done
        kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
        tail -n 3 "$dir/serve.log"
        ;;
    ab)
        # the Flash 8K prefill (4 layers) under the settings in $AB
        ab_part ab 8 --batch 1 --context 4096 --prompt 8192 --steps 2
        ;;
    abdec)
        ab_part abdec 12 --batch 1,8,64,256 --context 4096 --prompt 0 --steps 5
        ;;
    abcheck)
        # each setting of $AB before its timings: test_decode on the four fixtures and a synthetic model (graphs ==
        # launches one by one, batch invariance) and a greedy `dsv4 run --device cuda` whose text must not change
        bdir=$(dirname "$bin")
        synth_model abcheck
        ref=""
        for a in ${AB:-default}; do
            ab_setting "$a"
            e=X=1
            [ -z "$v" ] || e=$(echo "$v" | tr ',' ' ')
            rc=0 # test_decode is this build's: another binary's setting gets the greedy run only
            : >"$dir/abcheck-$n.txt"
            if [ "$b" = "$bin" ]; then
                # shellcheck disable=SC2086
                env $e timeout 150 "$bdir/tests/gpu/test_decode" tests/fixtures/tiny-bf16 tests/fixtures/small-fp8-fp4 \
                    tests/fixtures/tiny-nvfp4-hf tests/fixtures/small-fp8-nvfp4 "$TMPDIR/dsv4-synth" >"$dir/abcheck-$n.txt" 2>&1
                rc=$?
            fi
            GENV=$e OUTF="$dir/abcheck-$n.run" greedy "$b"
            [ -n "$ref" ] || ref=$sum
            td="test_decode exit $rc ($(grep -h 'checks,' "$dir/abcheck-$n.txt" | tr '\n' ' '))"
            [ "$b" = "$bin" ] || td="test_decode not run ($b is another build)"
            echo "abcheck $n: $td, greedy run exit $rr, text $sum$([ "$sum" = "$ref" ] || echo ' DIFFERS')"
            [ "$rc" = 0 ] && [ "$rr" = 0 ] && [ "$sum" = "$ref" ] || fail=1
        done
        ;;
    chain)
        [ -x build-dev/tests/gpu/test_kernels ] || { echo "chain: no build-dev/tests/gpu/test_kernels (run the suite part first)"; fail=1; continue; }
        [ ! -f "$dir/chain-hang" ] || { echo "chain: skipped (the suite's chain checks hung)"; fail=1; continue; }
        timeout 300 build-dev/tests/gpu/test_kernels --only multi >"$dir/chain.txt" 2>&1 || { echo "chain: test_kernels failed"; fail=1; }
        grep -E "chain|route|checks,|FAIL" "$dir/chain.txt" | cut -c1-200
        ;;
    mf8trace)
        if [ ! -f build-bin/test_kernels-mf8trace.xz ]; then
            echo "mf8trace: no build-bin/test_kernels-mf8trace.xz (build it: NOTES \"Session 38 summary\")"
            fail=1
            continue
        fi
        xz -dc build-bin/test_kernels-mf8trace.xz >build-bin/test_kernels-mf8trace && chmod +x build-bin/test_kernels-mf8trace
        timeout 200 build-bin/test_kernels-mf8trace --only moebench >"$dir/mf8trace.txt" 2>&1 || { echo "mf8trace: test_kernels failed"; fail=1; }
        grep -A16 "^trace mf8" "$dir/mf8trace.txt" | cut -c1-160
        ;;
    branch)
        # sessions 51-54 did this by hand in gitignored call scripts; the non-timing lines are everything but "time" lines
        [ -x build-dev/tests/gpu/test_attn_kv8 ] || { echo "branch: no build-dev/tests/gpu/test_attn_kv8 (main's pack)"; fail=1; continue; }
        synth_model branch || continue
        for n in main ${BR:-}; do
            p=build-dev
            [ "$n" = main ] || p=$n/build-dev
            [ -x "$p/dsv4" ] || { echo "branch $n: no $p/dsv4 (build-bin/branches.tar.xz)"; fail=1; continue; }
            if [ -x "$p/tests/gpu/test_attn_kv8" ]; then
                # shellcheck disable=SC2086
                timeout 240 "$p/tests/gpu/test_attn_kv8" ${BR_KV8---only-tc} >"$dir/branch-kv8-$n.txt" 2>&1
                rc=$?
                grep -v -i time "$dir/branch-kv8-$n.txt" >"$dir/branch-kv8-$n.bits"
                d=$(diff "$dir/branch-kv8-main.bits" "$dir/branch-kv8-$n.bits" | grep -c '^[<>]')
                echo "branch $n: test_attn_kv8 ${BR_KV8---only-tc} exit $rc, $(wc -l <"$dir/branch-kv8-$n.bits") non-timing lines, $d differ from main's"
                [ "$rc" = 0 ] && [ "$d" = 0 ] || fail=1
                grep -E "time attn_kv8 prefill T 4096.*one f16 term on|time indexer_scores prefill" "$dir/branch-kv8-$n.txt" |
                    sed 's/ on mma.sync.*//; s/ *time attn_kv8 prefill/  /; s/ *time indexer_scores/  indexer_scores/'
            fi
            GENV=X=1 OUTF="$dir/branch-run-$n.txt" greedy "$p/dsv4"
            [ "$n" = main ] && ref=$sum
            echo "branch $n: greedy run exit $rr, text $sum$([ "$sum" = "$ref" ] || echo ' DIFFERS from main')"
            [ "$rr" = 0 ] && [ "$sum" = "$ref" ] || fail=1
            DSV4_ATTN_WG_TRACE="$dir/branch-trace-$n.txt" timeout 60 "$p/dsv4" bench --synthetic flash --layers 4 --batch 1 \
                --context 4096 --prompt 8192 --steps 1 --replays 1 >/dev/null 2>"$dir/branch-trace-$n.err" || fail=1
            python3 bench/wa_trace.py "$dir/branch-trace-$n.txt" >"$dir/branch-trace-$n.sum" 2>&1 || fail=1
            grep -E "^call|tile total" "$dir/branch-trace-$n.sum" | paste - - | sed 's/ blocks x warpgroups: [0-9]*//; s/  tile total median/: tile/'
            xz -9 -f "$dir/branch-trace-$n.txt"
        done
        ;;
    allsw)
        # the suite again with every session-28/29 switch on (the new forms on the forward's path: fixtures, unseen
        # shapes, test_decode), into DIR/allsw/
        echo "== allsw: the suite with the session-28/29 switches on"
        (export DSV4_CUDA_ATTN_TERMS=1 DSV4_LINEAR_TERMS_CAT=1 DSV4_MOE_PFB_PRODUCER=1 DSV4_MOE_PFB_XTOK=1 \
            DSV4_HC_POST_MIX_BIG=1 DSV4_LINEAR_SPLIT4=1 DSV4_MOE_PFB_NVFP4=1 DSV4_TOPK_FAST=1
         [ -f "$dir/pfb-hang" ] && export DSV4_MOE_PFB_PRODUCER=0 DSV4_TEST_PFB_NOPROD=1
         DEVRUN_PFB_FIRST=0 DEVRUN_NESTED=1 OUT="$dir/allsw" sh "$0" suite) || fail=1
        ;;
    switch)
        echo "== switch: bench/ab.sh -r 2, Flash 8K prefill" | tee -a "$dir/switch.txt"
        st=DSV4_CUDA_ATTN_TERMS=0 sp=DSV4_MOE_PFB_PRODUCER=0 sh4=DSV4_HC_POST_MIX_BIG=0 s4=DSV4_LINEAR_SPLIT4=0
        sk=DSV4_TOPK_FAST=0
        AB_DIR="$dir/switch-ab" timeout 590 sh bench/ab.sh -r 2 default="$bin" old="$bin,$st,$sp,$sh4,$s4,$sk" \
            no_terms="$bin,$st" no_q16="$bin,DSV4_CUDA_Q16=0" no_prod="$bin,$sp" no_hc="$bin,$sh4" no_split4="$bin,$s4" \
            no_topk="$bin,$sk" xtok="$bin,DSV4_MOE_PFB_XTOK=1" cat="$bin,DSV4_LINEAR_TERMS_CAT=1" tmax4k="$bin,DSV4_CUDA_TMAX=4096" -- \
            --synthetic flash --layers 4 --batch 1 --context 4096 --prompt 8192 --steps 2 --keep >>"$dir/switch.txt" 2>&1 ||
            { echo "switch: ab.sh failed"; fail=1; }
        tail -n 14 "$dir/switch.txt"
        ;;
    *)
        sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 2
        ;;
    esac
done
# the device tool brings back 8 of $OUT's files (session 30 lost a profile that way): all of them in one archive too,
# named to come first
if [ -n "${OUT:-}" ] && [ -z "${DEVRUN_NESTED:-}" ]; then
    tar czf /tmp/devrun-all.tgz -C "$dir" . && mv /tmp/devrun-all.tgz "$dir/0-all.tgz"
fi
exit $fail
