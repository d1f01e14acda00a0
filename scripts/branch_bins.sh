#!/bin/sh
# branch_bins.sh - other branches' GPU binaries (default dsv4 and test_attn_kv8), built on this machine beside main's
# pack from scripts/gpu_bins.sh and packed together for one device call:
#   DSV4_DEPS=build-gfw-deps sh scripts/branch_bins.sh NAME=BRANCH [NAME=BRANCH ...]   -> build-bin/branches.tar.xz
# Each branch is checked out in a temporary worktree that starts from a copy of $BUILD (default build-dev: the pack's
# objects, built from build-bin/gpu-bins.commit), with only the files the branch changed since that commit rebuilt,
# so a branch that touches one kernel takes a minute or two, not a full build. The archive holds NAME/$BUILD/dsv4 and
# NAME/$BUILD/tests/gpu/test_attn_kv8 (TARGETS: other paths under $BUILD) for every NAME, in one solid xz: binaries
# that differ in one kernel compress together (three branches in 3.7 MB, session 53). On the device, after the pack:
#   tar xJf build-bin/branches.tar.xz && AB="main=@build-dev/dsv4 NAME=@NAME/build-dev/dsv4" sh bench/device_run.sh ab
# The branches must be reachable in this repository (merge them into main with -s ours before a session ends: session
# 52's were lost with its checkout).
set -eu
BUILD=${BUILD:-build-dev}
TARGETS=${TARGETS:-dsv4 tests/gpu/test_attn_kv8}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ $# = 0 ] || [ "$1" = --help ] || [ "$1" = -h ]; then
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    [ $# = 0 ] && exit 2
    exit 0
fi
if [ ! -d "$BUILD" ] || [ ! -f build-bin/gpu-bins.commit ]; then
    echo "branch_bins: no $BUILD or build-bin/gpu-bins.commit: run 'DSV4_DEPS=build-gfw-deps sh scripts/gpu_bins.sh' first" >&2
    exit 1
fi
base=$(head -n 1 build-bin/gpu-bins.commit)
if [ -n "${DSV4_DEPS:-}" ]; then
    D=$(cd "$DSV4_DEPS" && pwd)
    export CPATH="$D/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
export PATH="$CUDA_HOME/bin:$PATH"
root=$(pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"; git worktree prune' EXIT
for nb in "$@"; do
    n=${nb%%=*} br=${nb#*=}
    if [ "$n" = "$nb" ] || [ -z "$n" ]; then
        echo "branch_bins: '$nb' is not NAME=BRANCH" >&2
        exit 2
    fi
    git rev-parse --verify -q "$br^{commit}" >/dev/null || { echo "branch_bins: no branch or commit '$br'" >&2; exit 1; }
    wt=$stage/wt-$n
    git worktree add -q --detach "$wt" "$br"
    cp -a "$BUILD" "$wt/$BUILD"
    # the objects as new as the checkout, then the files the branch changed since the pack's commit newer still (make
    # rebuilds those and what depends on them through the .d files)
    find "$wt/$BUILD" -type f -exec touch {} +
    sleep 1
    changed=$(git diff --name-only --diff-filter=d "$base" "$br" -- src tests include Makefile)
    echo "branch_bins: $n = $br ($(git rev-parse --short "$br")): $(echo "$changed" | grep -c . || true) files changed since $base"
    [ -z "$changed" ] || (cd "$wt" && echo "$changed" | xargs touch)
    t=""
    for x in $TARGETS; do t="$t $BUILD/$x"; done
    # shellcheck disable=SC2086
    (cd "$wt" && make -j"$(nproc 2>/dev/null || echo 4)" CUDA=1 BUILD="$BUILD" NVCC="$CUDA_HOME/bin/nvcc" CUDA_HOME="$CUDA_HOME" $t) \
        >"$stage/$n.log" 2>&1 || { tail -n 20 "$stage/$n.log" >&2; echo "branch_bins: $n: build failed" >&2; exit 1; }
    if grep -i 'warning' "$stage/$n.log" >&2; then echo "branch_bins: $n: warnings (above)" >&2; fi
    for x in $TARGETS; do
        mkdir -p "$stage/out/$n/$BUILD/$(dirname "$x")"
        cp "$wt/$BUILD/$x" "$stage/out/$n/$BUILD/$x"
    done
    git worktree remove --force "$wt"
done
mkdir -p "$root/build-bin"
(cd "$stage/out" && XZ_OPT=-9e tar cJf "$root/build-bin/branches.tar.xz" .)
echo "branch_bins: build-bin/branches.tar.xz ($(du -h "$root/build-bin/branches.tar.xz" | cut -f1)): $*"
