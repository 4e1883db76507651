#!/bin/bash
# lab: guests=1 timeout=420 gobuild=./cmd/rvmad
#
# rvmad provisioning SoftRoCE. The lab's own rxe link is deleted first, so
# that rvmad creates one on the same netdev (checked with rdma link),
# reports it, follows a SIGHUP'd config file, and on SIGTERM exits 0 and
# removes the link it created. With --remove-created-links=false the link
# stays and the next rvmad adopts it. Then the lab's link is restored and the
# operator errors are checked: a netdev that does not exist, a port in use,
# a missing device, a conflicting link, a bad config file: each a clear
# message, a non-zero exit, no stack trace, and no link left behind.
# (veth is not among the guest's modules, hence the lab's own netdev.)
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"

netdev=$(rdma link show "$LAB_DEVICE/1" | sed -n 's/.* netdev \([^ ]*\).*/\1/p')
[ -n "$netdev" ] || lab_fail "no netdev for $LAB_DEVICE"
rdma link delete "$LAB_DEVICE"
trap 'rdma link show | grep -q "link $LAB_DEVICE/" || rdma link add "$LAB_DEVICE" type rxe netdev "$netdev"' EXIT

cat > /tmp/rvmad.json <<JSON
{"listen": "127.0.0.1:9471", "rxe": [{"name": "rvmrxe0", "netdev": "$netdev"}], "log_level": "debug"}
JSON

echo "== rvmad creates rvmrxe0 on $netdev"
rdma link show | grep -q rvmrxe0 && lab_fail "rvmrxe0 exists before the test"
rvmad_start /tmp/rvmad.log --config /tmp/rvmad.json
base=http://127.0.0.1:9471
wait_http $base/readyz
rdma link show | tee /tmp/links
grep -q "link rvmrxe0/1 state ACTIVE .*netdev $netdev" /tmp/links || lab_fail "rvmrxe0 not ACTIVE on $netdev"
scrape $base/metrics /tmp/m1
[ "$(metric /tmp/m1 'rvmad_softroce_link_created{device="rvmrxe0"}')" = 1 ] || lab_fail "rvmrxe0 not reported as created"
metric /tmp/m1 'rvmad_port_state{device="rvmrxe0",port="1"}' >/dev/null
"$RVMAD" devices | grep -E "^rvmrxe0 +1 +ACTIVE .* $netdev " || lab_fail "inventory lacks rvmrxe0"

echo "== SIGHUP: a required device that does not exist makes /readyz fail, and back"
cat > /tmp/rvmad.json <<JSON
{"listen": "127.0.0.1:9471", "rxe": [{"name": "rvmrxe0", "netdev": "$netdev"}], "devices": ["nosuchdev0"]}
JSON
kill -HUP "$RVMAD_PID"
n=0
while http_ok $base/readyz; do n=$((n + 1)); [ $n -le 100 ] || lab_fail "/readyz still 200 after SIGHUP"; sleep 0.1; done
cat > /tmp/rvmad.json <<JSON
{"listen": "127.0.0.1:9471", "rxe": [{"name": "rvmrxe0", "netdev": "$netdev"}]}
JSON
kill -HUP "$RVMAD_PID"
wait_http $base/readyz 10
grep -q 'configuration reloaded' /tmp/rvmad.log || lab_fail "no reload logged"

echo "== port in use: a second rvmad on 9471 exits 1"
rc=0
"$RVMAD" serve --listen 127.0.0.1:9471 >/tmp/second.out 2>&1 || rc=$?
cat /tmp/second.out
[ $rc -eq 1 ] || lab_fail "second rvmad exited $rc, want 1"
grep -q "address already in use" /tmp/second.out || lab_fail "no 'address already in use' message"

echo "== SIGTERM: exit 0, rvmrxe0 removed"
rvmad_stop
rdma link show | tee /tmp/links
grep -q rvmrxe0 /tmp/links && lab_fail "rvmrxe0 left behind"
grep -q '"removed SoftRoCE link this process created"' /tmp/rvmad.log 2>/dev/null || grep -q 'removed SoftRoCE link this process created' /tmp/rvmad.log || lab_fail "removal not logged"

echo "== --remove-created-links=false keeps the link"
rvmad_start /tmp/keep.log --listen 127.0.0.1:9472 --rxe "rvmrxe0:$netdev" --remove-created-links=false
wait_http http://127.0.0.1:9472/readyz
rvmad_stop
rdma link show | grep -q "link rvmrxe0/1" || lab_fail "rvmrxe0 removed although remove-created-links=false"
echo "== ...and the next rvmad adopts it instead of duplicating it, and leaves it"
rvmad_start /tmp/adopt.log --listen 127.0.0.1:9472 --rxe "rvmrxe0:$netdev"
wait_http http://127.0.0.1:9472/readyz
grep -q 'adopted existing SoftRoCE link' /tmp/adopt.log || lab_fail "not adopted"
rvmad_stop
rdma link show | grep -q "link rvmrxe0/1" || lab_fail "adopted rvmrxe0 removed"
rdma link delete rvmrxe0
rdma link add "$LAB_DEVICE" type rxe netdev "$netdev"

expect_fail() { # WANT_TEXT ARGS...: rvmad serve ARGS must exit non-zero, saying WANT_TEXT, without a trace
	local want=$1 rc=0
	shift
	timeout 90 "$RVMAD" serve --listen 127.0.0.1:9473 "$@" >/tmp/fail.out 2>&1 || rc=$?
	sed 's/^/    /' /tmp/fail.out
	[ $rc -ne 0 ] || lab_fail "rvmad $* exited 0"
	[ $rc -ne 124 ] || lab_fail "rvmad $* hung"
	grep -q -- "$want" /tmp/fail.out || lab_fail "rvmad $*: no '$want' in the message"
	if grep -qE 'goroutine [0-9]+|panic:' /tmp/fail.out; then lab_fail "rvmad $*: stack trace"; fi
	echo "  exit $rc: ok"
}
echo "== operator errors"
expect_fail "netdev nosuch0" --rxe rvmrxe1:nosuch0
expect_fail "nosuchdev0" --device nosuchdev0
expect_fail "already carries SoftRoCE device $LAB_DEVICE" --rxe "rvmrxe2:$netdev"
expect_fail "conflicting RDMA device" --rxe "$LAB_DEVICE:lo"
expect_fail "invalid log_level" --log-level loud
echo '{"listen": ":9473", "rxe": [{"name": "x", "netdve": "y"}]}' > /tmp/bad.json
expect_fail '"rxe"' --config /tmp/bad.json
rdma link show | grep -qE 'rvmrxe[12]' && lab_fail "a failed start left a link behind"
echo "PASS rvmad-provision"
