package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// infoRegisters is what qemu 7.2's info registers -a printed for a
// two-vCPU guest after a kernel panic (panic=0): vCPU 0 in panic's delay
// loop, which runs with interrupts on (RFL 0x283), vCPU 1 stopped by the
// panic, halted with interrupts off (RFL 0x93). Most of the FPU and
// vector registers are left out.
const infoRegisters = `
CPU#0
RAX=0000000df98d9663 RBX=0000000000005014 RCX=0000000000000000 RDX=0000000000020fb8
RSI=0000000000000000 RDI=0000000df98b86ab RBP=ffffc90000013e10 RSP=ffffc90000013d98
R8 =0000000000000000 R9 =0000000000274c0a R10=0000000000000003 R11=ffffffff82ad4448
R12=0000000000000001 R13=0000000000005078 R14=0000000000000029 R15=0000000000000000
RIP=ffffffff819f77a3 RFL=00000283 [--S---C] CPL=0 II=0 A20=1 SMM=0 HLT=0
ES =0000 0000000000000000 00000000 00000000
CS =0010 0000000000000000 ffffffff 00af9b00 DPL=0 CS64 [-RA]
SS =0018 0000000000000000 ffffffff 00cf9300 DPL=0 DS   [-WA]
GDT=     fffffe0000001000 0000007f
IDT=     fffffe0000000000 00000fff
CR0=80050033 CR2=ffff888004401000 CR3=0000000002a10000 CR4=00750ef0
EFER=0000000000000d01
FCW=037f FSW=0000 [ST=0] FTW=00 MXCSR=00001f80
YMM15=0000000000000000 0000000000000000 0000000000000000 0000000000000040

CPU#1
RAX=0000000000000002 RBX=0000000000000001 RCX=00000000c0000080 RDX=0000000000000000
RSI=00000000000000ff RDI=ffff88801f5198c0 RBP=ffff88801f5198c0 RSP=ffffc900000d0df8
R8 =0000000000000000 R9 =0000000000000000 R10=0000000000000000 R11=0000000000000000
R12=0000000000000000 R13=0000000000000000 R14=0000000000000000 R15=0000000000000000
RIP=ffffffff8103fc9b RFL=00000093 [--S-A-C] CPL=0 II=0 A20=1 SMM=0 HLT=1
ES =0000 0000000000000000 00000000 00000000
CS =0010 0000000000000000 ffffffff 00af9b00 DPL=0 CS64 [-RA]
CR0=80050033 CR2=0000000000000000 CR3=0000000002a10000 CR4=00750ee0
YMM15=0000000000000000 0000000000000000 0000000000000000 0000000000000040
`

// irqOffRegisters is what it printed for selftest-irqoff's one vCPU,
// spinning in lab_oops.ko with interrupts off (RFL 0x46).
const irqOffRegisters = `
CPU#0
RAX=0000000000000000 RBX=ffff88803fc369d0 RCX=0000000000000000 RDX=0000000000000000
RSI=ffffffffc038a0d1 RDI=ffff88803fc369d0 RBP=ffffc9000068b948 RSP=ffffc900006c3f10
R8 =0000000000000000 R9 =ffffc900006c3da8 R10=0000000000000003 R11=ffffffff82ad4448
R12=ffff8880070a0000 R13=ffff88803fcbd380 R14=ffff88803fc369d0 R15=ffffffffc0389000
RIP=ffffffffc0389074 RFL=00000046 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0
ES =0000 0000000000000000 00000000 00000000
CS =0010 0000000000000000 ffffffff 00af9b00 DPL=0 CS64 [-RA]
`

func TestParseRegisters(t *testing.T) {
	got := parseRegisters(strings.ReplaceAll(infoRegisters, "\n", "\r\n"))
	want := []vcpu{
		{index: 0, rip: 0xffffffff819f77a3, rflags: 0x283, cpl: 0},
		{index: 1, rip: 0xffffffff8103fc9b, rflags: 0x93, cpl: 0, halted: true},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("parseRegisters = %+v, want %+v", got, want)
	}
	if !got[0].irqsOn() || got[1].irqsOn() {
		t.Error("IF misread")
	}
	if got := parseRegisters(irqOffRegisters); len(got) != 1 || got[0].rip != 0xffffffffc0389074 || got[0].irqsOn() || got[0].halted {
		t.Errorf("selftest-irqoff's registers: %+v", got)
	}
	// Before the kernel enters long mode (a guest that hangs early in its boot).
	real := "\nCPU#0\nEAX=00000000 EBX=00000000 ECX=00000000 EDX=00060fb1\n" +
		"EIP=0000fff0 EFL=00000202 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=0\n"
	if got := parseRegisters(real); len(got) != 1 || got[0].rip != 0xfff0 || !got[0].irqsOn() {
		t.Errorf("32-bit registers: %+v", got)
	}
	for _, junk := range []string{"", "Error: no CPU\n", "RIP=ffffffff819f77a3 RFL=00000283 [--S---C] CPL=0 II=0 A20=1 SMM=0 HLT=0\n"} {
		if got := parseRegisters(junk); len(got) != 0 {
			t.Errorf("parseRegisters(%q) = %+v", junk, got)
		}
	}
}

