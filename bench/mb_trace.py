#!/usr/bin/env python3
"""mb_trace.py - summary of the BF16 prefill experts' clock trace (DSV4_MOE_PFB_TRACE=FILE with DSV4_MOE_PFB_PRODUCER=1;
src/cuda/moe_bf16.cuh, mb_kernel's TR instances; the file's format in moe_tc.cu's mb_trace_run).
   python3 bench/mb_trace.py FILE
Per kernel (gate/up, down), pooled over its calls and traced blocks: for each consumer warpgroup leader (role 0: warp
0, role 1: warp 4) the median and mean cycles a unit spends before its x stage is in (weights' wait + scale decode +
full barrier), in its eight k-steps, and between its end and the next unit's start; the epilogue a chunk; the block's
total and the share of each part. For the producer (role 2): its wait on a stage's empty barrier and the period
between its copies. Cycles at the SM clock; the traced down kernel spills 28 bytes (the untraced one 4), so its
numbers run a little slow."""
import sys


def stats(v):
    if not v:
        return "      -"
    s = sorted(v)
    return "%7d / %7.0f" % (s[len(s) // 2], sum(v) / len(v))


def main(path):
    kinds = {}
    cur = None
    for line in open(path):
        if line.startswith("call"):
            cur = kinds.setdefault(line.split()[1], [])
        elif line.startswith("blk") and cur is not None:
            head, vals = line.split(":")
            role = int(head.split()[3])
            cur.append((role, [(int(x) >> 4, int(x) & 15) for x in vals.split()]))
    for kind, rows in kinds.items():
        print("%s: %d traced warps" % (kind, len(rows)))
        for role in (0, 1):
            wait, mma, gap, epi, total = [], [], [], [], []
            for r, ev in rows:
                if r != role or not ev:
                    continue
                total.append(ev[-1][0])
                for i, (t, tag) in enumerate(ev):
                    nxt = ev[i + 1] if i + 1 < len(ev) else None
                    if tag == 1 and nxt and nxt[1] == 2:
                        wait.append(nxt[0] - t)
                    elif tag == 2 and nxt and nxt[1] == 3:
                        mma.append(nxt[0] - t)
                    elif tag == 3 and nxt and nxt[1] == 1:
                        gap.append(nxt[0] - t)
                    elif tag == 4 and nxt and nxt[1] == 5:
                        epi.append(nxt[0] - t)
            if not total:
                continue
            tw, tm, tg, te, tt = sum(wait), sum(mma), sum(gap), sum(epi), sum(total)
            print("  warpgroup %d (median / mean cycles): unit start -> x in %s, k-steps %s, to the next unit %s, "
                  "epilogue %s" % (role, stats(wait), stats(mma), stats(gap), stats(epi)))
            print("    block %s cycles; shares: before x in %.0f %%, k-steps %.0f %%, between units %.0f %%, epilogue %.0f %%"
                  % (stats(total), 100.0 * tw / tt, 100.0 * tm / tt, 100.0 * tg / tt, 100.0 * te / tt))
        pw, per = [], []
        for r, ev in rows:
            if r != 2:
                continue
            starts = [t for t, tag in ev if tag == 6]
            for i, (t, tag) in enumerate(ev):
                if tag == 6 and i + 1 < len(ev) and ev[i + 1][1] == 7:
                    pw.append(ev[i + 1][0] - t)
            per += [b - a for a, b in zip(starts, starts[1:])]
        if pw:
            print("  producer (median / mean cycles): empty-barrier wait %s, between copies %s" % (stats(pw), stats(per)))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
