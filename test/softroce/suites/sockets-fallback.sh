#!/bin/bash
# lab: guests=2 timeout=150 make=sockpreload gobuild=./cmd/rvmad
#
# Sockets over RDMA, the fallback matrix (docs/sockets.md, "Faults"):
# what the shim does when RDMA does not fit or goes away, between two
# guests, with bulk (cmd/sockpreload/test/bulk.c: every byte each way
# checked, the client prints "ok bulk"). Guest 1 serves, guest 2 is the
# client; both run rvmad with its sockets broker unless a case stops it.
# The path is proven on guest 2 by rxe's packet counters (rxe_packets)
# and the TCP segment counters (/proc/net/snmp) before and after each
# case; with two guests, every rxe packet of guest 2 is one of the case's.
#
#  1. the shim on the client only, then on the server only: the plain
#     peer only ever sees TCP, rxe moves nothing, bytes right;
#  2. rvmad stopped on guest 1, then on both: new connections stay on
#     TCP, rxe moves nothing, bytes right;
#  3. rvmad killed (SIGKILL) on guest 2 in the middle of a transfer
#     proven on RDMA: it ends with every byte right, on RDMA or demoted;
#  4. guest 2's client killed (SIGKILL) mid-stream, while guest 1's server
#     reads from its ring: the server gets end of file or ECONNRESET
#     within 15 s, never a hang, and every byte it got was right; then
#     the other way, guest 1's server killed while the client writes into
#     its ring: the writer fails with ECONNRESET or EPIPE within 20 s (the
#     anchor ends without a FIN on the ring, the shim probes the QP, which
#     fails), never a hang;
#  4c. guest 2's link down for 6 s in the middle of a transfer proven on
#     RDMA: both QPs exhaust their retries (about 4 s) and fail, both
#     sides demote (qp_error) while TCP waits, and once the link is back
#     TCP carries the rest, every byte delivered;
#  5. the rxe link deleted (rdma link delete) on guest 2 in the middle of
#     a transfer proven on RDMA: rxe has no disassociate_ucontext, so the
#     kernel's removal waits until every process holding the device
#     closed it. rvmad sees the removal begin (the uverbs device's
#     uevent) and tells the shim (DEVICE), which demotes the connection
#     and closes the device: the delete returns within 20 s while the
#     transfer goes on over TCP, every byte delivered, no kernel report
#     (the lab's verdict).
# The suite fails, never skips, without an RDMA device.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
trap 'jobs -p | xargs -r kill -9 2>/dev/null || true' EXIT
dir=$LAB_DIR/build/sockpreload
so=$dir/librdmaplus-sockets.so
bulk=$dir/bulk
[ -x "$bulk" ] && [ -f "$so" ] || lab_fail "$dir: the shim or bulk is missing (make sockpreload)"
[ -n "${LAB_DEVICE:-}" ] && [ -d "/sys/class/infiniband/$LAB_DEVICE" ] ||
	lab_fail "no RDMA device (LAB_DEVICE=${LAB_DEVICE:-}): the fallback matrix needs rxe to prove the path"
MiB=$((1 << 20))

# A command under the shim: "${shim[@]}" CMD; env execs CMD, so after
# "${shim[@]}" CMD &, $! is CMD's pid (a shell function's would be a subshell's).
shim=(env LD_PRELOAD="$so" RDMAPLUS_SOCKETS_ATTACH_MS=0 RDMAPLUS_SOCKETS_DEBUG=2)
# The value of counter NAME in the shim's exit summary in FILE (0 if none).
summary() {
	local v
	v=$(sed -n "s/^rdmaplus-sockets: pid [0-9]*: connections .* $1=\([0-9]*\).*/\1/p" "$2" | sort -n | tail -1)
	echo "${v:-0}"
}
# wait_line FILE REGEX SECS: until a line of FILE matches (false after SECS).
wait_line() {
	local n=0
	until grep -Eq "$2" "$1" 2>/dev/null; do
		n=$((n + 1))
		[ $n -le $(($3 * 20)) ] || return 1
		sleep 0.05
	done
}
# wait_exit PID SECS: until process PID ended (false after SECS).
wait_exit() {
	local n=0
	while kill -0 "$1" 2>/dev/null; do
		n=$((n + 1))
		[ $n -le $(($2 * 20)) ] || return 1
		sleep 0.05
	done
}
now_ms() { local s; read -r s _ </proc/uptime; echo "${s/./}0"; }
show() { sed "s/^/    $1: /" "$2"; }
# serve PORT N [EVENT]: bulk server under the shim on PORT, its output in
# /tmp/sN.srv, its pid in srv; once it listens, signal EVENT (if given).
serve() {
	"${shim[@]}" "$bulk" server -p "$1" >"/tmp/s$2.srv" 2>&1 &
	srv=$!
	lab_wait_listen "$1"
	[ -z "${3:-}" ] || lab_signal "$3"
}

