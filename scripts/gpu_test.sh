#!/bin/sh
# gpu_test.sh - builds the CUDA kernels and their per-kernel test (tests/gpu/test_kernels.c, which
# links only the CPU twins and the CUDA objects, so no -dev packages are needed) and runs it on GPU 0:
# every op against its CPU twin, then timings. Arguments go to the test (--no-bench: checks only).
#   sh scripts/gpu_test.sh            (make gpu-test calls this)
#   BUILD=dir CUDA_HOME=/usr/local/cuda sh scripts/gpu_test.sh --no-bench
set -eu
BUILD=${BUILD:-build-cuda}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=$(nproc 2>/dev/null || echo 4)
make -j"$JOBS" CUDA=1 BUILD="$BUILD" NVCC="$CUDA_HOME/bin/nvcc" CUDA_HOME="$CUDA_HOME" "$BUILD/tests/gpu/test_kernels"
LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BUILD/tests/gpu/test_kernels" "$@"
