#!/bin/bash
# lab: guests=2 timeout=300 gobuild=./cmd/rvmad
#
# rvmad on two SoftRoCE hosts: the guests exchange ibv_rc_pingpong traffic
# (4 KiB SENDs each way) over the lab's network, not loopback. Each guest's
# rvmad must see its own side: sent and received packets both move by at
# least the packets of the traffic. Both scrapes pass promlint, and both
# rvmads exit 0 on SIGTERM. The before/after view is what `make demo` can
# show (the rvmad_demo_* helpers in cmd/rvmad/testdata/lab/helpers.sh).
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
trap 'jobs -p | xargs -r kill 2>/dev/null || true' EXIT

dev=$LAB_DEVICE
series() { echo "$1{device=\"$dev\",port=\"1\"}"; }
size=4096 iters=200

rvmad_demo_begin
before=$RVMAD_DEMO_DIR/before.prom
mtu=$(metric "$before" "$(series rvmad_port_active_mtu_bytes)")
pkts=$(( iters * ( (size + mtu - 1) / mtu ) ))
"$RVMAD" lint --url http://127.0.0.1:9470/metrics

opts=(-d "$dev" -g 1 -s $size -n $iters -c)
if [ "$LAB_ROLE" = server ]; then
	timeout 120 ibv_rc_pingpong "${opts[@]}" >/tmp/pp.srv 2>&1 &
	srv=$!
	lab_wait_listen 18515
	lab_signal pp-ready
	wait $srv || { cat /tmp/pp.srv; lab_fail "ibv_rc_pingpong server failed"; }
else
	lab_wait pp-ready 120
	timeout 120 ibv_rc_pingpong "${opts[@]}" "$(lab_peer 1)" | tee /tmp/pp.cli
	grep -q "^$((size * iters * 2)) bytes in" /tmp/pp.cli || lab_fail "ibv_rc_pingpong moved the wrong amount"
fi

scrape http://127.0.0.1:9470/metrics "$RVMAD_DEMO_DIR/after.prom"
for side in rvmad_hw_sent_packets_total rvmad_hw_received_packets_total; do
	d=$(delta "$before" "$RVMAD_DEMO_DIR/after.prom" "$(series $side)")
	echo "guest $LAB_INDEX: $side +$d; the traffic was $iters x $size B each way = $pkts packets of $mtu B at least"
	ge "$d" "$pkts" || lab_fail "$side moved by $d, less than the $pkts packets of the traffic"
done
rvmad_demo_end
lab_signal "checked-$LAB_INDEX"
lab_wait checked-1 60
lab_wait checked-2 60
echo "PASS rvmad-twoguests (guest $LAB_INDEX)"
