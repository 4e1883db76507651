#!/bin/bash
# lab: guests=2 timeout=420 make=sockpreload gobuild=./cmd/rvmad,./cmd/aa-dht,./cmd/rvmacat,./cmd/jbmtcat
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

# Active Access: the distributed hash table of the paper (section 4.1).
# Guest 1 holds the table; guest 2 inserts 500 keys (5% collide) as active
# puts that guest 1's kernel module diverts to a handler, which inserts
# them; guest 2 then looks a few up with plain RDMA READs, and guest 1
# checks that every key is there exactly once.
if [ "$LAB_ROLE" = server ]; then
	say "guest 1: serving an Active Access hash table (the module intercepts the table's pages)"
	"$LAB_BIN/aa-dht" serve -table aa -addr "$LAB_ADDR:7790" -n 500 -collisions 0.05 \
		-until "$LAB_SHARED/barrier.dht-done" >/tmp/dht.log 2>&1 &
	dht=$!
	for _ in $(seq 200); do grep -qs serving /tmp/dht.log && break; sleep 0.05; done
	lab_signal dht-ready
	wait $dht || { cat /tmp/dht.log; lab_fail "the DHT target failed"; }
	cat /tmp/dht.log
else
	lab_wait dht-ready
	say "guest 2 -> guest 1: 500 inserts as active puts, then 3 lookups as plain gets"
	"$LAB_BIN/aa-dht" insert -table aa -addr "$server:7790" -n 500 -collisions 0.05 -lookups 3
	lab_signal dht-done
fi

# RVMA: guest 1 opens a window on mailbox 0x11FF0011 (epochs of 32 bytes)
# and posts buffers; guest 2 knows only guest 1's address and the mailbox.
# It puts 32 bytes in four 8-byte puts issued last piece first, twice; the
# NIC writes each piece straight into guest 1's buffer, and guest 1 learns
# of each full epoch from its completion pointer.
if [ "$LAB_ROLE" = server ]; then
	say "guest 1: an RVMA window on mailbox 0x11FF0011, 4 buffers, epochs of 32 bytes"
	"$LAB_BIN/rvmacat" -l "$LAB_ADDR:7471" -mailbox 0x11FF0011 -size 64 -threshold 32 -epochs 2 -metrics >/tmp/rvma.log 2>&1 &
	rv=$!
	for _ in $(seq 200); do grep -qs listening /tmp/rvma.log && break; sleep 0.05; done
	lab_signal rvma-ready
	wait $rv || { cat /tmp/rvma.log; lab_fail "the RVMA receiver failed"; }
	grep -v '^#' /tmp/rvma.log | grep -E 'listening|epoch|"|rvma_window_(puts|bytes|epochs_completed)_total|rvma_window_buffers_posted'
else
	lab_wait rvma-ready
	say "guest 2 -> guest 1: 2 x 32 bytes to the mailbox, in 8-byte puts issued in reverse order"
	printf 'RVMA: no buffer addresses here! ' | "$LAB_BIN/rvmacat" -local "$LAB_ADDR:7472" -mailbox 0x11FF0011 -piece 8 -reverse "$server:7471"
	printf 'epoch 1, same mailbox, new buffer' | head -c 32 | "$LAB_BIN/rvmacat" -local "$LAB_ADDR:7472" -mailbox 0x11FF0011 -piece 8 -reverse "$server:7471"
fi

# JBMT: guest 1 serves a 16 MiB file from memory it never pins as a whole
# (registering it pins nothing; each get pins, on both hosts, only the
# pages it moves, while it moves them); guest 2 reads the file with gets
# and checks it against guest 1's checksum.
if [ "$LAB_ROLE" = server ]; then
	say "guest 1: serving a 16 MiB file through JBMT (registered, nothing pinned)"
	head -c $((16 << 20)) /dev/urandom >/tmp/jbmt.img
	sha256sum /tmp/jbmt.img | cut -d' ' -f1 >"$LAB_SHARED/jbmt.sha256"
	"$LAB_BIN/jbmtcat" -serve /tmp/jbmt.img >/tmp/jbmt.log 2>&1 &
	jc=$!
	for _ in $(seq 200); do grep -qs '^token' /tmp/jbmt.log && break; sleep 0.05; done
	cp /tmp/jbmt.log "$LAB_SHARED/jbmt.token"
	echo "pages pinned now: $(cat /sys/kernel/rdmaplus/jbmt/pinned_pages)"
	lab_signal jbmt-ready
	lab_wait jbmt-done
	echo "pages pinned after guest 2's gets: $(cat /sys/kernel/rdmaplus/jbmt/pinned_pages); sections served: $(cat /sys/kernel/rdmaplus/jbmt/sections_served)"
	kill "$jc"
	wait "$jc" || { cat /tmp/jbmt.log; lab_fail "jbmtcat -serve failed"; }
else
	lab_wait jbmt-ready
	read -r _ tok _ size <"$LAB_SHARED/jbmt.token"
	say "guest 2 <- guest 1: $size bytes with JBMT gets of 4 MiB"
	start=$(date +%s.%N)
	got=$("$LAB_BIN/jbmtcat" -get "$server" -token "$tok" -size "$size" | sha256sum | cut -d' ' -f1)
	end=$(date +%s.%N)
	[ "$got" = "$(cat "$LAB_SHARED/jbmt.sha256")" ] || lab_fail "the file read with JBMT differs (sha256 $got)"
	awk -v s="$start" -v e="$end" -v n="$size" 'BEGIN { printf "sha256 matches guest 1: %s bytes in %.2f s\n", n, e - s }'
	lab_signal jbmt-done
fi

# Sockets over RDMA: unmodified iperf3 on both guests under the shim
# (LD_PRELOAD); its TCP connections move to RDMA a moment after they are
# made, brokered by rvmad; the shim's summary says how many bytes went by
# rings, and rxe's counters move by the packets.
shim=$LAB_DIR/build/sockpreload/librdmaplus-sockets.so
if [ "$LAB_ROLE" = server ]; then
	say "guest 1: iperf3 -s under the sockets shim"
	LD_PRELOAD=$shim iperf3 -s -1 -p 5201 >/tmp/iperf3.log 2>&1 &
	ip3=$!
	lab_wait_listen 5201
	lab_signal iperf3-ready
	wait $ip3 || { cat /tmp/iperf3.log; lab_fail "iperf3 -s failed"; }
else
	lab_wait iperf3-ready
	say "guest 2 -> guest 1: iperf3 for 3 s, both ends under the shim"
	d=/sys/class/infiniband/$LAB_DEVICE/ports/1/hw_counters
	p0=$(( $(cat $d/sent_pkts) + $(cat $d/rcvd_pkts) ))
	LD_PRELOAD=$shim RDMAPLUS_SOCKETS_DEBUG=1 iperf3 -c "$server" -p 5201 -t 3 2>&1 |
		grep -E "sender|receiver|rdmaplus-sockets"
	p1=$(( $(cat $d/sent_pkts) + $(cat $d/rcvd_pkts) ))
	echo "rxe packets during iperf3: +$((p1 - p0))"
	[ $((p1 - p0)) -ge 1000 ] || lab_fail "iperf3's bytes did not go by RDMA"
fi

rvmad_demo_end
