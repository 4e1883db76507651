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
trap 'jobs -p | xargs -r kill 2>/dev/null || true' EXIT
so=$LAB_DIR/build/sockpreload/librdmaplus-sockets.so
[ -f "$so" ] || lab_fail "the shim is missing (make sockpreload)"
rvmad_sockets_start /tmp/rvmad.log
shim() { LD_PRELOAD=$so RDMAPLUS_SOCKETS_DEBUG=1 "$@"; }

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
	lab_wait servers-ready 120
	peer=$(lab_peer 1)
	for args in "-t 4" "-t 4 -R" "-t 4 -P 4"; do
		p0=$(rxe_packets)
		rc=0
		shim timeout 200 iperf3 -c "$peer" -p 5201 $args >/tmp/iperf3.cli 2>&1 || rc=$?
		p1=$(rxe_packets)
		grep -E "sender|receiver|ring_read|error" /tmp/iperf3.cli || true
		[ $rc -eq 0 ] || { cat /tmp/iperf3.cli; lab_fail "iperf3 $args failed (status $rc)"; }
		echo "iperf3 $args: rxe packets +$((p1 - p0))"
		[ $((p1 - p0)) -ge 4096 ] || lab_fail "iperf3 $args: rxe moved only $((p1 - p0)) packets: not by RDMA"
	done
	p0=$(rxe_packets)
	rc=0
	echo "T:$peer:11111" >/tmp/feed
	shim timeout 120 sockperf ping-pong -f /tmp/feed -F poll -t 5 -m 64 >/tmp/sockperf.cli 2>&1 || rc=$?
	p1=$(rxe_packets)
	grep -E "Summary|percentile 50.000|percentile 99.000|ring_read" /tmp/sockperf.cli || true
	[ $rc -eq 0 ] || { cat /tmp/sockperf.cli; lab_fail "sockperf failed (status $rc)"; }
	echo "sockperf: rxe packets +$((p1 - p0))"
	[ $((p1 - p0)) -ge 1000 ] || lab_fail "sockperf: rxe moved only $((p1 - p0)) packets: not by RDMA"
	p0=$(rxe_packets)
	rc=0
	shim timeout 120 sockperf ping-pong --tcp -i "$peer" -p 11112 -t 5 -m 64 >/tmp/sockperf-epoll.cli 2>&1 || rc=$?
	p1=$(rxe_packets)
	grep -E "Summary|percentile 50.000|percentile 99.000|ring_read" /tmp/sockperf-epoll.cli || true
	[ $rc -eq 0 ] || { cat /tmp/sockperf-epoll.cli; lab_fail "sockperf (epoll) failed (status $rc)"; }
	echo "sockperf (epoll): rxe packets +$((p1 - p0))"
	[ $((p1 - p0)) -ge 1000 ] || lab_fail "sockperf (epoll): rxe moved only $((p1 - p0)) packets: not by RDMA"
	lab_signal clients-done
fi
echo "PASS sockets-iperf3 (guest $LAB_INDEX)"
