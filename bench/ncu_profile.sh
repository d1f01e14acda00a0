#!/bin/sh
# ncu_profile.sh - per-kernel DRAM bandwidth and tensor-core use (Nsight Compute) of the runs that
# `dsv4 bench --profile` profiles op by op: one prefill and the last decode steps of each batch size.
# dsv4 opens the profiler's range around exactly those runs (cudaProfilerStart / Stop in op_profile.c), so
# the weight generation, the warm-up and the timed graph replays are not profiled.
#   sh bench/ncu_profile.sh OUT_DIR [dsv4 bench arguments ...]
#   e.g. sh bench/ncu_profile.sh /tmp/ncu --synthetic flash --layers 4 --batch 1,8 --context 4096 --prompt 2048
# Writes OUT_DIR/ncu.csv (raw, one row per kernel launch) and OUT_DIR/ncu_summary.txt (bench/ncu_summary.py:
# per kernel name and launch size: calls, time, DRAM GB/s, % of DRAM peak, tensor pipes' use).
# NCU_COUNT (default 150) caps the kernels profiled: ncu replays each one with the process's device memory saved
# and restored, ~0.6 s per kernel with a 4-layer Flash checkpoint (16 GB), so one decode step (~135 kernels) takes
# ~90 s; a prefill (~600 kernels) much longer.
# Clocks are left alone (--clock-control none). Needs ncu on the PATH (CUDA's Nsight Compute) and a CUDA build
# of dsv4 at ${DSV4:-build-cuda/dsv4}.
set -eu
out=$1; shift
DSV4=${DSV4:-build-cuda/dsv4}
mkdir -p "$out"
avail=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}')
metrics=gpu__time_duration.sum
for m in dram__bytes_read.sum dram__bytes_write.sum dram__throughput.avg.pct_of_peak_sustained_elapsed \
    sm__throughput.avg.pct_of_peak_sustained_elapsed sm__warps_active.avg.pct_of_peak_sustained_active \
    launch__registers_per_thread launch__grid_size launch__block_size \
    sm__pipe_tensor_op_hmma_cycles_active sm__pipe_tensor_op_gmma_cycles_active; do
    base=${m%%.*}
    if echo "$avail" | grep -qx "$base"; then
        case $m in
        sm__pipe_tensor_op_*) metrics="$metrics,$m.avg.pct_of_peak_sustained_active" ;;
        *) metrics="$metrics,$m" ;;
        esac
    fi
done
echo "ncu_profile: metrics $metrics" >&2
ncu --profile-from-start off --clock-control none --launch-count "${NCU_COUNT:-150}" --csv --page raw --metrics "$metrics" \
    "$DSV4" bench "$@" --profile >"$out/ncu.csv" 2>"$out/ncu.log" || { tail -n 20 "$out/ncu.log" >&2; exit 1; }
python3 "$(dirname "$0")/ncu_summary.py" "$out/ncu.csv" | tee "$out/ncu_summary.txt"
