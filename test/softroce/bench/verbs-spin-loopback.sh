#!/bin/bash
# lab: guests=1 timeout=1800 gobuild=./cmd/rdmaperf
#
# verbs-spin.sh in loopback: perftest, rdmaperf's Go loop and its C loop
# (and an older build at build/lab/bin/rdmaperf-old, seen here as
# $LAB_BIN/rdmaperf-old, as "old") on rxe0 of one two-vCPU guest, servers
# pinned to CPU 0 and clients to CPU 1, write_lat and send_lat at 2 B,
# REPS times interleaved; the new and the old build swap places every
# repetition, so that neither always runs right after perftest. rdmaperf
# runs with -ctxsw. Results:
#   BENCH <tool> <test> 2 <t_typical usec>
#   CLI <tool> <test>: # context switches per iteration: ...
set -euo pipefail
REPS=6
N=5000

perftest() { # test
	taskset -c 0 ib_$1 -d "$LAB_DEVICE" -x 1 -s 2 -n "$N" >/tmp/pt.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	taskset -c 1 ib_$1 -d "$LAB_DEVICE" -x 1 -s 2 -n "$N" 127.0.0.1 >/tmp/pt.cli 2>&1 || { cat /tmp/pt.cli /tmp/pt.srv; lab_fail "ib_$1 failed"; }
	wait $srv || { cat /tmp/pt.srv; lab_fail "ib_$1 server failed"; }
	lab_bench perftest "$1" 2 /tmp/pt.cli
}

rdmaperf() { # name binary test [client flags]
	local name=$1 bin=$2 t=$3
	shift 3
	taskset -c 0 "$bin" -d "$LAB_DEVICE" -ctxsw >/tmp/rp.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18516
	taskset -c 1 "$bin" -d "$LAB_DEVICE" -ctxsw -t "$t" -s 2 -n "$N" -timeout 5m "$@" 127.0.0.1 >/tmp/rp.cli 2>&1 || { cat /tmp/rp.cli /tmp/rp.srv; lab_fail "$name $t failed"; }
	wait $srv || { cat /tmp/rp.srv; lab_fail "$name $t server failed"; }
	lab_bench "$name" "$t" 2 /tmp/rp.cli
	grep "^#" /tmp/rp.cli | sed "s/^/CLI $name $t: /" || true
}

for rep in $(seq "$REPS"); do
	for t in write_lat send_lat; do
		perftest "$t"
		if [ -x "$LAB_BIN/rdmaperf-old" ] && [ $((rep % 2)) = 1 ]; then
			rdmaperf old "$LAB_BIN/rdmaperf-old" "$t"
			rdmaperf go "$LAB_BIN/rdmaperf" "$t"
		else
			rdmaperf go "$LAB_BIN/rdmaperf" "$t"
			[ ! -x "$LAB_BIN/rdmaperf-old" ] || rdmaperf old "$LAB_BIN/rdmaperf-old" "$t"
		fi
		rdmaperf c "$LAB_BIN/rdmaperf" "$t" -loop c
	done
	echo "== repetition $rep done"
done
