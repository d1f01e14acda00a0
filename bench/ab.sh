#!/bin/sh
# ab.sh - A/B of dsv4 builds or settings on one GPU: the same `dsv4 bench` command for every variant, the variants
# interleaved round by round (clocks and thermals drift between device calls, not between neighbouring runs), then the
# median step time per (batch, context) and the prefill time, each against the first variant.
#   sh bench/ab.sh [-r ROUNDS] VARIANT... -- BENCH ARGUMENTS
#   VARIANT: name=BINARY[,VAR=value...]: the dsv4 binary and the environment it runs with, e.g.
#     sh bench/ab.sh -r 3 main=/tmp/bb/dsv4-main s2=/tmp/bb/dsv4-s2 serial=/tmp/bb/dsv4-s2,DSV4_CUDA_ATTN_FORK=0 -- \
#        --synthetic flash --layers 4 --batch 1,8 --context 4096 --prompt 0 --steps 10 --keep
# Runs with TMPDIR=/dev/shm unless TMPDIR is set (the bench's checkpoint; --keep reuses it). Each run's output goes
# to $AB_DIR (default a temporary directory) as NAME.ROUND.txt / .err. Prints one table; exit 1 if a run failed.
set -u
rounds=2
if [ "${1:-}" = "-r" ]; then rounds=$2; shift 2; fi
variants=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do variants="$variants $1"; shift; done
[ "${1:-}" = "--" ] && shift
if [ -z "$variants" ]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
export TMPDIR="${TMPDIR:-/dev/shm}"
dir="${AB_DIR:-$(mktemp -d)}"
mkdir -p "$dir"
fail=0
r=1
while [ "$r" -le "$rounds" ]; do
    for v in $variants; do
        name=${v%%=*}
        spec=${v#*=}
        bin=${spec%%,*}
        envs=""
        [ "$bin" != "$spec" ] && envs=$(printf '%s' "${spec#*,}" | tr ',' ' ')
        # shellcheck disable=SC2086
        if ! env $envs "$bin" bench "$@" >"$dir/$name.$r.txt" 2>"$dir/$name.$r.err"; then
            echo "ab: $name round $r failed: $(tail -n 1 "$dir/$name.$r.err")" >&2
            fail=1
        fi
    done
    r=$((r + 1))
done
# the table: rows (batch, context) and prefill, columns the variants; medians over the rounds
for v in $variants; do
    name=${v%%=*}
    r=1
    while [ "$r" -le "$rounds" ]; do
        [ -f "$dir/$name.$r.txt" ] && awk -v n="$name" '
            $3 == "|" && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { print n, "b" $1 "@" $2, $4 }
            /^prefill [0-9]+ tokens:/ { print n, "prefill" $2, $4 }' "$dir/$name.$r.txt"
        r=$((r + 1))
    done
done | awk -v order="$variants" '
    { k = $1 SUBSEP $2; v[k, ++c[k]] = $3; if (!($2 in seen)) { seen[$2] = 1; rows[++nr] = $2 } }
    function med(k,   n, i, j, t, a) {
        n = c[k]; if (!n) return -1
        for (i = 1; i <= n; i++) a[i] = v[k, i] + 0
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END {
        nv = split(order, vs, " ")
        for (i = 1; i <= nv; i++) { sub(/=.*/, "", vs[i]) }
        printf "%-16s", "ms (median)"
        for (i = 1; i <= nv; i++) printf " %16s", vs[i]
        printf "\n"
        for (r = 1; r <= nr; r++) {
            printf "%-16s", rows[r]
            base = med(vs[1] SUBSEP rows[r])
            for (i = 1; i <= nv; i++) {
                m = med(vs[i] SUBSEP rows[r])
                if (m < 0) printf " %16s", "-"
                else if (i == 1 || base <= 0) printf " %16.3f", m
                else printf " %9.3f %5.3fx", m, m / base
            }
            printf "\n"
        }
    }'
echo "(runs in $dir; rounds $rounds; step = the graph replay median of each run)"
exit $fail
