#!/bin/bash
# lab: guests=1 timeout=1800 gobuild=./cmd/rdmaperf
#
# verbs-spin.sh in loopback: perftest, rdmaperf's Go loop through send
# plans ("go"), the same with one QP.PostSend per post ("postsend"), its C
# loop (and an older build at build/lab/bin/rdmaperf-old, seen here as
# $LAB_BIN/rdmaperf-old, as "old") on rxe0 of one two-vCPU guest, servers
# pinned to CPU 0 and clients to CPU 1, write_lat, send_lat and read_lat
# at 2 B, REPS times interleaved; the Go variants swap places every
# repetition, so that none always runs right after perftest. rdmaperf
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
	for t in write_lat send_lat read_lat; do
		perftest "$t"
		if [ $((rep % 2)) = 1 ]; then
			[ ! -x "$LAB_BIN/rdmaperf-old" ] || rdmaperf old "$LAB_BIN/rdmaperf-old" "$t"
			rdmaperf postsend "$LAB_BIN/rdmaperf" "$t" -loop go-postsend
			rdmaperf go "$LAB_BIN/rdmaperf" "$t"
		else
			rdmaperf go "$LAB_BIN/rdmaperf" "$t"
			rdmaperf postsend "$LAB_BIN/rdmaperf" "$t" -loop go-postsend
			[ ! -x "$LAB_BIN/rdmaperf-old" ] || rdmaperf old "$LAB_BIN/rdmaperf-old" "$t"
		fi
		rdmaperf c "$LAB_BIN/rdmaperf" "$t" -loop c
	done
	echo "== repetition $rep done"
done
