#!/usr/bin/env python3
"""Turn the BENCH lines of a verbs-bench lab run into Markdown tables
(median over the repetitions of each tool, test and size).

Usage: benchtable.py build/lab/runs/verbs-bench/guest1/console.log
"""
import collections
import math
import sys

import statistics

runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1], errors="replace"):
    f = line.split()
    if len(f) == 5 and f[0] == "BENCH":
        _, tool, test, size, val = f
        v = float(val)
        if math.isfinite(v):  # perftest sometimes prints inf under TCG
            runs[(test, int(size))][tool].append(v)
# The median over the repetitions.
res = {k: {tool: statistics.median(v) for tool, v in d.items() if v} for k, d in runs.items()}

def fmt(v):
    return "–" if v is None else f"{v:.2f}"


tests = ["write_lat", "read_lat", "send_lat", "write_bw", "read_bw"]
for test in tests:
    rows = sorted(s for (t, s) in res if t == test)
    if not rows:
        continue
    lat = test.endswith("_lat")
    unit = "t_typical [µs]" if lat else "BW average [MB/s]"
    print(f"\n### {test} ({unit})\n")
    if lat:
        print("| bytes | perftest | rdmaperf C loop | ratio C/perftest | rdmaperf Go loop | ratio Go/perftest |")
        print("|---:|---:|---:|---:|---:|---:|")
    else:
        print("| bytes | perftest | rdmaperf | ratio rdmaperf/perftest |")
        print("|---:|---:|---:|---:|")
    for s in rows:
        r = res[(test, s)]
        p = r.get("perftest")
        def cell(tool):
            v = r.get(tool)
            if v is None:
                return "–", "–"
            ratio = f"{v / p:.2f}" if p else "–"
            return f"{v:.2f}", ratio
        if lat:
            c, cr = cell("rdmaperf-c")
            g, gr = cell("rdmaperf-go")
            print(f"| {s} | {fmt(p)} | {c} | {cr} | {g} | {gr} |")
        else:
            g, gr = cell("rdmaperf-go")
            print(f"| {s} | {fmt(p)} | {g} | {gr} |")
