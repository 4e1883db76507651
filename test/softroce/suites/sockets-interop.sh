#!/bin/bash
# lab: guests=2 timeout=420 make=sockpreload gobuild=./cmd/rvmad gotest=./pkg/sockets
#
# The two implementations of anchored sockets (docs/sockets.md) talk to
# each other over RDMA, both ways. Both guests run rvmad with its sockets
# broker. The C side is the unmodified program bulk
# (cmd/sockpreload/test/bulk.c) under the shim; the Go side is
# pkg/sockets's lab tests TestLabInterop{Client,Server}, which speak
# bulk's protocol (16 MiB each way, then 1000 ping-pongs of 64 B, every
# byte checked):
#   1. a Go client (guest 2) against `bulk server` under the shim (guest 1);
#   2. `bulk client` under the shim (guest 2) against a Go server (guest 1);
#   3. as 1 with rings of other sizes (the shim's 64 KiB, Go's 1 MiB; 4 MiB
#      each way and 200 ping-pongs): each side writes into the other's
#      ring at its size, the shim's window is the smaller ring.
# The bytes must go by RDMA: rxe's packet counters move by at least the
# transfer's packets on both guests, the Go side's Stats count every byte
# through rings (and none on TCP), and the shim's summary
# (RDMAPLUS_SOCKETS_DEBUG) shows ring_read and ring_written of at least
# the transfer. The bulk server serves forever: a last, empty connection
# makes it exit (its "read header" fails), which prints its summary.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
sockets_need "$SHIM" "$BULK"
sockets_begin
dev=$LAB_DEVICE

rxe() {
	cat /sys/class/infiniband/$dev/ports/1/hw_counters/$1
}
# The largest value of NAME= in the shim's summaries in FILE.
summary_val() {
	sed -n "s/.* $1=\([0-9]*\).*/\1/p" "$2" | sort -n | tail -1
}
# check_summary WHO FILE BYTES: the shim moved BYTES each way by rings.
check_summary() {
	local who=$1 file=$2 want=$3 rr rw
	rr=$(summary_val ring_read "$file") rw=$(summary_val ring_written "$file")
	echo "$who: shim summary ring_read=${rr:-none} ring_written=${rw:-none}"
	[ "${rr:-0}" -ge "$want" ] && [ "${rw:-0}" -ge "$want" ] ||
		lab_fail "$who: the shim read ${rr:-0} and wrote ${rw:-0} bytes by rings, want $want each"
}
# check_rxe WHO SENT0 RCVD0 BYTES: rxe's counters moved by at least one
# packet per 4 KiB (RoCE's largest MTU) of BYTES, each way (sysfs does not
# say the port's active MTU; the Go side checks against it).
check_rxe() {
	local who=$1 s=$(($(rxe sent_pkts) - $2)) r=$(($(rxe rcvd_pkts) - $3)) pkts=$(($4 / 4096))
	echo "$who: rxe sent_pkts +$s rcvd_pkts +$r (the transfer is at least $pkts packets each way)"
	[ $s -ge $pkts ] && [ $r -ge $pkts ] || lab_fail "$who: rxe moved $s and $r packets, want $pkts each: not by RDMA"
}

