#!/bin/bash
# lab: guests=2 timeout=120
#
# Two guests, each with its own rxe device, exchange RC traffic across the
# lab's Ethernet segment: ibv_rc_pingpong with its receive buffers checked
# (-c), then rping over librdmacm with its payload verified (-V).
set -euo pipefail

server=$(lab_peer 1)
opts=(-d "$LAB_DEVICE" -g 1 -s 4096 -n 200 -c)

if [ "$LAB_ROLE" = server ]; then
	ibv_rc_pingpong "${opts[@]}" &
	pp=$!
	lab_wait_listen 18515
	lab_signal pingpong-ready
	wait $pp || lab_fail "ibv_rc_pingpong server failed"

	lab_rping_server -C 20 -S 1024 -V
else
	lab_wait pingpong-ready
	ibv_rc_pingpong "${opts[@]}" "$server" | tee /tmp/pp
	grep -q '^1638400 bytes in' /tmp/pp || lab_fail "ibv_rc_pingpong moved the wrong amount"
	lab_wait rping-ready
	rping -c -a "$server" -C 20 -S 1024 -V -v | tail -3
	lab_signal rping-done
fi
