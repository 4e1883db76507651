#!/bin/bash
# lab: guests=4 timeout=150
#
# The largest boot the lab offers: four guests on one segment each reach
# every other over IP, and guests 1 and 4 exchange RC traffic with the
# receive buffers checked.
set -euo pipefail

for a in $LAB_PEERS; do
	ping -c 1 -W 10 "$a" >/dev/null || lab_fail "guest $LAB_INDEX cannot reach $a"
done
echo "guest $LAB_INDEX reached $LAB_PEERS"

case "$LAB_INDEX" in
1)
	ibv_rc_pingpong -d "$LAB_DEVICE" -g 1 -s 4096 -n 50 -c &
	pp=$!
	lab_wait_listen 18515
	lab_signal pingpong-ready
	wait $pp || lab_fail "ibv_rc_pingpong server failed"
	;;
4)
	lab_wait pingpong-ready
	ibv_rc_pingpong -d "$LAB_DEVICE" -g 1 -s 4096 -n 50 -c "$(lab_peer 1)" | tee /tmp/pp
	grep -q '^409600 bytes in' /tmp/pp || lab_fail "ibv_rc_pingpong moved the wrong amount"
	;;
esac
