#!/bin/bash
# lab: guests=3 timeout=150
#
# Three guests on one segment: guests 1 and 3 exchange RDMA traffic
# (ib_write_bw, then ibv_ud_pingpong with address handles), while guest 2 checks
# it can reach both over IP: the segment really joins all three.
set -euo pipefail

g1=$(lab_peer 1)
g3=$(lab_peer 3)
case "$LAB_INDEX" in
1)
	ib_write_bw -F -d "$LAB_DEVICE" -x 1 -s 4096 -n 200 >/tmp/bw 2>&1 &
	bw=$!
	lab_wait_listen 18515
	lab_signal bw-ready
	wait $bw || { cat /tmp/bw; lab_fail "ib_write_bw server failed"; }
	ibv_ud_pingpong -d "$LAB_DEVICE" -g 1 -s 1024 -n 100 &
	ud=$!
	lab_wait_listen 18515
	lab_signal ud-ready
	wait $ud || lab_fail "ibv_ud_pingpong server failed"
	;;
2)
	ping -c 2 -W 5 "$g1"
	ping -c 2 -W 5 "$g3"
	;;
3)
	lab_wait bw-ready
	ib_write_bw -F -d "$LAB_DEVICE" -x 1 -s 4096 -n 200 "$g1" | tee /tmp/bw
	grep -qE '^ *4096 +200 ' /tmp/bw || lab_fail "ib_write_bw printed no result line"
	lab_wait ud-ready
	ibv_ud_pingpong -d "$LAB_DEVICE" -g 1 -s 1024 -n 100 "$g1"
	;;
esac
