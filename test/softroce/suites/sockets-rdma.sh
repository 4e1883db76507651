#!/bin/bash
# lab: guests=2 timeout=600 make=sockpreload gobuild=./cmd/rvmad
#
# Sockets over RDMA, attached: both guests run rvmad with its sockets
# broker, and an unmodified TCP program (bulk, built from
# cmd/sockpreload/test/bulk.c) runs under the shim on both: 16 MiB each way
# with every byte checked, then 1000 ping-pongs of 64 B. The bytes must go
# by RDMA, not TCP: rxe's packet counters must move by at least the
# transfer's packets, the guest's TCP segments by far fewer than TCP would
# need, and the shim's summaries must show the bytes read from and written
# into rings. The same program without the shim runs first, as the
# baseline of both counters. rvmad reads the processes' statistics
# segments: while the transfer runs, `rvmad sockets` must list the
# client's connection on RDMA, and after it exited rvmad's Prometheus
# aggregates must hold its bytes by RDMA (both ways, at least the
# transfer) and almost none by TCP; the server's rvmad must show its
# bytes by RDMA too. Then the conformance program (every
# scenario of cmd/sockpreload/test/conformance.c, bytes checked) runs
# between the guests under the shim with the broker on, so that its
# connections attach: each scenario must pass as over TCP.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
sockets_need "$SHIM" "$BULK"
sockets_begin
bytes=$((16 << 20))

under_shim() {
	LD_PRELOAD=$SHIM RDMAPLUS_SOCKETS_ATTACH_MS=0 RDMAPLUS_SOCKETS_DEBUG=2 "$@"
}

if [ "$LAB_ROLE" = server ]; then
	"$BULK" server -p 7481 >/tmp/plain.srv 2>&1 &
	under_shim "$BULK" server -p 7482 >/tmp/shim.srv 2>&1 &
	lab_wait_listen 7481
	lab_wait_listen 7482
	lab_signal bulk-ready
	lab_wait bulk-done 360
	sleep 1
	scrape http://127.0.0.1:9470/metrics /tmp/m.srv
	grep '^rdmaplus_sockets_shim_' /tmp/m.srv | grep -v ' 0$' || true
	for way in in out; do
		v=$(metric /tmp/m.srv "rdmaplus_sockets_shim_bytes_total{direction=\"$way\",path=\"rdma\"}")
		ge "$v" $bytes || lab_fail "rvmad shows $v bytes $way by RDMA on the server, want $bytes"
	done
	cat /tmp/shim.srv
	echo "--- rvmad"
	tail -20 /tmp/rvmad.log
	lab_signal server-checked

	rc=0
	LD_PRELOAD=$SHIM RDMAPLUS_SOCKETS_DEBUG=1 timeout 400 "$SOCKPRELOAD/conformance" server -p 7471 "$LAB_ADDR" \
		>/tmp/conf.server 2>&1 &
	srv=$!
	( lab_wait_listen 7471 ) || { sed "s/^/guest 1 server: /" /tmp/conf.server; lab_fail "the conformance server does not listen"; }
	lab_signal conformance-ready
	wait $srv || rc=$?
	sed "s/^/guest 1 server: /" /tmp/conf.server
	[ $rc -eq 0 ] || lab_fail "the conformance server failed (status $rc)"
	grep -q '^ok server/handlers' /tmp/conf.server || lab_fail "the server's handlers did not all pass"