func TestDescribeVCPU(t *testing.T) {
	const (
		on  = 0x246 // IF set
		off = 0x046
	)
	idle := vcpu{rip: 0xffffffff81a3c0de, rflags: on, halted: true}
	spin := vcpu{rip: 0xffffffffc0389074, rflags: off}
	for _, c := range []struct {
		looks []vcpu
		want  string
	}{
		{[]vcpu{idle, idle}, "idle"},
		{[]vcpu{idle}, "idle"},
		{[]vcpu{spin, spin}, "stuck with interrupts off (RIP ffffffffc0389074 in module space)"},
		{[]vcpu{spin, {rip: 0xffffffffc0389076, rflags: off}}, "stuck with interrupts off (RIP ffffffffc0389074 in module space, then ffffffffc0389076 in module space)"},
		{[]vcpu{spin}, "interrupts off (RIP ffffffffc0389074 in module space)"},
		{[]vcpu{{rip: 0xffffffff8103fc9b, rflags: 0x93, halted: true}, {rip: 0xffffffff8103fc9b, rflags: 0x93, halted: true}}, "halted with interrupts off (RIP ffffffff8103fc9b in kernel text)"},
		{[]vcpu{{rip: 0xffffffff819f77a3, rflags: on}, {rip: 0x4011a6, rflags: on, cpl: 3}}, "running (RIP ffffffff819f77a3 in kernel text, then 4011a6 in user space)"},
		{[]vcpu{idle, {rip: 0xffffffff819f77a3, rflags: off}}, "idle, then interrupts off (RIP ffffffff819f77a3 in kernel text)"},
		{[]vcpu{{rip: 0x1000000, rflags: off}, idle}, "interrupts off (RIP 1000000 in kernel), then idle"},
	} {
		if got := describeVCPU(c.looks); got != c.want {
			t.Errorf("describeVCPU(%+v)\n got %q\nwant %q", c.looks, got, c.want)
		}
	}
}

func TestSummarizeVCPUs(t *testing.T) {
	panicked := parseRegisters(infoRegisters)
	sum, off := summarizeVCPUs([][]vcpu{panicked, panicked})
	if want := "#0 running (RIP ffffffff819f77a3 in kernel text); #1 halted with interrupts off (RIP ffffffff8103fc9b in kernel text)"; sum != want || !off {
		t.Errorf("summarizeVCPUs = %q, %v; want %q, true", sum, off, want)
	}
	spinning := parseRegisters(irqOffRegisters)
	sum, off = summarizeVCPUs([][]vcpu{spinning, spinning})
	if want := "#0 stuck with interrupts off (RIP ffffffffc0389074 in module space)"; sum != want || !off {
		t.Errorf("summarizeVCPUs = %q, %v; want %q, true", sum, off, want)
	}
	idle := []vcpu{{index: 0, rip: 1, rflags: rflagsIF, halted: true}, {index: 1, rip: 2, rflags: rflagsIF, halted: true}}
	sum, off = summarizeVCPUs([][]vcpu{idle, idle})
	if sum != "#0 idle; #1 idle" || off {
		t.Errorf("idle guest: %q, %v", sum, off)
	}
	// Interrupts off in one look only is no finding.
	spinOnce := []vcpu{{index: 0, rip: 3}, idle[1]}
	if _, off := summarizeVCPUs([][]vcpu{spinOnce, idle}); off {
		t.Error("interrupts off in one look counted as stuck")
	}
	if sum, off := summarizeVCPUs(nil); off || !strings.Contains(sum, "unknown") {
		t.Errorf("no looks: %q, %v", sum, off)
	}
}

// fakeMonitor serves a qemu human monitor on a Unix socket that answers
// info cpus and info registers -a for the spinning guest of
// irqOffRegisters.
func fakeMonitor(t *testing.T) string {
	t.Helper()
	addr := filepath.Join(t.TempDir(), "mon.sock")
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				fmt.Fprint(c, "QEMU 7.2.22 monitor - type 'help' for more information\r\n(qemu) ")
				r := bufio.NewReader(c)
				for {
					cmd, err := r.ReadString('\n')
					if err != nil {
						return
					}
					cmd = strings.TrimSpace(cmd)
					fmt.Fprintf(c, "%s\r\n", cmd)
					switch cmd {
					case "info cpus":
						fmt.Fprint(c, "* CPU #0: thread_id=9958\r\n")
					case "info registers -a":
						fmt.Fprint(c, strings.ReplaceAll(irqOffRegisters, "\n", "\r\n"))
					}
					fmt.Fprint(c, "(qemu) ")
				}
			}(c)
		}
	}()
	return addr
}

