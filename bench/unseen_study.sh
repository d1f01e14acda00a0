#!/bin/sh
# unseen_study.sh - how far the GPU lands from the CPU engine on scripts/gpu_test.sh's five unseen `dsv4 synth` models
# (the same shapes and seeds) over several token lists, under named settings, so that an arithmetic choice is judged on
# more than one list's top-1 (bench/NOTES.md, session 24: one list of 8 x 48 tokens moved by +-0.03 with the list).
#   sh bench/unseen_study.sh [-l LISTS] [-p PREFILL] [-s SHAPE]... NAME=[VAR=value,...] ...
#   e.g. sh bench/unseen_study.sh -l 4 old=DSV4_CUDA_ATTN_TC_HILO=1,DSV4_LINEAR_GEMM_FP8_TERMS=3 new=
# List 1 is the suite's; list k adds 104729 (k - 1) to its seed. PREFILL rows (default 40: 8 x 40 = one 320-row pass,
# the prefill GEMMs and attention) go in at once, the rest one token at a time. Prints one line per (model, list,
# setting) and the pooled relative L2 / top-1 per setting (the mean over lists and models, and the lowest list).
# -s SHAPE (repeatable): `dsv4 synth` options of a model to study instead of the five, e.g. one whose widths reach a
# kernel the five do not (the FP8 prefill experts need D and I multiples of 512: -s "--seed 16 --dim 512 --moe-dim 512
# --heads 4 --layers 3 --experts 16 --active 4 --window 16 --ratio 8 --index-topk 8").
# DSV4=path picks the binary (default build-dev/dsv4), FC=path fixture_check (default build-dev/tests/gpu/fixture_check).
set -u
lists=4 pre=40 shapes=
nl='
'
while [ $# -gt 0 ]; do
    case $1 in
    -l) lists=$2; shift 2 ;;
    -p) pre=$2; shift 2 ;;
    -s) shapes="$shapes$2$nl"; shift 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: sh bench/unseen_study.sh [-l LISTS] [-p PREFILL] [-s SHAPE]... NAME=[VAR=value,...] ..." >&2; exit 2; }
bin=${DSV4:-build-dev/dsv4} fc=${FC:-build-dev/tests/gpu/fixture_check}
w=${TMPDIR:-/tmp}/unseen-study.$$
mkdir -p "$w" && trap 'rm -rf "$w"' EXIT
res=$w/results.txt
: >"$res"
i=0
[ -n "$shapes" ] || shapes="--seed 11 --dim 256 --heads 8 --layers 4 --experts 16 --active 4 --window 32 --ratio 8 --index-topk 8
--seed 12 --dim 128 --heads 4 --head-dim 192 --layers 3 --hash-layers 0 --window 16 --ratio 32 --index-topk 4 --moe-dim 96
--seed 13 --dim 256 --heads 2 --head-dim 256 --layers 5 --hash-layers 2 --experts 8 --active 2 --window 8 --ratio 2
--seed 14 --dim 384 --heads 16 --layers 4 --experts 32 --active 6 --window 64 --ratio 16 --index-topk 16 --moe-dim 256
--seed 15 --dim 512 --heads 4 --layers 3 --experts 8 --active 2 --moe-dim 256 --window 16 --ratio 8 --index-topk 8
"
printf %s "$shapes" >"$w/shapes.txt"
while IFS= read -r shape <&3; do
    [ -n "$shape" ] || continue
    i=$((i + 1))
    m=$w/u$i
    # shellcheck disable=SC2086
    "$bin" synth -o "$m" $shape >/dev/null 2>&1 || { echo "unseen $i: synth failed" >&2; exit 1; }
    k=1
    while [ "$k" -le "$lists" ]; do
        awk -v s="$i" -v k="$k" 'BEGIN { x = 7919 * s + 1 + 104729 * (k - 1); printf "["; for (b = 0; b < 8; b++) {
            printf "%s[", b ? "," : ""; for (t = 0; t < 48; t++) { x = (x * 16807) % 2147483647; printf "%s%d", t ? "," : "",
            10 + x % 120000 } printf "]" } print "]" }' >"$m-$k.json"
        "$bin" logits -m "$m" --tokens "$m-$k.json" --prefill "$pre" --device cpu -o "$m-$k-cpu.st" 2>/dev/null ||
            { echo "unseen $i list $k: cpu logits failed" >&2; exit 1; }
        for v in "$@"; do
            name=${v%%=*} envs=$(echo "${v#*=}" | tr ',' ' ')
            # shellcheck disable=SC2086
            env $envs "$bin" logits -m "$m" --tokens "$m-$k.json" --prefill "$pre" --device cuda -o "$m-$k-$name.st" 2>/dev/null ||
                { echo "unseen $i list $k $name: cuda logits failed" >&2; exit 1; }
            line=$("$fc" pair "unseen $i list $k $name" "$m-$k-$name.st" "$m-$k-cpu.st" 0.249 0.675 | head -n 1)
            echo "$line" | cut -c1-110
            echo "$name $(echo "$line" | sed -E 's/.*rel_l2 ([0-9.e+-]+) top1 ([0-9.]+).*/\1 \2/')" >>"$res"
        done
        k=$((k + 1))
    done
done 3<"$w/shapes.txt"
awk '{ n[$1]++; l[$1] += $2; t[$1] += $3; if (!($1 in lo) || $3 < lo[$1]) lo[$1] = $3 }
     END { for (s in n) printf "%-12s relative L2 %.4f  top-1 %.4f  lowest list %.4f  (%d runs)\n", s, l[s] / n[s], t[s] / n[s], lo[s], n[s] }' "$res"
