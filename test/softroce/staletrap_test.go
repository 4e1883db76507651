package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// int3Console is a console log around an int3 oops whose code dump holds
// before as the byte at the breakpoint.
func int3Console(header, before string) string {
	return `[    2.301000] clocksource: Switched to clocksource tsc
[    2.312345] ` + header + `
[    2.312400] CPU: 0 UID: 0 PID: 0 Comm: swapper/0 Not tainted 7.2.13-amd64 #1 PREEMPT(lazy)  Debian 7.2.13-1
[    2.312500] RIP: 0010:ktime_get+0x3b/0xb0
[    2.312600] Code: 48 8b 15 d1 3c 6f 01 48 89 d0 83 e0 01 75 f0 48 8b 3d 82 3c 6f 01 ` + before + ` <1f> 44 00 00 48 8b 0d 7e
[    2.312700] RSP: 0018:ffffffff8a803e48 EFLAGS: 00000046
[    2.313000] Kernel panic - not syncing: Fatal exception in interrupt
`
}

func TestStaleInt3(t *testing.T) {
	for _, c := range []struct {
		what, console string
		stale         bool
	}{
		{"7.x header, a NOP's first byte in memory", int3Console("Oops: int3: 0000 [#1] PREEMPT SMP NOPTI", "0f"), true},
		{"6.1 header, a NOP's first byte in memory", int3Console("int3: 0000 [#1] PREEMPT SMP NOPTI", "0f"), true},
		{"an int3 that is in memory", int3Console("Oops: int3: 0000 [#1] PREEMPT SMP NOPTI", "cc"), false},
		{"another oops", int3Console("Oops: general protection fault: 0000 [#1] PREEMPT SMP NOPTI", "0f"), false},
		{"a WARNING before the int3", "[    1.0] WARNING: CPU: 0 PID: 1 at x\n" + int3Console("Oops: int3: 0000 [#1] SMP", "0f"), false},
		{"no code dump", "[    2.3] Oops: int3: 0000 [#1] SMP\n[    2.3] RIP: 0010:f+0x1/0x2\n[    2.3] Code: Unable to access opcode bytes at 0xffffffff81000000.\n", false},
		{"the breakpoint first in the dump", "[    2.3] Oops: int3: 0000 [#1] SMP\n[    2.3] Code: <1f> 44 00\n", false},
		{"no report", "[    2.3] clocksource: Switched to clocksource tsc\n", false},
	} {
		why, stale := staleInt3([]byte(c.console))
		if stale != c.stale {
			t.Errorf("%s: stale %v (%q), want %v", c.what, stale, why, c.stale)
		}
		if stale && !strings.Contains(why, "ktime_get+0x3b/0xb0, where memory holds 0f") {
			t.Errorf("%s: %q does not give the evidence", c.what, why)
		}
	}
}

func TestStaleTrapReason(t *testing.T) {
	dir := t.TempDir()
	write := func(name, console string) string {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "console.log"), []byte(console), 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	stale := write("stale", int3Console("Oops: int3: 0000 [#1] SMP", "0f"))
	real := write("real", int3Console("Oops: int3: 0000 [#1] SMP", "cc"))
	crashed := func(name, d string) *guest {
		return &guest{name: name, dir: d, state: stateNoReport, bootReports: []string{"Oops: int3: 0000 [#1] SMP"}}
	}
	peer := &guest{name: "s/g1", state: statePeerFailed}
	for _, c := range []struct {
		what   string
		guests []*guest
		retry  bool
	}{
		{"a stale int3, its peer stopped", []*guest{peer, crashed("s/g2", stale)}, true},
		{"a stale int3 alone", []*guest{crashed("s", stale)}, true},
		{"an int3 in memory", []*guest{crashed("s", real)}, false},
		{"a stale int3, its peer's test failing as it waited", []*guest{{name: "s/g1", state: stateExited, status: 1, dir: real}, crashed("s/g2", stale)}, true},
		{"a stale int3 and a peer's own kernel report", []*guest{{name: "s/g1", state: stateExited, status: 1, dir: real, kernel: []string{"BUG: x"}}, crashed("s/g2", stale)}, false},
		{"no console log", []*guest{crashed("s", filepath.Join(dir, "none"))}, false},
		{"all passed", []*guest{{name: "s", state: stateExited}}, false},
	} {
		got := staleTrapReason(c.guests, time.Minute)
		if (got != "") != c.retry {
			t.Errorf("%s: reason %q, want retry %v", c.what, got, c.retry)
		}
	}
}

