#!/bin/bash
# lab: guests=2 smp=1 timeout=1800 gobuild=./cmd/rdmaperf
#
# The Go loop's context switches between two one-vCPU guests: perftest,
# rdmaperf's Go loop and its C loop, send_lat, write_lat and read_lat at
# 8 B, and rdmaperf's rvma_lat (an RVMA put ping-pong), REPS times
# interleaved. rdmaperf runs with -ctxsw, so each side
# prints the context switches per iteration of each of its threads; they
# show whether the Go runtime hands the poller's P between threads
# (pkg/verbs, "Performance"). An older build placed at
# build/lab/bin/rdmaperf-old (seen here as $LAB_BIN/rdmaperf-old) runs
# too, as "old", for an A/B in the same boot. Results:
#   BENCH <tool> <test> 8 <t_typical usec>    (guest 2)
#   CLI|SRV <tool> <test> 8: # context switches per iteration: ...
set -euo pipefail
REPS=3
server=$(lab_peer 1)

perftest() { # test
	lab_pair perftest 18515 "$1" 8 ib_$1 -d "$LAB_DEVICE" -x 1 -s 8 -n 500 -- ib_$1 -d "$LAB_DEVICE" -x 1 -s 8 -n 500 "$server"
}

rdmaperf() { # name binary test [client flags]
	local name=$1 bin=$2 t=$3
	shift 3
	lab_pair "$name" 18516 "$t" 8 "$bin" -d "$LAB_DEVICE" -ctxsw -timeout 10m -- "$bin" -d "$LAB_DEVICE" -ctxsw -t "$t" -s 8 -n 500 -timeout 10m "$@" "$server"
}

for rep in $(seq "$REPS"); do
	for t in send_lat write_lat read_lat rvma_lat; do
		[ "$t" = rvma_lat ] || perftest "$t"
		rdmaperf go "$LAB_BIN/rdmaperf" "$t"
		[ ! -x "$LAB_BIN/rdmaperf-old" ] || rdmaperf old "$LAB_BIN/rdmaperf-old" "$t"
		[ "$t" = rvma_lat ] || rdmaperf c "$LAB_BIN/rdmaperf" "$t" -loop c
	done
	[ "$LAB_ROLE" = server ] || echo "== repetition $rep done"
done