rvmad_sockets_start /tmp/rvmad.log

if [ "$LAB_ROLE" = server ]; then
	"$bulk" server -p 7601 >/tmp/s1.srv 2>&1 &
	"${shim[@]}" "$bulk" server -p 7602 >/tmp/s2.srv 2>&1 &
	lab_wait_listen 7601
	lab_wait_listen 7602
	lab_signal c1-ready

	# 2: rvmad stopped here, then on both; a fresh server without it.
	lab_wait c1-done 60
	rvmad_stop
	serve 7603 3 c2-ready
	lab_wait c2-done 60
	rvmad_sockets_start /tmp/rvmad.log2
	lab_signal c2-rvmad

	# 3: rvmad killed on guest 2 mid-transfer.
	serve 7604 4 c3-ready

	# 4a: guest 2's client killed while it sends: this server reads.
	serve 7605 5 c4a-ready
	lab_wait c4a-killed 60
	t0=$(now_ms)
	wait_exit $srv 15 || { show "guest 1 server" /tmp/s5.srv; lab_fail "4a: the server still runs 15 s after its peer was killed: a hang"; }
	rc=0
	wait $srv || rc=$?
	echo "4a: the server ended $(($(now_ms) - t0)) ms after guest 2 killed its peer (status $rc)"
	show "guest 1 server" /tmp/s5.srv
	[ $rc -ne 0 ] || lab_fail "4a: the server's read ended cleanly, yet its peer was killed mid-stream"
	grep -q 'byte [0-9]* is' /tmp/s5.srv && lab_fail "4a: the server read a wrong byte"
	grep -Eq 'end of file at|Connection reset' /tmp/s5.srv ||
		lab_fail "4a: the server did not end with end of file or ECONNRESET"

	# 4b: this server killed while guest 2's client writes into its ring.
	serve 7606 6 c4b-ready
	lab_wait c4b-mid 60
	kill -9 $srv
	wait $srv 2>/dev/null || true
	lab_signal c4b-killed

	# 4c: guest 2's link goes down for 6 s mid-transfer.
	serve 7608 8 c4c-ready
	lab_wait c4c-done 90
	grep -E 'DEMOTE|QP' /tmp/s8.srv | head -5 || true
	kill $srv
	wait $srv 2>/dev/null || true
	! grep -q FAIL /tmp/s8.srv || { show "guest 1 server" /tmp/s8.srv; lab_fail "4c: the server failed across the link's outage"; }

	# 5: guest 2 deletes its rxe link mid-transfer; count this side's packets.
	serve 7607 7
	rxe_packets >"$LAB_SHARED/c5.g1p0"
	lab_signal c5-ready
	lab_wait c5-done 90
	rxe_packets >"$LAB_SHARED/c5.g1p1"
	show "guest 1 server" /tmp/s7.srv
	lab_signal c5-counted
	lab_wait all-done 60
	echo "--- rvmad"
	tail -15 /tmp/rvmad.log2