# go_client_c_server NAME PORT BYTES ROUNDS C_RING_LOG2 GO_RING: a Go
# client (guest 2) against `bulk server` under the shim (guest 1).
go_client_c_server() {
	local name=$1 port=$2 bytes=$3 rounds=$4 log2=$5 ring=$6 s0 r0 srv n rc peer
	if [ "$LAB_ROLE" = server ]; then
		s0=$(rxe sent_pkts) r0=$(rxe rcvd_pkts)
		LD_PRELOAD=$SHIM RDMAPLUS_SOCKETS_ATTACH_MS=0 RDMAPLUS_SOCKETS_DEBUG=2 RDMAPLUS_SOCKETS_RING_LOG2=$log2 \
			"$BULK" server -p "$port" >/tmp/c-srv-$name.log 2>&1 &
		srv=$!
		lab_wait_listen "$port"
		lab_signal "$name-c-server-ready"
		lab_wait "$name-go-client-done" 360
		# The bulk server exits on the suite's empty connection.
		n=0
		while kill -0 $srv 2>/dev/null && [ $n -lt 100 ]; do n=$((n + 1)); sleep 0.1; done
		kill $srv 2>/dev/null || true
		wait $srv || true
		echo "--- guest 1, $name: bulk server under the shim (ring 2^$log2)"
		cat /tmp/c-srv-$name.log
		[ -e "$LAB_SHARED/barrier.$name-go-client-ok" ] ||
			{ tail -30 /tmp/rvmad.log; lab_fail "$name: the Go client failed against the shim's bulk server"; }
		! grep -q 'FAIL bulk: \(byte\|end of file at\|read:\|write:\)' /tmp/c-srv-$name.log ||
			lab_fail "$name: the shim's bulk server failed"
		check_rxe "$name, guest 1 (C bulk server)" $s0 $r0 $bytes
		check_summary "$name, guest 1 (C bulk server)" /tmp/c-srv-$name.log $bytes
		lab_signal "$name-c-server-checked"
	else
		wait_peer "$name-c-server-ready"
		s0=$(rxe sent_pkts) r0=$(rxe rcvd_pkts)
		rc=0
		SOCKETS_INTEROP_DIAL=$peer:$port SOCKETS_INTEROP_BYTES=$bytes SOCKETS_INTEROP_ROUNDS=$rounds \
			SOCKETS_INTEROP_SIZE=64 SOCKETS_INTEROP_RING=$ring \
			lab_gotest sockets -test.v -test.count=1 -test.timeout 300s -test.run '^TestLabInteropClient$' || rc=$?
		# An empty connection: the bulk server's "read header" fails and
		# it exits, printing the shim's summary.
		timeout 10 bash -c "exec 3<>/dev/tcp/$peer/$port" || true
		[ $rc -eq 0 ] && lab_signal "$name-go-client-ok"
		lab_signal "$name-go-client-done"
		[ $rc -eq 0 ] || { echo "--- rvmad"; tail -30 /tmp/rvmad.log; lab_fail "$name: the Go client failed against the shim's bulk server"; }
		check_rxe "$name, guest 2 (Go client)" $s0 $r0 $bytes
		lab_wait "$name-c-server-checked" 120
	fi
}

# c_client_go_server NAME PORT BYTES ROUNDS: `bulk client` under the shim
# (guest 2) against a Go server (guest 1).
c_client_go_server() {
	local name=$1 port=$2 bytes=$3 rounds=$4 s0 r0 gs rc peer
	if [ "$LAB_ROLE" = server ]; then
		s0=$(rxe sent_pkts) r0=$(rxe rcvd_pkts)
		rc=0
		SOCKETS_INTEROP_LISTEN=$port SOCKETS_INTEROP_BYTES=$bytes SOCKETS_INTEROP_ROUNDS=$rounds \
			SOCKETS_INTEROP_SIZE=64 \
			lab_gotest sockets -test.v -test.count=1 -test.timeout 300s -test.run '^TestLabInteropServer$' \
			>/tmp/go-srv-$name.log 2>&1 &
		gs=$!
		lab_wait_listen "$port"
		lab_signal "$name-go-server-ready"
		wait $gs || rc=$?
		echo "--- guest 1, $name: Go server"
		cat /tmp/go-srv-$name.log
		lab_signal "$name-go-server-done"
		[ $rc -eq 0 ] || { echo "--- rvmad"; tail -30 /tmp/rvmad.log; lab_fail "$name: the Go server failed against the shim's bulk client"; }
		check_rxe "$name, guest 1 (Go server)" $s0 $r0 $bytes
		lab_wait "$name-c-client-checked" 120
	else
		wait_peer "$name-go-server-ready"
		s0=$(rxe sent_pkts) r0=$(rxe rcvd_pkts)
		rc=0
		timeout 240 env LD_PRELOAD=$SHIM RDMAPLUS_SOCKETS_ATTACH_MS=0 RDMAPLUS_SOCKETS_DEBUG=2 "$BULK" client -p "$port" \
			-n $bytes -r $rounds -s 64 -w 1500 "$peer" >/tmp/c-cli-$name.log 2>&1 || rc=$?
		echo "--- guest 2, $name: bulk client under the shim (status $rc)"
		cat /tmp/c-cli-$name.log
		lab_wait "$name-go-server-done" 300
		[ $rc -eq 0 ] || { echo "--- rvmad"; tail -30 /tmp/rvmad.log; lab_fail "$name: the shim's bulk client failed against the Go server"; }
		grep -q "^ok bulk $bytes bytes" /tmp/c-cli-$name.log || lab_fail "$name: the bulk client did not report ok"
		check_rxe "$name, guest 2 (C bulk client)" $s0 $r0 $bytes
		check_summary "$name, guest 2 (C bulk client)" /tmp/c-cli-$name.log $bytes
		lab_signal "$name-c-client-checked"
	fi
}

go_client_c_server part1 7491 $((16 << 20)) 1000 18 ""
c_client_go_server part2 7492 $((16 << 20)) 1000
go_client_c_server part3 7493 $((4 << 20)) 200 16 $((1 << 20))
echo "PASS sockets-interop (guest $LAB_INDEX)"
