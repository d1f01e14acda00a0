#!/bin/sh
# gpu_bins.sh - the GPU suite's binaries (scripts/gpu_test.sh's: dsv4, test_kernels, test_sample, test_attn_kv8,
# fixture_check, test_decode) built on this machine, which needs nvcc but no GPU, and packed for the device tool's
# carry, so that a device call spends its time on the tests rather than on the build (~150 s of a suite's ~260 s):
#   DSV4_DEPS=build-gfw-deps sh scripts/gpu_bins.sh          -> build-bin/gpu-bins.tar.xz   (BUILD=build-dev)
# (build-gfw-deps, the -dev packages' tree: sh scripts/gpu_deps.sh; both in the repository root, whose working tree the
# device tool copies: not in another worktree)
# then on the device (carry build-bin and build-gfw-deps), bench/device_run.sh unpacks it and runs the suite with
# GPU_TEST_PREBUILT=1; by hand:
#   tar xJf build-bin/gpu-bins.tar.xz && GPU_TEST_PREBUILT=1 BUILD=build-dev DSV4_DEPS=build-gfw-deps sh scripts/gpu_test.sh --no-bench
# Other branches' binaries beside this pack: scripts/branch_bins.sh NAME=BRANCH ... (build-bin/branches.tar.xz).
# The pack records the commit it was built from (build-bin/gpu-bins.commit); rebuild after any change to src/ or tests/.
set -eu
BUILD=${BUILD:-build-dev}
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
BUILD=$BUILD GPU_TEST_BUILD_ONLY=1 sh scripts/gpu_test.sh
mkdir -p build-bin
# xz -9: its 64 MiB dictionary spans the six binaries, which share most of their code (3.6 MB instead of 14 at -6)
XZ_OPT=${XZ_OPT:--9} tar cJf build-bin/gpu-bins.tar.xz "$BUILD/dsv4" "$BUILD/tests/gpu/test_kernels" "$BUILD/tests/gpu/test_sample" \
    "$BUILD/tests/gpu/test_attn_kv8" "$BUILD/tests/gpu/fixture_check" "$BUILD/tests/gpu/test_decode"
{ git rev-parse HEAD; git status --short -- src tests include | head -n 20; } >build-bin/gpu-bins.commit 2>/dev/null || true
# and a digest of the files it was built from, which bench/device_run.sh compares with the tree it runs in (the device's
# copy of .git can lag behind the working tree it is given: session 36)
find src tests include Makefile -type f | LC_ALL=C sort | xargs cat | md5sum | cut -c1-32 >build-bin/gpu-bins.tree
echo "gpu_bins: build-bin/gpu-bins.tar.xz ($(du -h build-bin/gpu-bins.tar.xz | cut -f1)) from $(head -n 1 build-bin/gpu-bins.commit)"
