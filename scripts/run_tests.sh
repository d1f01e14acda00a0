#!/bin/sh
# Runs every test binary in $1/tests; prints a final "N passed, N failed" line; non-zero on failure.
build=${1:-build}
pass=0; fail=0
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue;; esac
    echo "== $t" >&2
    if "$t" --jobs 2 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED: $t" >&2; fi
done
echo "test binaries in $build" >&2
echo "binaries: $pass passed, $fail failed"
[ "$fail" = 0 ]
