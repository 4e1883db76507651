#!/bin/bash
# lab: guests=1 timeout=1500 gobuild=./cmd/rdmaperf
#
# cmd/rdmaperf against perftest in the same boot, loopback on rxe0, sizes
# 2 B to 64 KiB: ib_write_lat, ib_read_lat, ib_send_lat (t_typical) and
# ib_write_bw, ib_read_bw (BW average). rdmaperf runs each latency test
# twice: its Go loop over the pkg/verbs API and perftest's loop in C on the
# same pkg/verbs objects. Every result is printed as a line
#   BENCH <tool> <test> <bytes> <t_typical usec | MB/s>
# for cmd/rdmaperf/BENCHMARKS.md.
set -euo pipefail
P="$LAB_BIN/rdmaperf"
N=${BENCH_ITERS:-1000}
SIZES="2 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32768 65536"

perftest() { # test size
	local t=$1 s=$2 col=5
	case $t in *_bw) col=4 ;; esac
	ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$N" >/tmp/pt.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$N" 127.0.0.1 >/tmp/pt.cli 2>&1 || { cat /tmp/pt.cli /tmp/pt.srv; lab_fail "ib_$t -s $s failed"; }
	wait $srv || { cat /tmp/pt.srv; lab_fail "ib_$t server -s $s failed"; }
	awk -v t="$t" -v s="$s" -v c="$col" '$1 == s && $2 ~ /^[0-9]+$/ { print "BENCH perftest", t, s, $c }' /tmp/pt.cli
}

rdmaperf() { # tool-name test loop
	local name=$1 t=$2 loop=$3 col=5
	case $t in *_bw) col=4 ;; esac
	"$P" -d "$LAB_DEVICE" >/tmp/rp.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18516
	"$P" -d "$LAB_DEVICE" -t "$t" -loop "$loop" -a -max-size 65536 -n "$N" -timeout 10m 127.0.0.1 >/tmp/rp.cli 2>&1 || { cat /tmp/rp.cli /tmp/rp.srv; lab_fail "rdmaperf $t failed"; }
	wait $srv || { cat /tmp/rp.srv; lab_fail "rdmaperf $t server failed"; }
	cat /tmp/rp.cli
	awk -v n="$name" -v t="$t" -v c="$col" '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { print "BENCH", n, t, $1, $c }' /tmp/rp.cli
}

for t in write_lat read_lat send_lat write_bw read_bw; do
	echo "== $t"
	for s in $SIZES; do
		perftest "$t" "$s"
	done
	rdmaperf rdmaperf-go "$t" go
	case $t in *_lat) rdmaperf rdmaperf-c "$t" c ;; esac
done
