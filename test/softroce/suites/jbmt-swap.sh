#!/bin/bash
# lab: guests=1 mem=384 timeout=420
# lab: gotest=./pkg/jbmt
#
# JBMT over memory larger than RAM: a guest of 384 MiB with swap on zram
# serves a region of one and a half times its memory, most of it swapped
# out, to gets over loopback; every byte is checked (the region's pages
# hold their own index, which zram stores without compressing).
set -euo pipefail
[ -e /sys/block/zram0 ] || lab_fail "no zram device: the guest kernel has no zram module (test/softroce/guest/modules)"
echo 1G >/sys/block/zram0/disksize
mkswap /dev/zram0 >/dev/null
swapon /dev/zram0
grep -q zram0 /proc/swaps || lab_fail "swap on zram0 is not on"
lab_gotest jbmt -test.v -test.run '^TestSwap' -test.timeout 400s
