#!/bin/bash
# lab: guests=1 timeout=2400 gobuild=./cmd/rdmaperf
#
# cmd/rdmaperf against perftest in the same boot, loopback on rxe0:
# ib_write_lat, ib_read_lat, ib_send_lat (t_typical) and ib_write_bw,
# ib_read_bw (BW average), sizes 2 B to 64 KiB. rdmaperf runs each latency
# test twice: its Go loop over the pkg/verbs API ("go") and perftest's loop
# in C on the same pkg/verbs objects ("c"). Servers are pinned to CPU 0 and
# clients to CPU 1 (two spinning processes on one vCPU turn microseconds
# into milliseconds). The tools run interleaved, size by size, BENCH_REPS
# times, so a noisy host hits them alike; every result
# is printed as a line
#   BENCH <tool> <test> <bytes> <t_typical usec | MB/s Mpps>
# which cmd/rdmaperf/benchtable turns into tables (medians).
#
# The defaults are the run docs/benchmarks.md records (about 28 minutes
# under TCG); BENCH_REPS=1 BENCH_SIZES="2 4096 65536" gives a quick look.
set -euo pipefail
P="$LAB_BIN/rdmaperf"
N=${BENCH_ITERS:-1000}
REPS=${BENCH_REPS:-3}
SIZES=${BENCH_SIZES:-"2 16 128 1024 4096 16384 65536"}

perftest() { # test size
	local t=$1 s=$2
	taskset -c 0 ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$N" >/tmp/pt.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	taskset -c 1 ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$N" 127.0.0.1 >/tmp/pt.cli 2>&1 || { cat /tmp/pt.cli /tmp/pt.srv; lab_fail "ib_$t -s $s failed"; }
	wait $srv || { cat /tmp/pt.srv; lab_fail "ib_$t server -s $s failed"; }
	lab_bench perftest "$t" "$s" /tmp/pt.cli
}

rdmaperf() { # test size loop
	local t=$1 s=$2 loop=$3
	taskset -c 0 "$P" -d "$LAB_DEVICE" >/tmp/rp.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18516
	taskset -c 1 "$P" -d "$LAB_DEVICE" -t "$t" -loop "$loop" -s "$s" -n "$N" -timeout 5m 127.0.0.1 >/tmp/rp.cli 2>&1 || { cat /tmp/rp.cli /tmp/rp.srv; lab_fail "rdmaperf $t -s $s -loop $loop failed"; }
	wait $srv || { cat /tmp/rp.srv; lab_fail "rdmaperf $t server failed"; }
	lab_bench "rdmaperf-$loop" "$t" "$s" /tmp/rp.cli
}

nproc
cat /sys/devices/system/clocksource/clocksource0/current_clocksource
for rep in $(seq "$REPS"); do
	for t in write_lat read_lat send_lat write_bw read_bw; do
		for s in $SIZES; do
			case $t in
			*_lat) perftest "$t" "$s"; rdmaperf "$t" "$s" c; rdmaperf "$t" "$s" go ;;
			*) perftest "$t" "$s"; rdmaperf "$t" "$s" go ;;
			esac
		done
	done
	echo "== repetition $rep done"
done
