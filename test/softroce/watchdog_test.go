package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBootWatchdog(t *testing.T) {
	for _, c := range []struct{ timeout, want time.Duration }{
		{5 * time.Minute, bootTimeout},
		{135 * time.Second, bootTimeout},
		{120 * time.Second, 80 * time.Second},
		{90 * time.Second, 60 * time.Second},
		{45 * time.Second, 30 * time.Second}, // selftest-hang
		{100 * time.Second, 67 * time.Second},
		{time.Second, time.Second * 2 / 3},
	} {
		got := bootWatchdog(c.timeout)
		if got != c.want {
			t.Errorf("bootWatchdog(%s) = %s, want %s", c.timeout, got, c.want)
		}
		if got >= c.timeout {
			t.Errorf("bootWatchdog(%s) = %s fires after the deadline", c.timeout, got)
		}
	}
}

func TestConsoleKernelLines(t *testing.T) {
	if msg, bad := consoleKernelReport("[    2.345678] Kernel panic - not syncing: No working init found."); !bad || msg != "Kernel panic - not syncing: No working init found." {
		t.Errorf("panic line: %q, %v", msg, bad)
	}
	if _, bad := consoleKernelReport("[    0.100000] Linux version 6.1.0"); bad {
		t.Error("a plain kernel line reported as a problem")
	}
	if _, bad := consoleKernelReport("Kernel panic in a command's output"); bad {
		t.Error("a line without the kernel's timestamp reported as a kernel problem")
	}
	if !isConsoleKernelLine("[12345.000001] x") || isConsoleKernelLine("[x] y") || isConsoleKernelLine("lab-init: boom") {
		t.Error("isConsoleKernelLine")
	}
}

// What a guest's console streams, and what it remembers for a verdict,
// through its boot phases.
func TestConsoleLine(t *testing.T) {
	g := &guest{name: "s/g2", started: time.Now()}
	steps := []struct {
		line   string
		stream bool
	}{
		{"[    0.000000] Linux version 6.1.0-56-amd64", false},
		{"Poking KASLR using RDRAND RDTSC...", false},
		{"[    0.500000] WARNING: CPU: 0 PID: 1 at somewhere", false},
		{"@@LAB-INIT othertoken", false}, // not ours: still the kernel's log
		{"@@LAB-INIT tok", false},
		{"[    3.000000] random: crng init done", false},
		{"lab-init: insmod x failed", true},
		{"@@LAB-READY tok 6.5", false},
		{"== devices", true},
		{"[    9.000000] reboot: Power down", true},
	}
	for i, s := range steps {
		if got := g.consoleLine(s.line, "tok"); got != s.stream {
			t.Errorf("step %d %q: streamed %v, want %v", i, s.line, got, s.stream)
		}
	}
	if g.phase != phaseReady || g.readyUptime != "6.5" {
		t.Errorf("phase %d uptime %q", g.phase, g.readyUptime)
	}
	if len(g.bootReports) != 1 || !strings.HasPrefix(g.bootReports[0], "WARNING: CPU: 0") {
		t.Errorf("boot reports %q", g.bootReports)
	}
	if g.lastLine != "[    9.000000] reboot: Power down" {
		t.Errorf("last line %q", g.lastLine)
	}
	g.consoleLine(strings.Repeat("x", 1000), "tok")
	if len(g.lastLine) != consoleLineMax+3 {
		t.Errorf("last line not bounded: %d bytes", len(g.lastLine))
	}
}

// A test binary's crash (a panic outside a test, a runtime fatal error:
// status 2, no FAIL line) is quoted from the lines before it to the first
// of its trace; a command failing with neither, by its last lines.
func TestVerdictQuotesCrash(t *testing.T) {
	g := &guest{name: "s/g1", started: time.Now(), phase: phaseReady}
	lines := []string{"=== RUN   TestLabY", "panic: runtime error: index out of range [3] with length 3", "",
		"goroutine 7 [running]:"}
	for i := range 20 {
		lines = append(lines, fmt.Sprintf("frame %d", i))
	}
	for _, l := range lines {
		g.consoleLine(l, "tok")
	}
	g.state, g.status = stateExited, 2
	want := "s/g1: command exited with status 2" +
		"\n    | === RUN   TestLabY" +
		"\n    | panic: runtime error: index out of range [3] with length 3" +
		"\n    | goroutine 7 [running]:" +
		"\n    | frame 0\n    | frame 1\n    | frame 2\n    | frame 3\n    | frame 4"
	if got := g.verdict(time.Minute); got != want {
		t.Errorf("verdict\n got %q\nwant %q", got, want)
	}

	g = &guest{name: "s/g1", started: time.Now(), phase: phaseReady}
	for _, l := range []string{"a", "b", "lab: no such file"} {
		g.consoleLine(l, "tok")
	}
	g.state, g.status = stateExited, 1
	want = "s/g1: command exited with status 1\n    | a\n    | b\n    | lab: no such file"
	if got := g.verdict(time.Minute); got != want {
		t.Errorf("verdict\n got %q\nwant %q", got, want)
	}
}

