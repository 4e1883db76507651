package main

import (
	"regexp"
	"strings"
)

// kernelProblem matches kernel log lines that fail a lab run:
//   - oopses: the die header of any trap the kernel takes in itself
//     ("Oops: 0002 [#1] PREEMPT SMP NOPTI", "divide error: 0000 [#1] ...",
//     "invalid opcode: 0000 [#1]", "stack segment: 0000 [#1]",
//     "general protection fault, probably for non-canonical address
//     0x...: 0000 [#1]"; an error code and the oops counter), with the
//     titles named again in case a kernel prints them without the header,
//     a double fault ("PANIC: double fault"), a panic;
//   - BUGs: "BUG: ..." (the kernel's own: page faults, sleeping in atomic
//     context, lockups), SLUB's "BUG kmalloc-64 (Tainted: ...): Object
//     already free", "kernel BUG at", data-structure checks
//     ("list_add corruption", "refcount_t: underflow");
//   - WARNINGs, KASAN/UBSAN/KFENCE/kmemleak reports, lockdep splats, soft
//     and hard lockups, hung tasks and RCU stalls (seen by another CPU,
//     "detected stalls on CPUs/tasks", or by the stalled CPU itself,
//     "self-detected stall on CPU");
//   - the OOM killer ("... invoked oom-killer", "Out of memory: Killed
//     process ...").
//
// A user process's crash is not one: the kernel logs it as "traps:
// prog[pid] trap divide error ip:..." or "prog[pid]: segfault at ...",
// which the patterns, anchored at the start of the message, leave out;
// the command's exit status tells. The stock guest kernel has no lockdep,
// KASAN or kmemleak, but a debug kernel can be dropped in, so their reports are
// recognised too. A NIC's stalled transmit queue (nicStall) fails a run
// as well.
var kernelProblem = regexp.MustCompile(`^(WARNING:|BUG[: ]|kernel BUG at|Oops|general protection fault|divide error|invalid opcode|stack segment|double fault|PANIC: double fault|Kernel panic|KASAN:|UBSAN:|KFENCE:|INFO: task .* blocked for more than|INFO: rcu_.*detected stalls?|rcu: INFO: .*detected stalls?|watchdog: BUG: soft lockup|NMI watchdog: Watchdog detected hard LOCKUP|possible circular locking dependency|inconsistent lock state|possible recursive locking|list_(add|del) corruption|refcount_t: |Out of memory|Memory cgroup out of memory)` +
	`|^\S.*: [0-9a-f]{4,16} \[#\d+\]` + // a die header: "<title>: <error code> [#<oops count>]"
	`| invoked oom-killer: |^oom-kill:|^kmemleak: \d+ new suspected memory leaks`)

// nicStall matches the kernel's report of a NIC whose transmit queue has
// not moved for its watchdog's timeout ("virtio_net virtio0 eth0: NETDEV
// WATCHDOG: CPU: 0: transmit queue 0 timed out 60360 ms"): the guest's
// virtio NIC stopped sending, so whatever fails after it in that boot may
// be waiting on the lab network (see nicStallReason).
var nicStall = regexp.MustCompile(`NETDEV WATCHDOG:`)

// isKernelProblem reports whether a kernel message fails a lab run.
func isKernelProblem(msg string) bool {
	return kernelProblem.MatchString(msg) || nicStall.MatchString(msg)
}

// kmsgText returns the message of one /dev/kmsg record ("prio,seq,ts,flags;text").
// Continuation lines (" KEY=value") and anything else come back as they are.
func kmsgText(line string) string {
	if semi := strings.IndexByte(line, ';'); semi > 0 && strings.Count(line[:semi], ",") >= 3 {
		return line[semi+1:]
	}
	return line
}

// kernelReport returns the message if a kernel log line reports a problem.
func kernelReport(line string) (string, bool) {
	msg := strings.TrimSpace(kmsgText(line))
	if isKernelProblem(msg) {
		return msg, true
	}
	return "", false
}

// consoleStamp matches the timestamp the kernel puts before every console
// line ("[    1.234567] ").
var consoleStamp = regexp.MustCompile(`^\[\s*\d+\.\d+\] ?`)

// isConsoleKernelLine reports whether a console line was printed by the kernel.
func isConsoleKernelLine(line string) bool { return consoleStamp.MatchString(line) }

// consoleKernelReport returns the message if a kernel console line reports
// a problem.
func consoleKernelReport(line string) (string, bool) {
	loc := consoleStamp.FindStringIndex(line)
	if loc == nil {
		return "", false
	}
	msg := strings.TrimSpace(line[loc[1]:])
	if isKernelProblem(msg) {
		return msg, true
	}
	return "", false
}
