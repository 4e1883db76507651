#!/bin/bash
# lab: guests=1 timeout=180
# lab: gotest=./pkg/kmod
#
# Active Access module life cycle on one guest: with nothing armed the
# module registers no hook (its idle cost is nil; the figures are in the
# aa-idle-cost benchmark); while a process has armed
# pages, neither rdma_rxe nor our module can be unloaded; once it is
# killed (kill -9) both could be and ours is; without rdma_rxe our module
# loads, says so and refuses what needs the hooks (ErrNotSupported); rxe
# loaded under it turns them on; it unloads, loads again and arms pages; rxe unloaded and loaded again under an idle rdmaplus, arming
# works (the hooks look rxe's functions up again at each first arm).
set -euo pipefail

ko=$LAB_KMODS
rxe_ko=$(grep '/rdma_rxe\.ko' /etc/lab/modules)
[ -n "$rxe_ko" ] || lab_fail "rdma_rxe.ko not in /etc/lab/modules"

armed() {
	# a process holding a domain with 4 armed pages until its stdin ends
	mkfifo /tmp/hold.$1
	(RDMAPLUS_AA_CHILD=armed lab_gotest kmod -test.run '^TestLabChild$' < /tmp/hold.$1 > /tmp/child.$1 2>&1) &
	exec {fd}>/tmp/hold.$1
	for _ in $(seq 200); do grep -q READY /tmp/child.$1 && return 0; sleep 0.05; done
	cat /tmp/child.$1
	lab_fail "the armed child did not get ready"
}

grep -q " /sys/kernel/debug " /proc/mounts || mount -t debugfs none /sys/kernel/debug
# the module's hooks are ftrace callbacks: enabled_functions lists them
hooks=/sys/kernel/debug/tracing/enabled_functions
# (five functions of rdma_rxe, whose names differ between kernels)
probes() { grep -c " \[rdma_rxe\]" $hooks || true; }

echo "== idle: the module is loaded and registers no hook (rxe runs its own code only)"
[ "$(probes)" = 0 ] || lab_fail "hooks registered with nothing armed: $(cat $hooks)"

echo "== armed: rdma_rxe and rdmaplus are pinned"
armed 1
[ "$(probes)" = 5 ] || lab_fail "armed, but enabled_functions has: $(cat $hooks)"
child=$(awk '/^READY/ {print $4}' /tmp/child.1)
[ -n "$child" ] || lab_fail "no child pid"
grep -q rdma_rxe /proc/modules
refs=$(awk '$1=="rdma_rxe" {print $3}' /proc/modules)
echo "rdma_rxe references while armed: $refs"
if rmmod rdma_rxe 2>/tmp/err; then lab_fail "rdma_rxe unloaded under armed hooks"; fi
cat /tmp/err
if rmmod rdmaplus 2>/tmp/err; then lab_fail "rdmaplus unloaded while a process uses it"; fi
cat /tmp/err

echo "== kill -9 releases everything"
kill -9 "$child"
# the killed process's files are released after it is reaped, one by one
# (its rxe references, then its /dev/rdmaplus): wait for both
for _ in $(seq 100); do
	[ "$(awk '$1=="rdma_rxe" {print $3}' /proc/modules)" -lt "$refs" ] &&
		[ "$(awk '$1=="rdmaplus" {print $3}' /proc/modules)" = 0 ] && break
	sleep 0.05
done
after=$(awk '$1=="rdma_rxe" {print $3}' /proc/modules)
echo "rdma_rxe references after the kill: $after"
[ "$after" -lt "$refs" ] || lab_fail "the rdma_rxe reference was not dropped"
rmmod rdmaplus || lab_fail "rdmaplus cannot be unloaded after the kill"

echo "== without rdma_rxe the module loads with its hooked services off"
rdma link delete "$LAB_DEVICE"
rmmod rdma_rxe || lab_fail "rdma_rxe cannot be unloaded once nothing is armed"
insmod "$ko" || lab_fail "rdmaplus did not load without rdma_rxe"
dmesg | grep 'rdmaplus: rdma_rxe not loaded or not recognised' || lab_fail "no clear message in the kernel log"
dmesg | grep 'RVMA and Active Access off' || lab_fail "the load did not say the services are off"
lab_gotest kmod -test.v -test.run '^TestWithoutRxe$'

echo "== rxe loaded under it: the services come on; unload, load"
insmod "$rxe_ko"
rdma link add "$LAB_DEVICE" type rxe netdev eth0
for _ in $(seq 100); do ibv_devinfo -d "$LAB_DEVICE" 2>/dev/null | grep -q PORT_ACTIVE && break; sleep 0.05; done
lab_gotest kmod -test.v -test.run '^TestLabWriteLogged$'
rmmod rdmaplus || lab_fail "rdmaplus cannot be unloaded once idle"
insmod "$ko"
[ -c "$LAB_KMOD_DEV" ] || lab_fail "$LAB_KMOD_DEV missing after reload"
lab_gotest kmod -test.v -test.run '^(TestLabWriteLogged|TestLabKill9)$'

echo "== rxe reloaded under an idle rdmaplus: arming looks its functions up again"
rdma link delete "$LAB_DEVICE"
rmmod rdma_rxe || lab_fail "rdma_rxe cannot be unloaded while rdmaplus is idle"
insmod "$rxe_ko"
rdma link add "$LAB_DEVICE" type rxe netdev eth0
for _ in $(seq 100); do ibv_devinfo -d "$LAB_DEVICE" 2>/dev/null | grep -q PORT_ACTIVE && break; sleep 0.05; done
lab_gotest kmod -test.v -test.run '^TestLabWriteLogged$'