// A failing Go test's message and FAIL lines are quoted in the verdict.
func TestVerdictQuotesTestFailure(t *testing.T) {
	g := &guest{name: "s/g2", started: time.Now(), phase: phaseReady}
	for _, l := range []string{
		"=== RUN   TestLabX/a",
		"    x_lab_test.go:10: 200 inserts in 30ms",
		"    x_lab_test.go:12: Flush: dht: the target closed the connection",
		"--- FAIL: TestLabX/a (2.00s)",
		"--- FAIL: TestLabX (2.10s)",
		"FAIL",
	} {
		g.consoleLine(l, "tok")
	}
	g.state, g.status = stateExited, 1
	want := "s/g2: command exited with status 1" +
		"\n    | === RUN   TestLabX/a" +
		"\n    | x_lab_test.go:10: 200 inserts in 30ms" +
		"\n    | x_lab_test.go:12: Flush: dht: the target closed the connection" +
		"\n    | --- FAIL: TestLabX/a (2.00s)" +
		"\n    | --- FAIL: TestLabX (2.10s)"
	if got := g.verdict(time.Minute); got != want {
		t.Errorf("verdict\n got %q\nwant %q", got, want)
	}
	g.status = 0
	if got := g.verdict(time.Minute); got != "" {
		t.Errorf("a passing guest's verdict: %q", got)
	}
}

func TestNoBootVerdicts(t *testing.T) {
	for _, c := range []struct {
		g    *guest
		want string
	}{
		{&guest{name: "s/g2", state: stateNoBoot, bootWait: bootTimeout},
			"s/g2: did not boot within 90s (no console output); killed"},
		{&guest{name: "s/g2", state: stateNoBoot, bootWait: 30 * time.Second, lastLine: "[    1.2] smpboot: x"},
			"s/g2: did not boot within 30s (/init never ran; console stopped after: [    1.2] smpboot: x); killed"},
		{&guest{name: "s", state: stateNoBoot, bootWait: bootTimeout, phase: phaseInit, lastLine: "@@LAB-INIT tok"},
			"s: did not boot within 90s (/init ran but never reported ready; console stopped after: @@LAB-INIT tok); killed"},
		{&guest{name: "s", state: stateNoBoot, bootWait: bootTimeout, lastLine: "[ 2.0] Kernel panic - not syncing: x", bootReports: []string{"Kernel panic - not syncing: x"}},
			"s: did not boot within 90s (/init never ran; console stopped after: [ 2.0] Kernel panic - not syncing: x); killed; kernel Kernel panic - not syncing: x (1 report(s) in console.log)"},
		{&guest{name: "s/g1", state: statePeerFailed, stopWhy: "stopped after s/g2 did not boot"},
			"s/g1: stopped after s/g2 did not boot"},
	} {
		if got := c.g.verdict(time.Minute); got != c.want {
			t.Errorf("verdict\n got %q\nwant %q", got, c.want)
		}
	}
}

func TestBootRetryReason(t *testing.T) {
	noBoot := func(name string) *guest {
		return &guest{name: name, state: stateNoBoot, bootWait: bootTimeout}
	}
	peer := func(name string) *guest {
		return &guest{name: name, state: statePeerFailed, stopWhy: "stopped after s/g2 did not boot"}
	}
	passed := func(name string) *guest { return &guest{name: name, state: stateExited} }
	for _, c := range []struct {
		what   string
		guests []*guest
		retry  bool
	}{
		{"all passed", []*guest{passed("s/g1"), passed("s/g2")}, false},
		{"one did not boot, its peer was stopped", []*guest{peer("s/g1"), noBoot("s/g2")}, true},
		{"a single guest did not boot", []*guest{noBoot("s")}, true},
		{"both did not boot", []*guest{noBoot("s/g1"), noBoot("s/g2")}, true},
		{"did not boot, the other passed", []*guest{passed("s/g1"), noBoot("s/g2")}, true},
		{"a test failure and a boot failure", []*guest{{name: "s/g1", state: stateExited, status: 3}, noBoot("s/g2")}, false},
		{"a test failure, its peer stopped", []*guest{peer("s/g1"), {name: "s/g2", state: stateExited, status: 3}}, false},
		{"booted, then hung (selftest-hang)", []*guest{passed("s/g1"), {name: "s/g2", state: stateHung, phase: phaseReady}}, false},
		{"a kernel panic ended qemu", []*guest{peer("s/g1"), {name: "s/g2", state: stateNoReport}}, false},
		{"no boot, with a kernel report on the console", []*guest{{name: "s", state: stateNoBoot, bootReports: []string{"BUG: x"}}}, false},
		{"no boot, with a kernel report in kmsg", []*guest{{name: "s", state: stateNoBoot, kernel: []string{"WARNING: x"}}}, false},
		{"a stopped peer with a kernel report", []*guest{{name: "s/g1", state: statePeerFailed, kernel: []string{"Oops: x"}}, noBoot("s/g2")}, false},
		{"interrupted", []*guest{{name: "s", state: stateStopped, stopWhy: "interrupted"}}, false},
		{"passed with a kernel WARNING (selftest-warn)", []*guest{{name: "s", state: stateExited, kernel: []string{"WARNING: x"}}}, false},
	} {
		got := bootRetryReason(c.guests, time.Minute)
		if (got != "") != c.retry {
			t.Errorf("%s: reason %q, want retry %v", c.what, got, c.retry)
		}
		if c.retry && !strings.Contains(got, "did not boot within 90s") {
			t.Errorf("%s: reason %q does not say why", c.what, got)
		}
	}
}

