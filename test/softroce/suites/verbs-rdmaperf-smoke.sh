#!/bin/bash
# lab: guests=1 timeout=300 gobuild=./cmd/rdmaperf
#
# cmd/rdmaperf in loopback on rxe0: every test at sizes 2 B to 4 KiB, the
# latency tests with every loop; rdmaperf checks the bytes that arrived.
set -euo pipefail
P="$LAB_BIN/rdmaperf"
run() {
	"$P" -d "$LAB_DEVICE" >/tmp/srv 2>&1 &
	srv=$!
	lab_wait_listen 18516
	"$P" -d "$LAB_DEVICE" "$@" -a -max-size 4096 -n 200 127.0.0.1 || { cat /tmp/srv; lab_fail "rdmaperf $* client failed"; }
	wait $srv || { cat /tmp/srv; lab_fail "rdmaperf $* server failed"; }
}
for t in write_lat read_lat send_lat; do
	run -t $t -loop go
	run -t $t -loop go-postsend
	run -t $t -loop c
done
run -t write_bw
run -t read_bw
