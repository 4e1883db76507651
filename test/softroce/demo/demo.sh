#!/bin/bash
# lab: guests=2 timeout=240 gobuild=./cmd/rvmad
#
# `make demo`: two SoftRoCE hosts. Each shows its rxe device and our kernel
# module and starts rvmad; then they move data between them over RDMA and
# check it, and rvmad shows which counters moved.
# Later parts of the stack add their own acts below.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"

say() { printf '\n== %s\n' "$*"; }
server=$(lab_peer 1)

say "guest $LAB_INDEX ($LAB_ADDR, kernel $LAB_KERNEL): RDMA devices"
rdma link show
ibv_devinfo -d "$LAB_DEVICE" | grep -E 'hca_id|state|active_mtu|link_layer'
say "guest $LAB_INDEX: our kernel module"
grep rdmaplus /proc/modules
ls -l "$LAB_KMOD_DEV"
rvmad_demo_begin

if [ "$LAB_ROLE" = server ]; then
	lab_rping_server -C 5 -S 64 -V
	ibv_rc_pingpong -d "$LAB_DEVICE" -g 1 -s 4096 -n 200 -c >/dev/null &
	pp=$!
	lab_wait_listen 18515
	lab_signal pingpong-ready
	wait $pp
else
	say "guest 2 -> guest 1: rping over librdmacm (RDMA READ and WRITE), payload verified"
	lab_wait rping-ready
	rping -c -a "$server" -C 5 -S 64 -V -v
	lab_signal rping-done
	say "guest 2 <-> guest 1: ibv_rc_pingpong, 200 x 4 KiB each way, receive buffers checked"
	lab_wait pingpong-ready
	ibv_rc_pingpong -d "$LAB_DEVICE" -g 1 -s 4096 -n 200 -c "$server"
fi

rvmad_demo_end
