package main

import "testing"

// Kernel log lines of each kind the lab recognises, as a 6.1 guest prints
// them (as /dev/kmsg records or bare), and lines it must leave alone.
func TestKernelReportCategories(t *testing.T) {
	for _, c := range []struct {
		what, line string
		bad        bool
	}{
		// oopses: the die header of each x86 trap, and its titles
		{"divide error", "4,395,4269882,-;divide error: 0000 [#1] PREEMPT SMP NOPTI", true},
		{"invalid opcode", "4,390,4165000,-;invalid opcode: 0000 [#1] PREEMPT SMP NOPTI", true},
		{"stack segment", "stack segment: 0000 [#1] PREEMPT SMP NOPTI", true},
		{"general protection", "general protection fault, probably for non-canonical address 0xdead000000000122: 0000 [#1] PREEMPT SMP NOPTI", true},
		{"page fault oops", "Oops: 0002 [#1] PREEMPT SMP NOPTI", true},
		{"a second oops", "int3: 0000 [#2] PREEMPT SMP NOPTI", true},
		{"an arm64 oops", "Internal error: Oops: 0000000096000004 [#1] PREEMPT SMP", true},
		{"a die header of another trap", "alignment check: 0000 [#1] SMP", true},
		{"double fault", "PANIC: double fault, error_code: 0x0", true},
		{"panic", "0,420,5000000,-;Kernel panic - not syncing: Fatal exception", true},
		// BUGs
		{"page fault", "1,380,4000000,-;BUG: unable to handle page fault for address: 0000000000000008", true},
		{"NULL pointer", "BUG: kernel NULL pointer dereference, address: 0000000000000000", true},
		{"sleeping in atomic context", "BUG: sleeping function called from invalid context at mm/slab.h:712", true},
		{"scheduling while atomic", "BUG: scheduling while atomic: kworker/0:1/23/0x00000002", true},
		{"kernel BUG", "kernel BUG at lib/list_debug.c:62!", true},
		{"SLUB double free", "3,500,6000000,-;BUG kmalloc-64 (Tainted: G    B      OE     ): Object already free", true},
		{"SLUB poison", "BUG skbuff_head_cache (Tainted: G           OE     ): Poison overwritten", true},
		{"SLUB redzone", "BUG kmalloc-128 (Not tainted): Right Redzone overwritten", true},
		{"list_add corruption", "list_add corruption. next->prev should be prev (ffff888004b1a0c8), but was ffff888004b1a0d8. (next=ffff888004b1a0c8).", true},
		{"list_del corruption", "list_del corruption, ffff888004b1a0c8->next is LIST_POISON1 (dead000000000100)", true},
		{"refcount", "refcount_t: underflow; use-after-free.", true},
		{"refcount saturation", "refcount_t: saturated; leaking memory.", true},
		// the OOM killer
		{"oom invoked", "4,600,7000000,-;dd invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), order=0, oom_score_adj=1000", true},
		{"oom kill", "3,610,7100000,-;Out of memory: Killed process 171 (dd) total-vm:616020kB, anon-rss:480256kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:980kB oom_score_adj:1000", true},
		{"oom constraint", "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=dd,pid=171,uid=0", true},
		{"memcg oom", "Memory cgroup out of memory: Killed process 171 (dd) total-vm:616020kB", true},
		// what was recognised before
		{"WARNING", "4,384,3998810,-;WARNING: CPU: 1 PID: 152 at lab_warn.c:12 lab_warn_init+0x11/0x1000 [lab_warn]", true},
		{"soft lockup", "watchdog: BUG: soft lockup - CPU#1 stuck for 45s! [rvma.test:211]", true},
		{"hung task", "INFO: task kworker/0:2:77 blocked for more than 120 seconds.", true},
		{"RCU stall", "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:", true},
		{"RCU stall the CPU detected itself", "rcu: INFO: rcu_preempt self-detected stall on CPU", true},
		{"KASAN", "BUG: KASAN: slab-use-after-free in rxe_mr_copy+0x1c/0x2f0 [rdma_rxe]", true},
		{"UBSAN", "UBSAN: shift-out-of-bounds in kmod/rdmaplus_aa.c:120:9", true},
		{"kmemleak", "kmemleak: 2 new suspected memory leaks (see /sys/kernel/debug/kmemleak)", true},
		{"lockdep", "WARNING: possible circular locking dependency detected", true},
		{"NIC stall", "4,700,8000000,-;virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 60360 ms", true},

		// what a passing boot prints
		{"unsigned module", "4,200,1500000,-;crc32_generic: module verification failed: signature and/or required key missing - tainting kernel", false},
		{"out-of-tree module", "rdmaplus: loading out-of-tree module taints kernel.", false},
		{"our module", "6,385,3905598,-;rdmaplus: loaded, ABI 10; RVMA and Active Access on", false},
		{"firmware bug", "[Firmware Bug]: TSC doesn't count with P0 frequency!", false},
		{"memory", "Memory: 973540K/1048056K available (14342K kernel code, 2317K rwdata, 9080K rodata, 2792K init, 17412K bss, 74256K reserved, 0K cma-reserved)", false},
		{"W+X check", "x86/mm: Checked W+X mappings: passed, no W+X pages found.", false},
		{"NX", "NX (Execute Disable) protection: active", false},
		{"ib device", "6,300,2000000,-;infiniband rxe0: set active", false},
		{"kmsg continuation", " SUBSYSTEM=infiniband", false},
		{"PCI", "pci 0000:00:01.1: [8086:7010] type 00 class 0x010180", false},
		{"power off", "reboot: Power down", false},
		{"ACPI", "ACPI: _OSC evaluation for CPUs failed, trying _PDC", false},
		// an oops's own lines after its header: the header is the report
		{"call trace", "Call Trace:", false},
		{"RIP", "RIP: 0010:lab_oops_thread+0x32/0x1000 [lab_oops]", false},
		{"tainted", "CPU: 0 PID: 154 Comm: lab_oops Tainted: G           OE      6.1.0-56-amd64 #1  Debian 6.1.192-2", false},
		{"trace end", "---[ end trace 0000000000000000 ]---", false},
		{"SLUB banner", "=============================================================================", false},
		// a user process's crash is not a kernel report
		{"user divide", "traps: prog[201] trap divide error ip:401136 sp:7ffd6e5c3b60 error:0 in prog[401000+1000]", false},
		{"user ud2", "traps: prog[202] trap invalid opcode ip:401136 sp:7ffd6e5c3b60 error:0 in prog[401000+1000]", false},
		{"user segfault", "prog[203]: segfault at 0 ip 0000000000401136 sp 00007ffd6e5c3b60 error 6 in prog[401000+1000] likely on CPU 0 (core 0, socket 0)", false},
		{"user general protection", "traps: prog[204] general protection fault ip:401136 sp:7ffd6e5c3b60 error:0 in prog[401000+1000]", false},
		{"a command's own message", "lab_oops: divide in a kernel thread", false},
	} {
		msg, bad := kernelReport(c.line)
		if bad != c.bad {
			t.Errorf("%s: %q: reported %v, want %v", c.what, c.line, bad, c.bad)
		}
		if bad && msg != kmsgText(c.line) {
			t.Errorf("%s: message %q", c.what, msg)
		}
		// The console shows the same messages after its timestamp.
		if _, bad := consoleKernelReport("[    4.269882] " + kmsgText(c.line)); bad != c.bad {
			t.Errorf("%s on the console: reported %v, want %v", c.what, bad, c.bad)
		}
	}
}
