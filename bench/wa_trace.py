#!/usr/bin/env python3
"""wa_trace.py - summary of attn_kv8_wg's clock trace (DSV4_ATTN_WG_TRACE=FILE; src/cuda/attn_kv8_wg.cu, WA_TR).
   python3 bench/wa_trace.py FILE
Per call: the median over the traced blocks (thread 0 of each warpgroup) of the cycles from the block's start to the
prologue's points, then per tile the cycles each phase took (from the previous point), tiles 1 .. 11 pooled."""
import sys

PH = ["barrier", "rows in", "q.k + decode", "copies", "scores in", "swap", "softmax", "p.V"]


def med(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def main(path):
    calls, cur = [], None
    for line in open(path):
        if line.startswith("call"):
            cur = {"name": line.strip(), "rows": []}
            calls.append(cur)
        elif line.startswith("blk") and cur is not None:
            cur["rows"].append([int(x) for x in line.split(":")[1].split()])
    for c in calls:
        rows = c["rows"]
        print(c["name"], "blocks x warpgroups:", len(rows))
        pro = [med([r[k - 1] for r in rows if r[k - 1] >= 0]) for k in (1, 2, 3)]
        print("  prologue: ids+copies %d, q %d, tile 0 decoded %d" % tuple(pro))
        ph = [[] for _ in PH]
        tiles = []
        for r in rows:
            for s in range(1, 12):
                b = 4 + 8 * s - 1  # index of slot 4 + 8 s in r (r[k - 1] is slot k)
                prev = r[b - 1]  # slot 4 + 8 s - 1: the previous tile's p.V
                if prev < 0 or r[b] < 0:
                    continue
                t0 = prev
                for k in range(8):
                    v = r[b + k]
                    if v < 0:  # phases 2-3 absent on the last tile
                        continue
                    ph[k].append(v - t0)
                    t0 = v
                tiles.append(r[b + 7] - prev if r[b + 7] >= 0 else None)
        # phases without stamps (a form that stamps fewer points: the pipelines' branches) are left out
        print("  per tile (median cycles): " + ", ".join("%s %d" % (PH[k], med(ph[k])) for k in range(8) if ph[k]))
        tt = [t for t in tiles if t]
        if tt:
            print("  tile total median %d" % med(tt))
        ends = [(r[99] - r[2], r[100] - r[99]) for r in rows if r[99] >= 0 and r[100] >= 0 and r[2] >= 0]
        if ends:
            print("  loop %d, stores %d" % (med([e[0] for e in ends]), med([e[1] for e in ends])))


if __name__ == "__main__":
    main(sys.argv[1])
