#!/usr/bin/env python3
"""ncu_summary.py - sums an Nsight Compute raw CSV (bench/ncu_profile.sh) per kernel and launch size.

    python3 bench/ncu_summary.py ncu.csv

One line per (kernel, grid x block): launches, total and mean time, DRAM bytes read + written, the bandwidth
that gives, the % of DRAM peak ncu reports (time-weighted), the SM throughput, the warps active and the tensor
pipes' use (hmma = mma.sync, gmma = wgmma; % of peak while active, time-weighted), sorted by total time."""
import csv
import io
import sys


def num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return None


def main(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV table (see ncu.log beside it)")
    rows = list(csv.reader(io.StringIO(text[start:])))
    head, rows = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(head)}
    units = rows[0] if rows and rows[0][col["ID"]] == "" else None
    if units:
        rows = rows[1:]

    def get(r, name):
        i = col.get(name)
        return num(r[i]) if i is not None and i < len(r) else None

    def tscale(r):  # gpu__time_duration unit -> us
        u = units[col["gpu__time_duration.sum"]] if units else "ns"
        return {"ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3}.get(u, 1e-3)

    def bscale(name):
        u = units[col[name]] if units and name in col else "byte"
        return {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(u, 1)

    agg = {}
    for r in rows:
        name = r[col["Kernel Name"]].split("(")[0]
        if name.startswith("void "):
            name = name[5:]
        key = (name, r[col["Grid Size"]] if "Grid Size" in col else "", r[col["Block Size"]] if "Block Size" in col else "")
        t = (get(r, "gpu__time_duration.sum") or 0) * tscale(r)
        b = sum((get(r, m) or 0) * bscale(m) for m in ("dram__bytes_read.sum", "dram__bytes_write.sum"))
        a = agg.setdefault(key, {"n": 0, "t": 0.0, "b": 0.0, "w": {}, "regs": get(r, "launch__registers_per_thread")})
        a["n"] += 1
        a["t"] += t
        a["b"] += b
        for m in ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                  "sm__warps_active.avg.pct_of_peak_sustained_active",
                  "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                  "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"):
            v = get(r, m)
            if v is not None:
                a["w"][m] = a["w"].get(m, 0.0) + v * t
    total = sum(a["t"] for a in agg.values())
    print(f"{len(rows)} kernel launches, {total / 1e3:.3f} ms of kernel time (serialized by ncu)")
    print(f"{'us':>9} {'share':>6} {'calls':>5} {'us/call':>8} {'GB/s':>7} {'dram%':>5} {'sm%':>5} {'warps%':>6} "
          f"{'hmma%':>5} {'gmma%':>5} {'regs':>4}  kernel [grid x block]")
    for (name, grid, block), a in sorted(agg.items(), key=lambda kv: -kv[1]["t"]):
        def w(m):
            v = a["w"].get(m)
            return f"{v / a['t']:.0f}" if v is not None and a["t"] > 0 else "-"
        gbs = a["b"] / (a["t"] * 1e-6) / 1e9 if a["t"] > 0 else 0
        print(f"{a['t']:9.1f} {100 * a['t'] / total if total else 0:5.1f}% {a['n']:5d} {a['t'] / a['n']:8.2f} {gbs:7.0f} "
              f"{w('dram__throughput.avg.pct_of_peak_sustained_elapsed'):>5} {w('sm__throughput.avg.pct_of_peak_sustained_elapsed'):>5} "
              f"{w('sm__warps_active.avg.pct_of_peak_sustained_active'):>6} "
              f"{w('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):>5} "
              f"{w('sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active'):>5} "
              f"{a['regs'] or 0:4.0f}  {name[:70]} [{grid} x {block}]")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
