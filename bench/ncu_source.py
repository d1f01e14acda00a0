#!/usr/bin/env python3
"""ncu_source.py - where a kernel's warps stall, per SASS line and per code region, from Nsight Compute's source page.

    ncu --profile-from-start off -k regex:NAME -c 2 --set full --import-source no -o rep BINARY ARGS
    ncu --import rep.ncu-rep --page source --csv --print-source sass > rep.csv
    python3 bench/ncu_source.py rep.csv [--kernel N] [--top K] [--min-share F]

For kernel N of the CSV (0: the first; each profiled launch is one block of the CSV), prints:
  - the stall reasons' shares of all samples;
  - the code regions: runs of consecutive SASS lines executed the same number of times (a loop body, one branch of
    it), those above --min-share of the instructions or of the samples, with their instruction share, sample share,
    top stall reasons and instruction mix (session 9 found the x stage copies of moe_pf2_kernel this way: 10 % of the
    instructions, 30 % of the samples);
  - the --top lines by samples, with their main stall reason and execution count.
The stall on a line is the reason the warp waited before issuing it: a long scoreboard stall on an instruction that
writes a register points at the load (or the LDGSTS still holding that register as its address) before it.
"""
import argparse
import collections
import csv
import sys


def blocks(rows):
    """the CSV's kernels: (name, header, data rows)"""
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    for j, s in enumerate(starts):
        end = starts[j + 1] if j + 1 < len(starts) else len(rows)
        yield rows[s][1] if len(rows[s]) > 1 else "?", rows[s + 1], [r for r in rows[s + 2:end] if len(r) > 2]


def num(r, ix, key):
    try:
        return float(r[ix[key]])
    except (KeyError, IndexError, ValueError):
        return 0.0


def opcode(sass):
    t = sass.split()
    if not t:
        return "?"
    return t[1] if t[0].startswith("@") and len(t) > 1 else t[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", type=int, default=0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--min-share", type=float, default=0.01)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        ks = list(blocks(list(csv.reader(f))))
    if not ks:
        sys.exit(f"{a.csv}: no 'Kernel Name' block (not an ncu --page source --csv file?)")
    if not 0 <= a.kernel < len(ks):
        sys.exit(f"{a.csv}: --kernel {a.kernel} out of range (0 .. {len(ks) - 1})")
    name, hdr, data = ks[a.kernel]
    ix = {h: i for i, h in enumerate(hdr)}
    for need in ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)"):
        if need not in ix:
            sys.exit(f"{a.csv}: column '{need}' missing (profile with --set full, export with --print-source sass)")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    S, I = "Warp Stall Sampling (All Samples)", "Instructions Executed"
    tot_s = sum(num(r, ix, S) for r in data) or 1.0
    tot_i = sum(num(r, ix, I) for r in data) or 1.0
    print(f"{name}: {len(data)} SASS lines, {tot_i:.4g} warp instructions, {tot_s:.0f} samples")
    agg = {k: sum(num(r, ix, k) for r in data) for k in stalls}
    print("stall reasons: " + ", ".join(f"{k[6:]} {100 * v / tot_s:.0f} %" for k, v in sorted(agg.items(), key=lambda x: -x[1])[:10]))

    print(f"\nregions (consecutive lines executed equally often; >= {100 * a.min_share:g} % of instructions or samples):")
    print(f"{'lines':>11} {'executed':>10} {'len':>4} {'instr %':>7} {'samples %':>9}  top stalls / instruction mix")
    regs, cur = [], None
    for i, r in enumerate(data):
        e = num(r, ix, I)
        if cur and cur[2] == e:
            cur[1] = i
        else:
            cur = [i, i, e]
            regs.append(cur)
    for lo, hi, e in regs:
        seg = data[lo:hi + 1]
        si = e * len(seg) / tot_i
        ss = sum(num(r, ix, S) for r in seg) / tot_s
        if si < a.min_share and ss < a.min_share:
            continue
        st = {k: sum(num(r, ix, k) for r in seg) for k in stalls}
        sst = sum(st.values()) or 1.0
        top = ", ".join(f"{k[6:]} {100 * v / sst:.0f}" for k, v in sorted(st.items(), key=lambda x: -x[1])[:3])
        mix = ", ".join(f"{o} {n}" for o, n in collections.Counter(opcode(r[ix["Source"]]) for r in seg).most_common(6))
        print(f"{lo:>5}-{hi:<5} {int(e):>10} {len(seg):>4} {100 * si:>7.1f} {100 * ss:>9.1f}  {top} | {mix}")

    print(f"\ntop {a.top} lines by samples:")
    for r_i in sorted(range(len(data)), key=lambda i: -num(data[i], ix, S))[: a.top]:
        r = data[r_i]
        why = max(stalls, key=lambda k: num(r, ix, k))[6:] if stalls else "?"
        print(f"{r_i:>6} {100 * num(r, ix, S) / tot_s:5.1f} %  {why:<16} x{int(num(r, ix, I)):<9} {r[ix['Source']].strip()[:80]}")


if __name__ == "__main__":
    main()
