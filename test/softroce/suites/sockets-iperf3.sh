#!/bin/bash
# lab: guests=2 timeout=600 make=sockpreload gobuild=./cmd/rvmad
#
# Unmodified Debian programs under the sockets shim between two guests,
# with rvmad's broker on both: iperf3 (4 s one way, then reversed with
# -R, then four streams with -P 4) and sockperf's ping-pong (with poll,
# then with epoll, its default).
# Each run must go by RDMA: rxe's packet counters move by at least the
# bytes' packets, and the shim's summaries show the bytes read from rings.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
sockets_need "$SHIM"
sockets_begin

if [ "$LAB_ROLE" = server ]; then
	shim iperf3 -s -p 5201 >/tmp/iperf3.srv 2>&1 &
	echo "T:$LAB_ADDR:11111" >/tmp/feed	# -F (poll) needs a feed file
	shim sockperf server -f /tmp/feed -F poll >/tmp/sockperf.srv 2>&1 &
	shim sockperf server --tcp -i "$LAB_ADDR" -p 11112 >/tmp/sockperf-epoll.srv 2>&1 &
	lab_wait_listen 5201
	lab_wait_listen 11111
	lab_wait_listen 11112
	lab_signal servers-ready
	lab_wait clients-done 500
	grep "ring_read" /tmp/iperf3.srv | tail -1 || true
else
	wait_peer servers-ready
	for args in "-t 4" "-t 4 -R" "-t 4 -P 4"; do
		by_rdma -s "sender|receiver|ring_read|error" "iperf3 $args" 4096 shim timeout 200 iperf3 -c "$peer" -p 5201 $args
	done
	echo "T:$peer:11111" >/tmp/feed
	sp="Summary|percentile 50.000|percentile 99.000|ring_read"
	by_rdma -s "$sp" sockperf 1000 shim timeout 120 sockperf ping-pong -f /tmp/feed -F poll -t 5 -m 64
	by_rdma -s "$sp" "sockperf (epoll)" 1000 shim timeout 120 sockperf ping-pong --tcp -i "$peer" -p 11112 -t 5 -m 64
	lab_signal clients-done
fi
echo "PASS sockets-iperf3 (guest $LAB_INDEX)"
