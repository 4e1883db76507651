#!/bin/bash
# lab: guests=1 timeout=90
#
# One guest: the rxe device is listed and active, our module's device node
# answers, and perftest moves data over rxe0 in loopback (server and client
# on the same device, the TCP side channel over 127.0.0.1).
set -euo pipefail

echo "== devices"
ibv_devices
rdma link show
ibv_devinfo -d "$LAB_DEVICE" | tee /tmp/devinfo
grep -q 'state:.*PORT_ACTIVE' /tmp/devinfo || lab_fail "$LAB_DEVICE port not active"
grep -q "link $LAB_DEVICE/1 state ACTIVE" <(rdma link show) || lab_fail "rdma link does not show $LAB_DEVICE ACTIVE"
[ -c "$LAB_KMOD_DEV" ] || lab_fail "$LAB_KMOD_DEV missing"

echo "== ib_write_lat loopback"
ib_write_lat -F -d "$LAB_DEVICE" -x 1 -s 64 -n 1000 >/tmp/lat.srv 2>&1 &
srv=$!
lab_wait_listen 18515
ib_write_lat -F -d "$LAB_DEVICE" -x 1 -s 64 -n 1000 127.0.0.1 | tee /tmp/lat.cli
wait $srv || { cat /tmp/lat.srv; lab_fail "ib_write_lat server failed"; }
grep -qE '^ *64 +1000 ' /tmp/lat.cli || lab_fail "ib_write_lat printed no result line"

echo "== ib_write_bw loopback"
ib_write_bw -F -d "$LAB_DEVICE" -x 1 -s 65536 -n 500 >/tmp/bw.srv 2>&1 &
srv=$!
lab_wait_listen 18515
ib_write_bw -F -d "$LAB_DEVICE" -x 1 -s 65536 -n 500 127.0.0.1 | tee /tmp/bw.cli
wait $srv || { cat /tmp/bw.srv; lab_fail "ib_write_bw server failed"; }
grep -qE '^ *65536 +500 ' /tmp/bw.cli || lab_fail "ib_write_bw printed no result line"
