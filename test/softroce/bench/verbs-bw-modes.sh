#!/bin/bash
# lab: guests=1 timeout=2400 gobuild=./cmd/rdmaperf
#
# Small-write bandwidth on rxe0 loopback, the ways one can post: perftest's
# ib_write_bw with one work request per call (its default) and with
# --post_list 100; rdmaperf's Go loop with its default chains (-l 0) and
# with one work request per call (-l 1), each pinned (server CPU 0, client
# CPU 1, GOMAXPROCS 1 as Go derives it for a pinned process; rdmaperf's
# own default is 2) and free (no taskset). Interleaved size by
# size, three repetitions, every result printed as
#   BENCH <tool> write_bw <bytes> <BW average MB/s>
# (docs/benchmarks.md, "pkg/verbs: rdmaperf against perftest", the
# paragraph after the table). About 12 minutes.
set -euo pipefail
P="$LAB_BIN/rdmaperf"
pt() { # name size args
	local name=$1 s=$2; shift 2
	taskset -c 0 ib_write_bw -d "$LAB_DEVICE" -x 1 -s "$s" -n 5000 "$@" >/tmp/pt.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	taskset -c 1 ib_write_bw -d "$LAB_DEVICE" -x 1 -s "$s" -n 5000 "$@" 127.0.0.1 >/tmp/pt.cli 2>&1 || { cat /tmp/pt.cli /tmp/pt.srv; lab_fail "ib_write_bw -s $s $* failed"; }
	wait $srv || { cat /tmp/pt.srv; lab_fail "ib_write_bw server -s $s $* failed"; }
	lab_bench "$name" write_bw "$s" /tmp/pt.cli
}
rp() { # name pin size args
	local name=$1 pin=$2 s=$3; shift 3
	local ts0="" ts1=""
	if [ "$pin" = pin ]; then ts0="env GOMAXPROCS=1 taskset -c 0"; ts1="env GOMAXPROCS=1 taskset -c 1"; fi
	$ts0 "$P" -d "$LAB_DEVICE" -timeout 10m >/tmp/rp.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18516
	$ts1 "$P" -d "$LAB_DEVICE" -t write_bw -s "$s" -n 5000 -timeout 10m "$@" 127.0.0.1 >/tmp/rp.cli 2>&1 || { cat /tmp/rp.cli /tmp/rp.srv; lab_fail "rdmaperf failed"; }
	wait $srv
	lab_bench "$name" write_bw "$s" /tmp/rp.cli
}
for rep in 1 2 3; do
  for s in 128 1024 4096; do
    pt perftest $s
    pt perftest-l100 $s -l 100
    rp rp-pin pin $s
    rp rp-free free $s
    rp rp-free-l1 free $s -l 1
    rp rp-pin-l1 pin $s -l 1
  done
done