else
	wait_peer bulk-ready
	p0=$(rxe_packets) t0=$(tcp_segs)
	timeout 120 "$BULK" client -p 7481 -n $bytes -w 1500 "$peer" || lab_fail "bulk over plain TCP failed"
	p1=$(rxe_packets) t1=$(tcp_segs)
	echo "plain TCP: rxe packets +$((p1 - p0)), TCP segments +$((t1 - t0))"
	rc=0
	scrape http://127.0.0.1:9470/metrics /tmp/m0
	timeout 180 env LD_PRELOAD=$SHIM RDMAPLUS_SOCKETS_ATTACH_MS=0 RDMAPLUS_SOCKETS_DEBUG=2 "$BULK" client -p 7482 -n $bytes -w 1500 "$peer" \
		>/tmp/shim.cli 2>&1 &
	cli=$!
	# rvmad sockets while it runs: the last listing with the connection on RDMA
	while kill -0 $cli 2>/dev/null; do
		"$RVMAD" sockets --json >/tmp/ls.json 2>&1 || true
		if grep -q '"path": "rdma"' /tmp/ls.json; then
			cp /tmp/ls.json /tmp/ls.rdma
		fi
		sleep 0.3
	done
	wait $cli || rc=$?
	p2=$(rxe_packets) t2=$(tcp_segs)
	scrape http://127.0.0.1:9470/metrics /tmp/m1
	lab_signal bulk-done
	cat /tmp/shim.cli
	echo "--- rvmad"
	tail -20 /tmp/rvmad.log
	[ $rc -eq 0 ] || lab_fail "bulk under the shim failed (status $rc)"
	rp=$((p2 - p1)) ts=$((t2 - t1))
	echo "under the shim: rxe packets +$rp, TCP segments +$ts"
	# 32 MiB in packets of at most 4 KiB is at least 8192 packets; TCP
	# (whose segments the virtual NIC coalesces) must move less than a
	# twentieth of what it moved for the same transfer without the shim.
	[ $rp -ge 8192 ] || lab_fail "rxe moved only $rp packets: the bytes did not go by RDMA"
	[ $((ts * 20)) -le $((t1 - t0)) ] || lab_fail "TCP moved $ts segments under the shim (plain: $((t1 - t0))): the bytes went by TCP"
	rr=$(sed -n 's/.* ring_read=\([0-9]*\).*/\1/p' /tmp/shim.cli | sort -n | tail -1)
	rw=$(sed -n 's/.* ring_written=\([0-9]*\).*/\1/p' /tmp/shim.cli | sort -n | tail -1)
	[ "${rr:-0}" -ge $bytes ] && [ "${rw:-0}" -ge $bytes ] ||
		lab_fail "the shim read ${rr:-0} and wrote ${rw:-0} bytes by rings, want $bytes each"

	# What rvmad read from the client's statistics segment.
	echo "--- rvmad sockets, the last listing with the connection on RDMA"
	[ -f /tmp/ls.rdma ] || { cat /tmp/ls.json; lab_fail "rvmad sockets never listed the connection on RDMA"; }
	cat /tmp/ls.rdma
	grep -q '"comm": "bulk"' /tmp/ls.rdma && grep -q "\"remote\": \"$peer:7482\"" /tmp/ls.rdma &&
		grep -q '"state": "attached"' /tmp/ls.rdma || lab_fail "rvmad sockets does not list bulk's connection to $peer:7482, attached"
	grep -q '"rdma_out": [1-9]' /tmp/ls.rdma || lab_fail "rvmad sockets shows no byte written by RDMA"
	echo "--- rvmad's aggregates, after the client exited"
	show_changes /tmp/m0 /tmp/m1 rdmaplus_sockets_shim_
	for way in in out; do
		d=$(delta /tmp/m0 /tmp/m1 "rdmaplus_sockets_shim_bytes_total{direction=\"$way\",path=\"rdma\"}")
		[ "$d" -ge $bytes ] || lab_fail "rvmad counted $d bytes $way by RDMA, want at least $bytes"
		d=$(delta /tmp/m0 /tmp/m1 "rdmaplus_sockets_shim_bytes_total{direction=\"$way\",path=\"tcp\"}")
		[ "$d" -lt 65536 ] || lab_fail "rvmad counted $d bytes $way by TCP under the shim"
	done
	[ "$(delta /tmp/m0 /tmp/m1 rdmaplus_sockets_shim_upgrades_total)" -ge 1 ] || lab_fail "no upgrade counted"
	[ "$(delta /tmp/m0 /tmp/m1 rdmaplus_sockets_shim_rdma_writes_total)" -ge 1 ] || lab_fail "no RDMA write counted"
	[ "$(metric /tmp/m1 rdmaplus_sockets_shim_processes)" = 0 ] || lab_fail "the client's segment is still read after it exited"
	lab_wait server-checked 60

	lab_wait conformance-ready 120
	rc=0
	LD_PRELOAD=$SHIM RDMAPLUS_SOCKETS_ATTACH_MS=0 RDMAPLUS_SOCKETS_DEBUG=${CONF_DEBUG:-1} timeout 400 "$SOCKPRELOAD/conformance" client -p 7471 -r 7472 "$peer" \
		>/tmp/conf.client 2>&1 || rc=$?
	sed "s/^/guest 2 client: /" /tmp/conf.client
	[ $rc -eq 0 ] || lab_fail "the conformance client failed (status $rc)"
	grep -q '^[0-9]* scenarios, 0 failed$' /tmp/conf.client || lab_fail "the client's scenarios did not all pass"
	n=$(sed -n 's/.* attached=\([0-9]*\).*/\1/p' /tmp/conf.client | sort -n | tail -1)
	echo "guest 2: $n connections of the conformance client attached (its server hands each to a forked child, where it stays on TCP)"
fi
echo "PASS sockets-rdma (guest $LAB_INDEX)"