// fakeGuest is a guest whose "qemu" is a sleep, ended as qemu is by kill.
func fakeGuest(t *testing.T, name string, phase bootPhase) *guest {
	t.Helper()
	g := &guest{name: name, phase: phase, finished: make(chan struct{})}
	g.cmd = exec.Command("sleep", "60")
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.started = time.Now()
	go func() {
		_ = g.cmd.Wait()
		g.mu.Lock()
		if g.state == stateRunning {
			g.state = stateNoReport
		}
		g.mu.Unlock()
		close(g.finished)
	}()
	t.Cleanup(func() {
		_ = g.cmd.Process.Kill()
		<-g.finished
	})
	return g
}

// The boot watchdog kills the guest that never got ready, well before the
// deadline, and stops the peer that waits for it.
func TestWaitGuestsBootWatchdog(t *testing.T) {
	ready, stuck := fakeGuest(t, "s/g1", phaseReady), fakeGuest(t, "s/g2", phaseInit)
	out := &syncWriter{w: io.Discard}
	start := time.Now()
	waitGuests(context.Background(), []*guest{ready, stuck}, time.Minute, 200*time.Millisecond, false, out)
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("waitGuests took %s", d)
	}
	if stuck.state != stateNoBoot || ready.state != statePeerFailed {
		t.Fatalf("states %d, %d; want no-boot and stopped for its peer", stuck.state, ready.state)
	}
	if why := bootRetryReason([]*guest{ready, stuck}, time.Minute); !strings.HasPrefix(why, "s/g2: did not boot within 0.2s") {
		t.Errorf("retry reason %q", why)
	}
}

// A run whose only kernel reports are NIC stalls is run again: the lab
// network died under it. Any other kernel report, or a guest that ended
// without a result, is a verdict on the suite.
func TestNICStallRetryReason(t *testing.T) {
	const stall = "virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 60360 ms"
	failed := func(name string) *guest { return &guest{name: name, state: stateExited, status: 1} }
	stalled := &guest{name: "s/g2", state: statePeerFailed, stopWhy: "stopped 10s after s/g1 failed", kernel: []string{stall, stall}}
	for _, c := range []struct {
		what   string
		guests []*guest
		retry  bool
	}{
		{"the sender's NIC stalled, the receiver timed out", []*guest{failed("s/g1"), stalled}, true},
		{"a stall in the guest that failed", []*guest{{name: "s", state: stateExited, status: 1, kernel: []string{stall}}}, true},
		{"a stall and a WARNING", []*guest{failed("s/g1"), {name: "s/g2", state: stateExited, status: 1, kernel: []string{stall, "WARNING: CPU: 0 PID: 1 at x"}}}, false},
		{"a stall here, an Oops there", []*guest{{name: "s/g1", state: stateExited, status: 1, kernel: []string{"Oops: 0002"}}, stalled}, false},
		{"a stall, and a guest that crashed", []*guest{{name: "s/g1", state: stateNoReport}, stalled}, false},
		{"a test failure without a stall", []*guest{failed("s/g1"), {name: "s/g2", state: statePeerFailed, stopWhy: "stopped"}}, false},
	} {
		got := retryReason(c.guests, time.Minute)
		if (got != "") != c.retry {
			t.Errorf("%s: reason %q, want retry %v", c.what, got, c.retry)
		}
		if c.retry && !strings.Contains(got, "the NIC stopped sending (kernel "+stall) {
			t.Errorf("%s: reason %q does not say why", c.what, got)
		}
	}
}

// A guest that booted and then hangs is left to the deadline.
func TestWaitGuestsWatchdogSparesBootedGuests(t *testing.T) {
	g := fakeGuest(t, "s", phaseReady)
	waitGuests(context.Background(), []*guest{g}, 500*time.Millisecond, 100*time.Millisecond, false, &syncWriter{w: io.Discard})
	if g.state != stateHung {
		t.Fatalf("state %d, want hung", g.state)
	}
	if bootRetryReason([]*guest{g}, time.Minute) != "" {
		t.Error("a hang after boot would be retried")
	}
}

func TestResetRunDir(t *testing.T) {
	run := filepath.Join(t.TempDir(), "suite")
	if err := os.MkdirAll(filepath.Join(run, "guest1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(run, "guest1", "console.log"), []byte("first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := resetRunDir(run, "attempt1"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(run, "attempt1", "guest1", "console.log"))
	if err != nil || string(b) != "first\n" {
		t.Fatalf("first attempt's log: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(run, "guest1")); !os.IsNotExist(err) {
		t.Errorf("the new run directory is not empty: %v", err)
	}
	if err := resetRunDir(run, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Errorf("run directory not removed: %v", err)
	}
}
