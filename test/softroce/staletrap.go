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

// staleTrapReason: a guest's first kernel report is an int3 taken from
// memory that held none (staleInt3), and every other failed guest was
// merely stopped because of that. The qemu fault is rare (two boots in
// several hundred) and strikes wherever the kernel patches itself, in
// boots with no module of ours loaded too. It returns the guests'
// evidence, or "".
func staleTrapReason(guests []*guest, timeout time.Duration) string {
	var stale []string
	for _, g := range guests {
		if g.verdict(timeout) == "" || g.stoppedForPeer() {
			continue
		}
		console, err := os.ReadFile(filepath.Join(g.dir, "console.log"))
		if err != nil {
			return ""
		}
		why, ok := staleInt3(console)
		if !ok {
			return ""
		}
		stale = append(stale, g.name+": "+why)
	}
	return strings.Join(stale, "; ")
}
