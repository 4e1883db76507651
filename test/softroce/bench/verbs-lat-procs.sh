#!/bin/bash
# lab: guests=1 timeout=2400 gobuild=./cmd/rdmaperf
#
# The Go loop's latency against GOMAXPROCS, loopback on rxe0: perftest's
# ib_write_lat, ib_read_lat, ib_send_lat and rdmaperf's Go loop with
# GOMAXPROCS=1 (what Go derives for a process pinned to one CPU) and
# GOMAXPROCS=2 (rdmaperf's default), server on CPU 0 and client on
# CPU 1, sizes 2 B to 4 KiB, interleaved, three repetitions; every result
# printed as
#   BENCH <tool> <test> <bytes> <t_typical usec>
# (docs/benchmarks.md, "pkg/verbs: rdmaperf against perftest", the
# paragraph after the table). About 6 minutes.
set -euo pipefail
P="$LAB_BIN/rdmaperf"
N=1000
perftest() { local t=$1 s=$2
	taskset -c 0 ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$N" >/tmp/pt.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	taskset -c 1 ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$N" 127.0.0.1 >/tmp/pt.cli 2>&1 || { cat /tmp/pt.cli /tmp/pt.srv; lab_fail "ib_$t -s $s failed"; }
	wait $srv || true
	lab_bench perftest "$t" "$s" /tmp/pt.cli
}
rdmaperf() { local t=$1 s=$2 procs=$3
	GOMAXPROCS=$procs taskset -c 0 "$P" -d "$LAB_DEVICE" >/tmp/rp.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18516
	GOMAXPROCS=$procs taskset -c 1 "$P" -d "$LAB_DEVICE" -t "$t" -loop go -s "$s" -n "$N" -timeout 5m 127.0.0.1 >/tmp/rp.cli 2>&1 || { cat /tmp/rp.cli /tmp/rp.srv; lab_fail "rdmaperf failed"; }
	wait $srv || true
	lab_bench "rdmaperf-p$procs" "$t" "$s" /tmp/rp.cli
}
for rep in 1 2 3; do
	for t in write_lat read_lat send_lat; do
		for s in 2 128 1024 4096; do
			perftest $t $s; rdmaperf $t $s 1; rdmaperf $t $s 2
		done
	done
done
