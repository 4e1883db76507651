package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// int3Oops matches the die header of a breakpoint the kernel did not
// expect ("Oops: int3: 0000 [#1] PREEMPT SMP NOPTI" from 6.12 on,
// "int3: 0000 [#1] ..." before).
var int3Oops = regexp.MustCompile(`^(Oops: )?int3: [0-9a-f]{4} \[#\d+\]`)

// oopsCode matches the bytes an oops dumps around the trapping address,
// read from memory when the report is printed: "Code: 48 8b ... <1f> 44 ...",
// the byte in angle brackets at the reported RIP.
var oopsCode = regexp.MustCompile(`^Code: (.*)$`)

// staleInt3 reads a guest's console log. When the kernel's first report
// there is an unexpected int3, it says whether the bytes the report dumps
// prove that memory held no int3 where the CPU trapped: after an int3 the
// reported RIP is the next byte, so the byte before the bracketed one is
// what sat at the breakpoint. Linux patches its text (ftrace, static keys
// and calls) by putting an int3 on an instruction's first byte while it
// rewrites the rest, and a CPU that meets it is sent on by the kernel's
// handler until the patch is done. An int3 taken later, from memory that
// no longer holds it, comes from a translation qemu's TCG kept after the
// byte changed (docs/lab.md, "A qemu 7.2 fault"); a real CPU cannot take
// it. It returns the report and the evidence, and whether it is that.
func staleInt3(console []byte) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(console))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var report, rip string
	for sc.Scan() {
		line := sc.Text()
		loc := consoleStamp.FindStringIndex(line)
		if loc == nil {
			continue
		}
		msg := strings.TrimSpace(line[loc[1]:])
		if report == "" {
			if !isKernelProblem(msg) {
				continue
			}
			if !int3Oops.MatchString(msg) {
				return "", false // the first report is something else
			}
			report = msg
			continue
		}
		if strings.HasPrefix(msg, "RIP: ") && rip == "" {
			rip = strings.TrimPrefix(msg, "RIP: ")
		}
		if m := oopsCode.FindStringSubmatch(msg); m != nil {
			before, ok := byteBeforeRIP(m[1])
			if !ok || before == "cc" {
				return "", false
			}
			return fmt.Sprintf("kernel %s at %s, where memory holds %s, not int3 (cc): a translation qemu kept after the kernel patched the byte", report, rip, before), true
		}
		if isKernelProblem(msg) {
			return "", false // a second report before the first's code dump
		}
	}
	return "", false
}

// byteBeforeRIP returns the byte before the bracketed one in an oops's code
// dump ("... 0f <1f> 44 ..." gives "0f").
func byteBeforeRIP(code string) (string, bool) {
	f := strings.Fields(code)
	for i, b := range f {
		if len(b) == 4 && b[0] == '<' && b[3] == '>' {
			if i == 0 || !isHexByte(f[i-1]) {
				return "", false
			}
			return f[i-1], true
		}
	}
	return "", false
}

