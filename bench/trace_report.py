#!/usr/bin/env python3
"""trace_report.py - reads the kernel timelines `dsv4 bench --trace FILE` writes (src/cuda/trace.cu) and prints, for
each traced stretch: its span, the time some kernel ran (busy), the time none did (idle: launch gaps, waits), the time
two or more overlapped, and per kernel name the count, the summed duration and the "solo" time (while it was the only
kernel running: what shortening it would save at most, the critical chain's share). Decode sections (5 replays of the
layers and head graphs) are reported for their median replay.

    python3 bench/trace_report.py FILE [--timeline] [--top N]

--timeline also lists the median replay's kernels in start order (start, duration, the gap since the previous kernel
ended, CUPTI's stream id: graph kernels get the graph's own ids, one per branch, not the engine's streams). Standard library only; names are demangled with c++filt when it is there."""
import argparse
import re
import shutil
import subprocess
import sys


def demangle(names):
    """mangled -> short name (no template arguments or parameters)"""
    out = {n: n for n in names}
    if shutil.which("c++filt") and names:
        try:
            r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=60)
            for n, d in zip(names, r.stdout.split("\n")):
                out[n] = d
        except (OSError, subprocess.SubprocessError):
            pass
    short = {}
    for n, d in out.items():
        s = d
        # drop parameter lists and template arguments (nested)
        depth, buf = 0, []
        for ch in s:
            if ch in "<(":
                depth += 1
            elif ch in ">)":
                depth -= 1
            elif depth == 0:
                buf.append(ch)
        s = "".join(buf).strip()
        s = re.sub(r"^void\s+", "", s)
        short[n] = s or n
    return short


def parse(path):
    secs, cur = [], None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("# start_us"):
                continue
            if line.startswith("# "):
                cur = {"title": line[2:], "rows": []}
                secs.append(cur)
                continue
            p = line.split(" ", 8)
            if len(p) < 9 or cur is None:
                continue
            cur["rows"].append({"s": float(p[0]), "e": float(p[1]), "stream": int(p[2]), "graph": int(p[3]),
                                "node": int(p[4]), "blocks": int(p[5]), "threads": int(p[6]), "regs": int(p[7]),
                                "name": p[8]})
    return secs


def sweep(rows):
    """span, busy, idle, overlapped time and each row's solo time (index -> us)"""
    ev = []
    for i, r in enumerate(rows):
        if r["e"] <= r["s"]:  # a kernel of no measurable length: never active
            continue
        ev.append((r["s"], 1, i))
        ev.append((r["e"], -1, i))
    ev.sort(key=lambda x: (x[0], x[1]))
    active, solo = set(), [0.0] * len(rows)
    busy = over = 0.0
    last = ev[0][0] if ev else 0.0
    for t, k, i in ev:
        dt = t - last
        if dt > 0 and active:
            busy += dt
            if len(active) == 1:
                solo[next(iter(active))] += dt
            else:
                over += dt
        last = t
        if k > 0:
            active.add(i)
        else:
            active.discard(i)
    span = (max(r["e"] for r in rows) - min(r["s"] for r in rows)) if rows else 0.0
    return span, busy, span - busy, over, solo


def report(sec, short, timeline, top):
    rows = sec["rows"]
    print("== " + sec["title"])
    m = re.search(r"(\d+) replays", sec["title"])
    if m:  # decode: split each graph's kernels into its replays, keep the median replay of the layers + head
        nrep = int(m.group(1))
        graphs = sorted({r["graph"] for r in rows})
        per = {}
        for g in graphs:
            gr = sorted([r for r in rows if r["graph"] == g], key=lambda r: r["s"])
            if len(gr) % nrep:
                print("  (graph %d: %d kernels, not a multiple of %d replays: shown whole)" % (g, len(gr), nrep))
                per = None
                break
            n = len(gr) // nrep
            per[g] = [gr[i * n:(i + 1) * n] for i in range(nrep)]
        if per:
            reps = [sorted(sum((per[g][i] for g in graphs), []), key=lambda r: r["s"]) for i in range(nrep)]
            spans = sorted((sweep(rp)[0], i) for i, rp in enumerate(reps))
            med = spans[len(spans) // 2][1]
            rows = reps[med]
            print("  replay spans (us): " + ", ".join("%.1f" % sweep(rp)[0] for rp in reps) + "; the median one below")
            for g in graphs:
                gs = per[g][med]
                print("  graph %d: %d kernels, %.1f us from its first start to its last end" %
                      (g, len(gs), max(r["e"] for r in gs) - min(r["s"] for r in gs)))
    span, busy, idle, over, solo = sweep(rows)
    print("  %d kernels, span %.1f us: busy %.1f (%.1f %%), idle %.1f (%.1f %%: no kernel running), "
          "two or more at once %.1f" % (len(rows), span, busy, 100 * busy / span if span else 0, idle,
                                       100 * idle / span if span else 0, over))
    agg = {}
    for i, r in enumerate(rows):
        a = agg.setdefault(short[r["name"]], [0, 0.0, 0.0])
        a[0] += 1
        a[1] += r["e"] - r["s"]
        a[2] += solo[i]
    print("  %-44s %5s %10s %10s %7s" % ("kernel", "count", "sum us", "solo us", "solo %"))
    for name, (n, d, so) in sorted(agg.items(), key=lambda kv: -kv[1][2])[:top]:
        print("  %-44s %5d %10.1f %10.1f %6.1f%%" % (name[:44], n, d, so, 100 * so / span if span else 0))
    if timeline:
        print("  %5s %9s %8s %8s %6s  %s" % ("#", "start", "dur", "gap", "stream", "kernel (blocks x threads)"))
        prev_end = rows[0]["s"] if rows else 0.0
        t0 = rows[0]["s"] if rows else 0.0
        for i, r in enumerate(rows):
            gap = r["s"] - prev_end
            print("  %5d %9.1f %8.1f %8.1f %6d  %s (%d x %d)" % (i, r["s"] - t0, r["e"] - r["s"], gap, r["stream"],
                                                             short[r["name"]], r["blocks"], r["threads"]))
            prev_end = max(prev_end, r["e"])
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--timeline", action="store_true", help="list the (median replay's) kernels in start order")
    ap.add_argument("--top", type=int, default=25, help="kernel names listed (by solo time; default 25)")
    a = ap.parse_args()
    secs = parse(a.file)
    if not secs:
        sys.exit("trace_report: %s holds no trace" % a.file)
    short = demangle(sorted({r["name"] for s in secs for r in s["rows"]}))
    for s in secs:
        report(s, short, a.timeline, a.top)


if __name__ == "__main__":
    main()