func TestProbeVCPUs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vcpus.txt")
	sum, off := probeVCPUs(fakeMonitor(t), path)
	want := "vCPUs over 1s (vcpus.txt): #0 stuck with interrupts off (RIP ffffffffc0389074 in module space)"
	if sum != want || !off {
		t.Errorf("probeVCPUs = %q, %v\nwant %q, true", sum, off, want)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !containsAll(string(b), []string{"=== look 1", "=== look 2", "(qemu) info cpus\n* CPU #0: thread_id=9958", "(qemu) info registers -a\n", "RIP=ffffffffc0389074 RFL=00000046"}) {
		t.Errorf("vcpus.txt:\n%s", b)
	}
	sum, off = probeVCPUs(filepath.Join(t.TempDir(), "none.sock"), filepath.Join(t.TempDir(), "vcpus.txt"))
	if off || !strings.HasPrefix(sum, "vCPUs unknown (qemu's monitor: ") {
		t.Errorf("no monitor: %q, %v", sum, off)
	}
}

// The lab looks at a hung guest's vCPUs before it kills it at the
// deadline, and at an unbooted guest's before the boot watchdog kills it;
// the verdict quotes what it saw.
func TestWaitGuestsLooksAtVCPUs(t *testing.T) {
	stub := func(g *guest, account string, off bool) *int {
		n := new(int)
		g.probeVCPUs = func() (string, bool) {
			g.mu.Lock()
			running := g.state == stateRunning
			g.mu.Unlock()
			if !running {
				t.Errorf("%s: looked at after it was killed", g.name)
			}
			*n++
			return account, off
		}
		return n
	}
	out := &syncWriter{w: io.Discard}

	g := fakeGuest(t, "s/g2", phaseReady)
	looks := stub(g, "vCPUs over 1s (vcpus.txt): #0 stuck with interrupts off (RIP ffffffffc0389074 in module space)", true)
	waitGuests(context.Background(), []*guest{g}, 300*time.Millisecond, 0, false, out)
	if *looks != 1 {
		t.Errorf("%d looks at the hung guest", *looks)
	}
	want := "s/g2: no result within the 1m0s deadline (hung); killed; vCPUs over 1s (vcpus.txt): #0 stuck with interrupts off (RIP ffffffffc0389074 in module space)"
	if got := g.verdict(time.Minute); got != want {
		t.Errorf("verdict\n got %q\nwant %q", got, want)
	}

	ready, stuck := fakeGuest(t, "s/g1", phaseReady), fakeGuest(t, "s/g2", phaseKernel)
	readyLooks := stub(ready, "vCPUs over 1s (vcpus.txt): #0 idle", false)
	stuckLooks := stub(stuck, "vCPUs over 1s (vcpus.txt): #0 idle", false)
	waitGuests(context.Background(), []*guest{ready, stuck}, time.Minute, 200*time.Millisecond, false, out)
	if *readyLooks != 0 || *stuckLooks != 1 {
		t.Errorf("boot watchdog: %d looks at the booted guest, %d at the unbooted one; want 0, 1", *readyLooks, *stuckLooks)
	}
	if got := stuck.verdict(time.Minute); !strings.HasSuffix(got, "(no console output); killed; vCPUs over 1s (vcpus.txt): #0 idle") {
		t.Errorf("unbooted guest's verdict %q", got)
	}
}

// A guest stopped after its peer failed names its vCPUs only when one had
// interrupts off, and is then no longer a mere bystander.
func TestVerdictOfPeerWithInterruptsOff(t *testing.T) {
	g := &guest{name: "s/g2", state: statePeerFailed, stopWhy: "stopped 10s after s/g1 failed", vcpus: "vCPUs over 1s (vcpus.txt): #0 idle"}
	if got := g.verdict(time.Minute); got != "s/g2: stopped 10s after s/g1 failed" {
		t.Errorf("idle peer: %q", got)
	}
	if !g.stoppedForPeer() {
		t.Error("an idle peer is not a bystander")
	}
	g.vcpus, g.vcpusIRQsOff = "vCPUs over 1s (vcpus.txt): #0 stuck with interrupts off (RIP ffffffff819f77a3 in kernel text)", true
	if got, want := g.verdict(time.Minute), "s/g2: stopped 10s after s/g1 failed; "+g.vcpus; got != want {
		t.Errorf("stuck peer: %q, want %q", got, want)
	}
	if g.stoppedForPeer() {
		t.Error("a peer stuck with interrupts off counted as a bystander")
	}
}