func isHexByte(s string) bool {
	if len(s) != 2 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// stallReport matches the kernel's reports of a CPU that stopped making
// progress: an RCU stall the CPU detected itself or another saw, and a soft
// lockup.
var stallReport = regexp.MustCompile(`^(rcu: INFO: rcu_\S+ (self-)?detected stalls? on CPU|INFO: rcu_\S+ (self-)?detected stalls? on CPU|watchdog: BUG: soft lockup)`)

// ripAtEntry matches a kernel-mode RIP line at a function's first byte
// ("RIP: 0010:rxe_responder+0x0/0x1cf0 [rdma_rxe]").
var ripAtEntry = regexp.MustCompile(`^RIP: 0010:(\S+\+0x0/\S+)`)

// parkedAtPatchSite reads a guest's kernel log (kmsg.log's records). When
// its first report is a stall or soft lockup whose CPU sits at a
// function's first byte, and memory there holds the instruction Linux
// patches at function entries (ftrace's 5-byte CALL, e8, or the 5-byte
// NOP it replaces, 0f 1f 44 00 00), and every later report of the log
// names the same place, it says so. A CPU cannot stay on a CALL or a NOP:
// the place is where ftrace's text_poke_bp put its temporary int3, and the
// CPU is looping through a translation qemu's TCG kept of it
// (docs/lab.md, "A qemu 7.2 fault"; one vCPU was seen to do so through
// qemu's gdbstub). A loop of ours would be caught at instructions of its
// body, not parked at one entry.
func parkedAtPatchSite(log []byte) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var report, rip, code string
	expectRIP, expectCode := false, false
	for sc.Scan() {
		msg := strings.TrimSpace(kmsgText(sc.Text()))
		if isKernelProblem(msg) {
			if !stallReport.MatchString(msg) {
				return "", false // the first report, or a later one, of another kind
			}
			if report == "" {
				report = msg
			}
			expectRIP = true
			continue
		}
		if expectRIP && strings.HasPrefix(msg, "RIP: 0010:") {
			expectRIP = false
			m := ripAtEntry.FindStringSubmatch(msg)
			switch {
			case m == nil:
				return "", false
			case rip == "":
				rip, expectCode = m[1], true
			case m[1] != rip:
				return "", false // the CPU moved: not parked
			}
			continue
		}
		if expectCode {
			if m := oopsCode.FindStringSubmatch(msg); m != nil {
				code, expectCode = m[1], false
			}
		}
	}
	if rip == "" || code == "" {
		return "", false
	}
	at, ok := bracketed(code)
	if !ok || (at != "e8" && at != "0f") {
		return "", false
	}
	return fmt.Sprintf("kernel %s with its CPU parked at %s, which holds %s (ftrace's patched entry), not a loop: a translation qemu kept of the int3 ftrace put there", report, rip, at), true
}

// bracketed returns the byte in angle brackets of an oops's code dump.
func bracketed(code string) (string, bool) {
	for _, b := range strings.Fields(code) {
		if len(b) == 4 && b[0] == '<' && b[3] == '>' && isHexByte(b[1:3]) {
			return b[1:3], true
		}
	}
	return "", false
}

// emulatorFault tells whether a failed guest's logs prove the qemu fault
// (staleInt3 on its console, parkedAtPatchSite in its kernel log).
func emulatorFault(g *guest) (string, bool) {
	if console, err := os.ReadFile(filepath.Join(g.dir, "console.log")); err == nil {
		if why, ok := staleInt3(console); ok {
			return why, true
		}
	}
	if log, err := os.ReadFile(filepath.Join(g.dir, "kmsg.log")); err == nil {
		if why, ok := parkedAtPatchSite(log); ok {
			return why, true
		}
	}
	return "", false
}

// staleTrapReason: a guest's logs prove the qemu fault (emulatorFault),
// and every other failed guest either stopped because of it or failed
// with no kernel report and no vCPU stuck with interrupts off of its own
// (a peer's test that waited on the stuck guest fails as a test). The
// fault is rare (a few boots in several hundred) and strikes wherever the
// kernel patches itself, in boots with no module of ours loaded too. It
// returns the guests' evidence, or "".
func staleTrapReason(guests []*guest, timeout time.Duration) string {
	var stale []string
	for _, g := range guests {
		if g.verdict(timeout) == "" || g.stoppedForPeer() {
			continue
		}
		if why, ok := emulatorFault(g); ok {
			stale = append(stale, g.name+": "+why)
			continue
		}
		g.mu.Lock()
		own := len(g.kernel) > 0 || len(g.bootReports) > 0 || g.vcpusIRQsOff ||
			g.state == stateNoReport || g.state == stateHung
		g.mu.Unlock()
		if own {
			return ""
		}
	}
	return strings.Join(stale, "; ")
}
