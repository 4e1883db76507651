#!/bin/bash
# lab: guests=1 timeout=900 gobuild=./cmd/jbmtperf
#
# Where a JBMT get's time goes at every size, the JBMT report's Figures 6
# and 7: cmd/jbmtperf -t async with a window of one, over loopback, 8 B to
# 4 MiB; for each size the medians of 100 gets of each stage the
# completion times: queued (submitted until a kernel worker began it), the
# first section's round trip (pins on both sides, the sink's registration,
# the request, the peer's write and answer), the rest of the sections,
# and the caller's wake-up. Two repetitions. The window-one bandwidth it
# also prints is over at most 64 KiB (small sizes) or 4 MiB.
set -euo pipefail
for rep in 1 2; do
	echo "# repetition $rep"
	"$LAB_BIN/jbmtperf" -t async -addr "$LAB_ADDR" -min 8 -max 32768 -bytes 65536 -window 1 -n 100
	"$LAB_BIN/jbmtperf" -t async -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((4 << 20)) -window 1 -n 100
done
