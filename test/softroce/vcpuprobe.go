package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Before the lab kills a guest that stopped answering (the suite's
// deadline, the boot watchdog, or its peer's failure), it looks at the
// guest's vCPUs through qemu's monitor, twice, vcpuGap apart: qemu's
// info registers -a gives each vCPU's RIP, RFLAGS (IF, bit 9: interrupts
// on) and whether it is halted. A guest whose vCPU spins with interrupts
// off (a spinlock taken with interrupts disabled on every CPU, a loop in
// an interrupt handler) prints nothing in its kernel log when no other CPU
// is left to report it; the verdict then says so instead of leaving only
// "hung", or blaming the peer that gave up waiting for it. Everything the
// monitor printed goes to the guest's vcpus.txt.

// vcpuGap is the time between the two looks at a guest's vCPUs.
const vcpuGap = time.Second

// A vcpu is one vCPU as info registers shows it.
type vcpu struct {
	index  int
	rip    uint64
	rflags uint64
	cpl    int
	halted bool
}

// rflagsIF is RFLAGS' interrupt flag.
const rflagsIF = 1 << 9

func (c vcpu) irqsOn() bool { return c.rflags&rflagsIF != 0 }

var (
	// vcpuHeader starts each vCPU's part of info registers -a ("CPU#1").
	vcpuHeader = regexp.MustCompile(`^CPU#(\d+)\s*$`)
	// vcpuState is the line with the instruction pointer, flags, privilege
	// level and halt state, in long mode or not: "RIP=ffffffff819f77a3
	// RFL=00000283 [--S---C] CPL=0 II=0 A20=1 SMM=0 HLT=0", "EIP=0000fff0
	// EFL=00000002 [-------] CPL=0 ...".
	vcpuState = regexp.MustCompile(`^[RE]IP=([0-9a-f]+) [RE]FL=([0-9a-f]+) .*\bCPL=(\d+) .*\bHLT=(\d)`)
)

// parseRegisters returns the vCPUs of qemu's info registers -a output, in
// its order.
func parseRegisters(out string) []vcpu {
	var cpus []vcpu
	index := -1
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if m := vcpuHeader.FindStringSubmatch(l); m != nil {
			index, _ = strconv.Atoi(m[1])
			continue
		}
		m := vcpuState.FindStringSubmatch(l)
		if m == nil || index < 0 {
			continue
		}
		rip, err1 := strconv.ParseUint(m[1], 16, 64)
		fl, err2 := strconv.ParseUint(m[2], 16, 64)
		cpl, err3 := strconv.Atoi(m[3])
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		cpus = append(cpus, vcpu{index: index, rip: rip, rflags: fl, cpl: cpl, halted: m[4] == "1"})
		index = -1
	}
	return cpus
}

// ripWhere says where an instruction pointer is: x86-64 Linux maps its
// image at 0xffffffff80000000 and modules (and BPF programs, ftrace and
// kprobe trampolines) from 0xffffffffc0000000.
func ripWhere(c vcpu) string {
	switch {
	case c.cpl == 3:
		return "user space"
	case c.rip >= 0xffffffffc0000000:
		return "module space"
	case c.rip >= 0xffffffff80000000:
		return "kernel text"
	}
	return "kernel"
}

// vcpuClass is what one look says about a vCPU.
func vcpuClass(c vcpu) string {
	switch {
	case c.halted && c.irqsOn():
		return "idle"
	case c.halted:
		return "halted with interrupts off"
	case !c.irqsOn():
		return "interrupts off"
	}
	return "running"
}

