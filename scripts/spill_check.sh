#!/bin/sh
# spill_check.sh - the CUDA kernels' register spills against a budget, so that a change cannot make a kernel spill
# unnoticed (session 34 found the decode GEMV spilling 680 bytes since session 23, from branches no default run took).
#   make CUDA=1 BUILD=build-cuda PTXAS_REPORT=1 && sh scripts/spill_check.sh build-cuda
# Reads every BUILD/src/cuda/*.cu.o.ptxas (ptxas -v, one per object) and scripts/spill_budget.txt ("KERNEL BYTES":
# a kernel's or device function's mangled name, as ptxas's "Function properties for" line gives it, and the spill-store
# bytes it may have; every other one: 0). Prints each kernel over its
# budget; exit 1 if any, or if an object has no report (built without PTXAS_REPORT=1: rebuild it). A kernel that
# spills less than its budget is listed too (lower the budget).
set -u
BUILD=${1:-build-cuda}
dir=$(dirname "$0")
budget="$dir/spill_budget.txt"
fail=0
for o in "$BUILD"/src/cuda/*.cu.o; do
    [ -e "$o" ] || { echo "spill_check: no CUDA objects in $BUILD (make CUDA=1 BUILD=$BUILD PTXAS_REPORT=1)"; exit 1; }
    if [ ! -f "$o.ptxas" ] || [ -n "$(find "$o" -newer "$o.ptxas")" ]; then
        echo "spill_check: $o has no ptxas report newer than it: rebuild with PTXAS_REPORT=1"
        fail=1
    fi
done
[ "$fail" = 0 ] || exit 1
cat "$BUILD"/src/cuda/*.cu.o.ptxas | awk -v budget="$budget" '
    BEGIN {
        while ((getline line < budget) > 0) {
            sub(/#.*/, "", line)
            if (split(line, f, " ") >= 2) allow[f[1]] = f[2] + 0
        }
    }
    /Compiling entry function/ { n++ }
    /Function properties for / { fn = $0; sub(/.*Function properties for /, "", fn); sub(/[ \t]*$/, "", fn) }
    /bytes spill stores/ {
        st = $0; sub(/ bytes spill stores.*/, "", st); sub(/.*, /, "", st); st += 0
        a = (fn in allow) ? allow[fn] : 0
        if (fn in seen) next # a device function called from several kernels: reported once
        seen[fn] = 1
        if (st > a) { printf "spill_check: %s spills %d bytes (budget %d)\n", fn, st, a; over++ }
        else if (st < a) { printf "spill_check: %s spills %d bytes, under its budget %d: lower it\n", fn, st, a; under++ }
        if (st > 0) nsp++
    }
    END {
        for (k in allow) if (!(k in seen)) printf "spill_check: budget entry %s matches no kernel: remove it\n", k
        printf "spill_check: %d kernels, %d spilling, %d over budget\n", n, nsp, over
        exit over > 0
    }'