else
	peer=$(lab_peer 1)
	lab_wait c1-ready 60

	# client BYTES PORT LOG [under-shim: 1/0]: one bulk run, counted.
	# Sets RC, DP (rxe packets), DT (TCP segments), MS (duration).
	client() {
		local n=$1 port=$2 log=$3 sh=$4 p0 t0 ms0
		p0=$(rxe_packets) t0=$(tcp_segs) ms0=$(now_ms) RC=0
		if [ "$sh" = 1 ]; then
			timeout 60 "${shim[@]}" "$bulk" client -p "$port" -n "$n" -r 50 -w 300 "$peer" >"$log" 2>&1 || RC=$?
		else
			timeout 60 "$bulk" client -p "$port" -n "$n" -r 50 -w 300 "$peer" >"$log" 2>&1 || RC=$?
		fi
		MS=$(($(now_ms) - ms0)) DP=$(($(rxe_packets) - p0)) DT=$(($(tcp_segs) - t0))
	}
	# tcp_only CASE LOG: bytes right, nothing by rxe, TCP carried it.
	tcp_only() {
		echo "$1: status $RC in $MS ms; rxe packets +$DP, TCP segments +$DT; attached=$(summary attached "$2")"
		[ $RC -eq 0 ] && grep -q '^ok bulk' "$2" || { show client "$2"; lab_fail "$1: bulk failed (status $RC)"; }
		[ $DP -eq 0 ] || { show client "$2"; lab_fail "$1: rxe moved $DP packets: something went by RDMA"; }
		[ $DT -ge 400 ] || lab_fail "$1: TCP moved only $DT segments for 2x4 MiB"
		[ "$(summary attached "$2")" = 0 ] || lab_fail "$1: the shim says a connection attached"
	}

	echo "== 1. the shim on one side only"
	client $((4 * MiB)) 7601 /tmp/c1a.log 1
	tcp_only "1a shim client -> plain server" /tmp/c1a.log
	client $((4 * MiB)) 7602 /tmp/c1b.log 0
	tcp_only "1b plain client -> shim server" /tmp/c1b.log
	lab_signal c1-done

	echo "== 2. rvmad stopped on guest 1, then on both"
	lab_wait c2-ready 60
	client $((4 * MiB)) 7603 /tmp/c2a.log 1
	tcp_only "2a rvmad stopped on the server's guest" /tmp/c2a.log
	rvmad_stop
	client $((4 * MiB)) 7603 /tmp/c2b.log 1
	tcp_only "2b rvmad stopped on both guests" /tmp/c2b.log
	rvmad_sockets_start /tmp/rvmad.log2
	lab_signal c2-done
	lab_wait c2-rvmad 60

	# mid CASE PORT LOG: start a 32 MiB shim transfer in the background,
	# wait until it is attached and moved rxe packets; sets BG, P0, T0, PM.
	mid() {
		P0=$(rxe_packets) T0=$(tcp_segs)
		"${shim[@]}" "$bulk" client -p "$2" -n $((32 * MiB)) -r 50 -w 300 "$peer" >"$3" 2>&1 &
		BG=$!
		wait_line "$3" 'ATTACH_REP epoch 1: attached' 10 || { show client "$3"; lab_fail "$1: the connection did not attach"; }
		sleep 0.7
		PM=$(rxe_packets)
		[ $((PM - P0)) -ge 300 ] || { show client "$3"; lab_fail "$1: only $((PM - P0)) rxe packets before the fault: the transfer was not on RDMA"; }
	}

	echo "== 3. rvmad killed on guest 2 mid-transfer"
	lab_wait c3-ready 60
	mid 3 7604 /tmp/c3.log
	kill -9 "$RVMAD_PID"
	wait "$RVMAD_PID" 2>/dev/null || true
	tm=$(tcp_segs) ms0=$(now_ms)
	wait_exit $BG 60 || { show client /tmp/c3.log; lab_fail "3: the transfer did not end within 60 s of rvmad's death"; }
	rc=0
	wait $BG || rc=$?
	p2=$(rxe_packets) t2=$(tcp_segs)
	echo "3: ended $(($(now_ms) - ms0)) ms after rvmad was killed, status $rc; rxe packets +$((PM - P0)) before the kill, +$((p2 - PM)) after; TCP segments +$((tm - T0)) before, +$((t2 - tm)) after; demoted=$(summary demoted /tmp/c3.log)"
	grep -E 'DEMOTE|demot|ABORT|qp|error' /tmp/c3.log | head -5 || true
	[ $rc -eq 0 ] && grep -q '^ok bulk' /tmp/c3.log || { show client /tmp/c3.log; lab_fail "3: bulk failed after rvmad was killed (status $rc)"; }
	rvmad_sockets_start /tmp/rvmad.log3

	echo "== 4a. guest 2's client killed mid-stream (guest 1's server must see EOF or ECONNRESET)"
	lab_wait c4a-ready 60
	mid 4a 7605 /tmp/c4a.log
	kill -9 $BG
	lab_signal c4a-killed
	wait $BG 2>/dev/null || true

	echo "== 4b. guest 1's server killed while guest 2's client writes into its ring (the writer must fail, never hang)"
	lab_wait c4b-ready 60
	mid 4b 7606 /tmp/c4b.log
	lab_signal c4b-mid
	lab_wait c4b-killed 60
	t0=$(now_ms)
	wait_exit $BG 20 || { show client /tmp/c4b.log; lab_fail "4b: the writer still runs 20 s after its peer was killed: a hang"; }
	rc=0
	wait $BG || rc=$?
	echo "4b: the client ended $(($(now_ms) - t0)) ms after its peer was killed (status $rc)"
	grep -E 'probing|peer is gone|FAIL' /tmp/c4b.log || true
	[ $rc -ne 0 ] || { show client /tmp/c4b.log; lab_fail "4b: the transfer ended cleanly, yet its peer was killed mid-stream"; }
	grep -Eq 'Connection reset|Broken pipe' /tmp/c4b.log ||
		{ show client /tmp/c4b.log; lab_fail "4b: the writer did not fail with ECONNRESET or EPIPE"; }

	echo "== 4c. guest 2's link down for 6 s mid-transfer (the QPs fail: demote to TCP)"
	lab_wait c4c-ready 60
	mid 4c 7608 /tmp/c4c.log
	tm=$(tcp_segs) ms0=$(now_ms)
	ip link set eth0 down
	sleep 6
	ip link set eth0 up
	wait_exit $BG 60 || { show client /tmp/c4c.log; lab_fail "4c: the transfer did not end within 60 s of the link's return"; }
	rc=0
	wait $BG || rc=$?
	mc=$(now_ms) t2=$(tcp_segs)
	echo "4c: the client ended $((mc - ms0)) ms after the link went down (status $rc); rxe packets +$((PM - P0)) before; TCP segments +$((tm - T0)) before, +$((t2 - tm)) after; demoted=$(summary demoted /tmp/c4c.log)"
	grep -E 'DEMOTE|QP' /tmp/c4c.log | head -5 || true
	[ $rc -eq 0 ] && grep -q '^ok bulk' /tmp/c4c.log || { show client /tmp/c4c.log; lab_fail "4c: bulk failed across the link's outage (status $rc)"; }
	[ "$(summary demoted /tmp/c4c.log)" -ge 1 ] || { show client /tmp/c4c.log; lab_fail "4c: the connection did not demote when its QP failed"; }
	[ $((t2 - tm)) -ge 100 ] || lab_fail "4c: TCP moved only $((t2 - tm)) segments after the outage: the rest did not go by TCP"
	lab_signal c4c-done
	for i in $(seq 1 100); do
		[ "$(cat /sys/class/infiniband/$LAB_DEVICE/ports/1/state 2>/dev/null)" = "4: ACTIVE" ] && break
		sleep 0.1
	done

	echo "== 5. the rxe link deleted on guest 2 mid-transfer"
	lab_wait c5-ready 60
	mid 5 7607 /tmp/c5.log
	tm=$(tcp_segs) ms0=$(now_ms)
	rdma link delete "$LAB_DEVICE" >/tmp/c5.del 2>&1 &
	del=$!
	wait_exit $del 20 || {
		cat /proc/$del/stack 2>/dev/null || true
		show client /tmp/c5.log
		lab_fail "5: rdma link delete still blocked 20 s after it began: a process kept the device"
	}
	drc=0
	wait $del || drc=$?
	md=$(now_ms)
	wait_exit $BG 60 || { show client /tmp/c5.log; lab_fail "5: the transfer did not end within 60 s of the link's deletion"; }
	rc=0
	wait $BG || rc=$?
	mc=$(now_ms) t2=$(tcp_segs)
	lab_signal c5-done
	lab_wait c5-counted 60
	g1=$(($(cat "$LAB_SHARED/c5.g1p1") - $(cat "$LAB_SHARED/c5.g1p0")))
	echo "5: the delete returned after $((md - ms0)) ms (status $drc), the client ended after $((mc - ms0)) ms (status $rc)"
	echo "5: rxe packets +$((PM - P0)) before the delete (guest 2), +$g1 in all on guest 1; TCP segments +$((tm - T0)) before, +$((t2 - tm)) after; demoted=$(summary demoted /tmp/c5.log)"
	grep -E 'DEVICE|DEMOTE' /tmp/c5.log | head -5 || true
	grep 'being removed' /tmp/rvmad.log3 || true
	[ $rc -eq 0 ] && grep -q '^ok bulk' /tmp/c5.log || { show client /tmp/c5.log; lab_fail "5: bulk failed across the link's deletion (status $rc)"; }
	[ $drc -eq 0 ] || { cat /tmp/c5.del; lab_fail "5: rdma link delete failed (status $drc)"; }
	[ "$(summary demoted /tmp/c5.log)" -ge 1 ] || { show client /tmp/c5.log; lab_fail "5: the connection did not demote when its device was being removed"; }
	[ $((t2 - tm)) -ge 100 ] || lab_fail "5: TCP moved only $((t2 - tm)) segments after the delete: the rest did not go by TCP"
	[ ! -d "/sys/class/infiniband/$LAB_DEVICE" ] || lab_fail "5: $LAB_DEVICE still exists after the delete"
	lab_signal all-done
fi
echo "PASS sockets-fallback (guest $LAB_INDEX)"
