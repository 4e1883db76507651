package main

import (
	"strings"
	"testing"
)

func TestParseMetaDepends(t *testing.T) {
	out := "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\nlinux-headers-amd64\n  Depends: linux-headers-6.1.0-56-amd64\n"
	if abi, err := parseMetaDepends(out, "linux-image-"); err != nil || abi != "6.1.0-56-amd64" {
		t.Errorf("image: %q, %v", abi, err)
	}
	if abi, err := parseMetaDepends(out, "linux-headers-"); err != nil || abi != "6.1.0-56-amd64" {
		t.Errorf("headers: %q, %v", abi, err)
	}
	if _, err := parseMetaDepends("linux-image-amd64\n", "linux-image-"); err == nil {
		t.Error("no Depends line: no error")
	}
}

func TestParseShowDepends(t *testing.T) {
	out := `insmod /k/lib/modules/6.1/kernel/crypto/crc32_generic.ko 
builtin crc32c
insmod /k/lib/modules/6.1/kernel/ib_core.ko 
insmod /k/lib/modules/6.1/kernel/rdma_rxe.ko 
insmod /k/lib/modules/6.1/kernel/ib_core.ko 
insmod /k/lib/modules/6.1/kernel/ib_uverbs.ko   
`
	mods, err := parseShowDepends(out)
	if err != nil {
		t.Fatal(err)
	}
	want := "crc32_generic.ko ib_core.ko rdma_rxe.ko ib_uverbs.ko"
	var got []string
	for _, m := range mods {
		got = append(got, m[strings.LastIndex(m, "/")+1:])
	}
	if strings.Join(got, " ") != want {
		t.Errorf("order/dedupe: got %q, want %q", got, want)
	}
	if _, err := parseShowDepends("modprobe: FATAL: Module x not found\n"); err == nil {
		t.Error("garbage: no error")
	}
	if _, err := parseShowDepends("builtin only\n"); err == nil {
		t.Error("no modules: no error")
	}
}

func TestParseLdd(t *testing.T) {
	out := `	linux-vdso.so.1 (0x00007ffd)
	libibverbs.so.1 => /lib/x86_64-linux-gnu/libibverbs.so.1 (0x00007f25)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f25)
	/lib64/ld-linux-x86-64.so.2 (0x00007f25)
`
	libs, err := parseLdd(out)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(libs, " ") != "/lib/x86_64-linux-gnu/libibverbs.so.1 /lib/x86_64-linux-gnu/libc.so.6 /lib64/ld-linux-x86-64.so.2" {
		t.Errorf("got %q", libs)
	}
	if _, err := parseLdd("\tlibfoo.so.1 => not found\n"); err == nil {
		t.Error("missing library: no error")
	}
}

func TestKernelReport(t *testing.T) {
	bad := []string{
		"4,312,7360512,-;WARNING: CPU: 1 PID: 148 at lab_warn.c:12 lab_warn_init+0x11/0x1000 [lab_warn]",
		"1,400,1,-;BUG: kernel NULL pointer dereference, address: 0000000000000008",
		"0,401,1,-;Kernel panic - not syncing: Fatal exception",
		"4,402,1,-;Oops: 0002 [#1] PREEMPT SMP NOPTI",
		"3,403,1,-;BUG: KASAN: use-after-free in rxe_mr_copy+0x1/0x2",
		"4,404,1,-;WARNING: possible circular locking dependency detected",
		"3,405,1,-;INFO: task kworker/0:1:12 blocked for more than 120 seconds.",
		"0,406,1,-;watchdog: BUG: soft lockup - CPU#0 stuck for 22s!",
		"3,407,1,-;rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
		"2,408,73933773,-;virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 60360 ms",
	}
	for _, l := range bad {
		if _, ok := kernelReport(l); !ok {
			t.Errorf("not reported: %q", l)
		}
	}
	good := []string{
		"4,10,1,-;rdmaplus: loading out-of-tree module taints kernel.",
		"4,11,1,-;rdmaplus: module verification failed: signature and/or required key missing - tainting kernel",
		"6,12,1,-;infiniband rxe0: added eth0",
		" SUBSYSTEM=pci",
		"6,13,1,-;ACPI: _OSC evaluation for CPUs failed, trying _PDC",
		"6,14,1,-;Call Trace:",
	}
	for _, l := range good {
		if msg, ok := kernelReport(l); ok {
			t.Errorf("reported: %q (%q)", l, msg)
		}
	}
	if msg, _ := kernelReport(bad[0]); !strings.HasPrefix(msg, "WARNING: CPU: 1") {
		t.Errorf("message not stripped of its kmsg prefix: %q", msg)
	}
}
