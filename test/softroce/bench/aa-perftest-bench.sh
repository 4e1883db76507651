#!/bin/bash
# lab: guests=2 smp=1 timeout=900 gobuild=./test/softroce/bench/aa-usecase-bench
#
# Active Access logging cost seen by an unmodified perftest source, in one
# boot of two guests (guest 1 the target, guest 2 the client), by
# test/softroce/bench/aa-usecase-bench perftest: ib_read_bw and ib_write_bw (4 KiB) against
# a stock perftest server on guest 1 (the anchor) and against seven pages
# of an Active Access target answering perftest's side channel
# (pkg/activeaccess/perftest): a page with no actions (the module's hooks
# armed for the other pages), pages logging metadata (RL|WL) and pages
# logging the data (RLD|WLD), handled by a counting handler whose runtime
# is woken per entry (meta, data), adaptively (meta-a, data-a: the default,
# 250 µs) or coalesced: after 64 entries or 1 ms (meta-c, data-c). Rounds rotate
# the order; the figures are medians of per-round ratios to the page with
# no actions (the logging overhead; paper: 1-5%, target: at most 10%) and
# of stock to that page (what serving through the target costs).
#
# Every figure is a line "FIGURE <name> <value> <unit>", kept in
# $LAB_OUT/aa-perftest-bench.txt.
set -euo pipefail
out="$LAB_OUT/aa-perftest-bench.txt"
: >"$out"
run() { lab_tee "$out" "$LAB_BIN/aa-usecase-bench" "$@"; }
run perftest -verb read -size 4096 -iters ${PT_ITERS:-2000} -rounds ${PT_ROUNDS:-9}
run perftest -verb write -size 4096 -iters ${PT_ITERS:-2000} -rounds ${PT_ROUNDS:-9}
echo "== figures (guest $LAB_INDEX)"
grep '^FIGURE' "$out" || echo "(none here: the other guest printed them)"