// describeVCPU says what the looks (one or two, in order) show of one
// vCPU: "idle", "stuck with interrupts off (RIP ffffffffc036a02b in module
// space)", "running (RIP ... in kernel text, then ... in user space)",
// "idle, then running (RIP ...)".
func describeVCPU(looks []vcpu) string {
	same := true
	for _, c := range looks[1:] {
		same = same && vcpuClass(c) == vcpuClass(looks[0])
	}
	rips := func(cs []vcpu) string {
		var parts []string
		for i, c := range cs {
			if i > 0 && c.rip == cs[i-1].rip && c.cpl == cs[i-1].cpl {
				continue
			}
			parts = append(parts, fmt.Sprintf("%x in %s", c.rip, ripWhere(c)))
		}
		return "RIP " + strings.Join(parts, ", then ")
	}
	if !same {
		var parts []string
		for _, c := range looks {
			p := vcpuClass(c)
			if p != "idle" {
				p += " (" + rips([]vcpu{c}) + ")"
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, ", then ")
	}
	switch class := vcpuClass(looks[0]); {
	case class == "idle":
		return class
	case class == "interrupts off" && len(looks) > 1:
		return "stuck with interrupts off (" + rips(looks) + ")"
	default:
		return class + " (" + rips(looks) + ")"
	}
}

// summarizeVCPUs is the verdict's account of the looks at a guest's vCPUs
// (each look's info registers -a, parsed), e.g. "#0 stuck with interrupts
// off (RIP ffffffffc036a02b in module space); #1 idle". irqsOff reports
// whether some vCPU had interrupts off in every look.
func summarizeVCPUs(looks [][]vcpu) (account string, irqsOff bool) {
	byIndex := map[int][]vcpu{}
	var order []int
	for _, look := range looks {
		for _, c := range look {
			if _, ok := byIndex[c.index]; !ok {
				order = append(order, c.index)
			}
			byIndex[c.index] = append(byIndex[c.index], c)
		}
	}
	if len(order) == 0 {
		return "unknown (no registers from qemu's monitor)", false
	}
	var parts []string
	for _, i := range order {
		cs := byIndex[i]
		off := true
		for _, c := range cs {
			off = off && !c.irqsOn()
		}
		irqsOff = irqsOff || off
		parts = append(parts, fmt.Sprintf("#%d %s", i, describeVCPU(cs)))
	}
	return strings.Join(parts, "; "), irqsOff
}

// probeVCPUs looks at the vCPUs of the qemu whose monitor is at addr twice,
// vcpuGap apart, writes what the monitor printed to path, and returns the
// verdict's account ("vCPUs over 1s (vcpus.txt): #0 idle") and whether a
// vCPU had interrupts off throughout.
func probeVCPUs(addr, path string) (account string, irqsOff bool) {
	var b strings.Builder
	var looks [][]vcpu
	var errs []string
	for round := range 2 {
		if round > 0 {
			time.Sleep(vcpuGap)
		}
		fmt.Fprintf(&b, "=== look %d at %s\n", round+1, time.Now().Format(time.RFC3339Nano))
		out, err := hmp(addr, []string{"info cpus", "info registers -a"}, 3*time.Second)
		b.WriteString(out)
		if err != nil {
			fmt.Fprintf(&b, "monitor: %v\n", err)
			errs = append(errs, err.Error())
		}
		cpus := parseRegisters(out)
		if len(cpus) > 0 {
			looks = append(looks, cpus)
		} else if err != nil {
			break // qemu is gone, or its monitor does not answer
		}
	}
	file := filepath.Base(path)
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		file = err.Error()
	}
	if len(looks) == 0 && len(errs) > 0 {
		return fmt.Sprintf("vCPUs unknown (qemu's monitor: %s)", errs[0]), false
	}
	over := ""
	if len(looks) > 1 {
		over = fmt.Sprintf(" over %s", vcpuGap)
	}
	sum, off := summarizeVCPUs(looks)
	return fmt.Sprintf("vCPUs%s (%s): %s", over, file, sum), off
}

// lookAtVCPUs samples, all at once, the vCPUs of the guests that are still
// running and that pick selects (called with g.mu held), and keeps each
// account for the verdict. It returns when every look is done (about
// vcpuGap).
func lookAtVCPUs(guests []*guest, pick func(*guest) bool, out *syncWriter) {
	var wg sync.WaitGroup
	for _, g := range guests {
		g.mu.Lock()
		look := g.state == stateRunning && g.probeVCPUs != nil && pick(g)
		g.mu.Unlock()
		if !look {
			continue
		}
		wg.Add(1)
		go func(g *guest) {
			defer wg.Done()
			s, off := g.probeVCPUs()
			g.mu.Lock()
			g.vcpus, g.vcpusIRQsOff = s, off
			g.mu.Unlock()
			out.printf("[%s] %s\n", g.name, s)
		}(g)
	}
	wg.Wait()
}