// TestParkedAtPatchSite: the kernel log of a lab run that hit the qemu
// fault (kmod-repost-fork, bookworm, 2026-11-29: an RCU stall with the CPU
// at rxe_responder+0x0, which holds ftrace's CALL) is recognised; the same
// log changed in each of the ways a bug of ours would look is not.
func TestParkedAtPatchSite(t *testing.T) {
	real, err := os.ReadFile("testdata/parked-kmsg.log")
	if err != nil {
		t.Fatal(err)
	}
	why, ok := parkedAtPatchSite(real)
	if !ok || !strings.Contains(why, "rxe_responder+0x0/0x1cf0, which holds e8") {
		t.Fatalf("the recorded fault: %v, %q", ok, why)
	}
	log := string(real)
	replace := func(old, new string) []byte {
		if !strings.Contains(log, old) {
			t.Fatalf("the fixture has no %q", old)
		}
		return []byte(strings.Replace(log, old, new, 1))
	}
	second := "\n4,500,51000000,-;watchdog: BUG: soft lockup - CPU#0 stuck for 45s! [kmod.test:155]\n4,501,51000001,-;RIP: 0010:"
	for _, c := range []struct {
		what string
		log  []byte
	}{
		{"inside the function", replace("RIP: 0010:rxe_responder+0x0/0x1cf0", "RIP: 0010:rxe_responder+0x2a/0x1cf0")},
		{"an int3 in memory", replace("<e8> 7b a4 fa ff", "<cc> 7b a4 fa ff")},
		{"another instruction", replace("<e8> 7b a4 fa ff", "<48> 7b a4 fa ff")},
		{"a WARNING first", replace("3,394,29371174,-;rcu: INFO", "4,393,29371000,-;WARNING: CPU: 0 PID: 1 at x\n3,394,29371174,-;rcu: INFO")},
		{"an oops after", []byte(log + "\n4,500,51000000,-;BUG: kernel NULL pointer dereference, address: 0000000000000000\n")},
		{"a later report elsewhere", []byte(log + second + "rxe_requester+0x10/0x900 [rdma_rxe]\n")},
		{"no report", []byte("6,1,0,-;Linux version 6.1.0\n")},
	} {
		if why, ok := parkedAtPatchSite(c.log); ok {
			t.Errorf("%s: recognised as the qemu fault: %q", c.what, why)
		}
	}
	if why, ok := parkedAtPatchSite([]byte(log + second + "rxe_responder+0x0/0x1cf0 [rdma_rxe]\n")); !ok {
		t.Errorf("a later report at the same place: not recognised (%q)", why)
	}
}

// TestStaleTrapReasonParked: a guest parked at a patch site, its peer's
// test failing as it waited, is retried; a peer with a kernel report of
// its own, or stuck with interrupts off, is not.
func TestStaleTrapReasonParked(t *testing.T) {
	real, err := os.ReadFile("testdata/parked-kmsg.log")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kmsg.log"), real, 0o644); err != nil {
		t.Fatal(err)
	}
	parked := func() *guest {
		return &guest{name: "s/g1", dir: dir, state: statePeerFailed, kernel: []string{"rcu: INFO: rcu_preempt self-detected stall on CPU"}}
	}
	waited := &guest{name: "s/g2", dir: t.TempDir(), state: stateExited, status: 1}
	if got := staleTrapReason([]*guest{parked(), waited}, time.Minute); !strings.Contains(got, "parked at rxe_responder+0x0") {
		t.Errorf("parked, the peer's test failed waiting: %q", got)
	}
	own := &guest{name: "s/g2", dir: t.TempDir(), state: stateExited, status: 1, kernel: []string{"WARNING: x"}}
	if got := staleTrapReason([]*guest{parked(), own}, time.Minute); got != "" {
		t.Errorf("a peer with its own kernel report: %q", got)
	}
	irqs := &guest{name: "s/g2", dir: t.TempDir(), state: statePeerFailed, vcpusIRQsOff: true}
	if got := staleTrapReason([]*guest{parked(), irqs}, time.Minute); got != "" {
		t.Errorf("a peer stuck with interrupts off: %q", got)
	}
}
