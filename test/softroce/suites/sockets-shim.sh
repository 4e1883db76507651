#!/bin/bash
# lab: guests=2 timeout=420 make=sockpreload
#
# The sockets-over-RDMA shim in pass-through mode (no RDMA yet: every byte
# on the kernel socket) between two guests: the conformance program's
# server on guest 1 and its client on guest 2, both under the shim
# (LD_PRELOAD=librdmaplus-sockets.so), every scenario over the lab's
# network with every byte checked; then the loopback mode (a server and a
# client on one guest, both under the shim) on guest 2. The shim's debug
# summaries must show the connections it followed: guest 1's server
# accepted one per scenario, guest 2's client connected one per scenario.
# The shim and the program are built on the host (make sockpreload, into
# build/sockpreload/, which the guests see at $LAB_DIR/build/sockpreload/).
set -euo pipefail
dir=$LAB_DIR/build/sockpreload
so=$dir/librdmaplus-sockets.so
prog=$dir/conformance
port=7471
[ -x "$prog" ] && [ -f "$so" ] || lab_fail "$dir: the shim or the conformance program is missing (make sockpreload)"

# The largest value of counter NAME over the summary lines of FILE.
summary_max() {
	sed -n "s/^rdmaplus-sockets: pid [0-9]*: .* $1=\([0-9]*\).*/\1/p" "$2" | sort -n | tail -1
}

# conformance MODE ARGS...: run it under the shim; its output (stdout and
# the shim's summaries on stderr) goes to /tmp/conf.MODE and is printed.
conformance() {
	local mode=$1 rc=0
	shift
	LD_PRELOAD=$so RDMAPLUS_SOCKETS_DEBUG=1 timeout 300 "$prog" "$mode" "$@" \
		>"/tmp/conf.$mode" 2>&1 || rc=$?
	sed "s/^/guest $LAB_INDEX $mode: /" "/tmp/conf.$mode"
	return $rc
}

if [ "$LAB_ROLE" = server ]; then
	conformance server -p $port "$LAB_ADDR" &
	srv=$!
	lab_wait_listen $port
	lab_signal conformance-ready
	wait $srv || lab_fail "the conformance server failed (status $?)"
	grep -q '^ok server/handlers' /tmp/conf.server || lab_fail "the server's handlers did not all pass"
	n=$(summary_max server /tmp/conf.server)
	[ "${n:-0}" -ge 30 ] || lab_fail "the shim followed ${n:-0} accepted connections on guest 1, want 30 or more"
	echo "guest 1: the shim followed $n accepted connections"
	lab_wait loopback-done 300
else
	lab_wait conformance-ready 120
	conformance client -p $port -r $((port + 1)) "$(lab_peer 1)" ||
		lab_fail "conformance client against guest 1 failed"
	grep -q '^[0-9]* scenarios, 0 failed$' /tmp/conf.client || lab_fail "the client's scenarios did not all pass"
	n=$(summary_max client /tmp/conf.client)
	[ "${n:-0}" -ge 30 ] || lab_fail "the shim followed ${n:-0} connected sockets on guest 2, want 30 or more"
	echo "guest 2: the shim followed $n connections to guest 1"

	conformance loopback || lab_fail "conformance loopback on guest 2 failed"
	grep -q '^[0-9]* scenarios, 0 failed$' /tmp/conf.loopback || lab_fail "the loopback scenarios did not all pass"
	grep -q '^ok server/handlers' /tmp/conf.loopback || lab_fail "the loopback server's handlers did not all pass"
	a=$(summary_max adopted /tmp/conf.loopback)
	[ "${a:-0}" -ge 1 ] || lab_fail "no exec'd reader adopted its inherited socket"
	lab_signal loopback-done
fi
echo "PASS sockets-shim (guest $LAB_INDEX)"
