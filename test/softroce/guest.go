package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// guestState is how a guest ended.
type guestState int

const (
	stateRunning    guestState = iota
	stateExited                // reported an exit status
	stateNoReport              // qemu ended without the guest reporting (panic, crash)
	stateHung                  // killed at the deadline
	stateNoBoot                // killed by the boot watchdog: no @@LAB-READY in time
	stateStopped               // killed because the run was interrupted or is over
	statePeerFailed            // killed because another guest failed
	stateDismissed             // a peer of an interactive guest, stopped when its shell exited
)

// bootPhase is how far a guest's console says it got.
type bootPhase int

const (
	phaseKernel bootPhase = iota // the kernel's boot log, before /init runs
	phaseInit                    // /init has started (@@LAB-INIT)
	phaseReady                   // rxe and our module are up (@@LAB-READY)
)

// consoleLineMax bounds the last console line kept for a verdict.
const consoleLineMax = 160

// A guest is one qemu process of a boot.
type guest struct {
	index   int
	name    string
	dir     string // its logs: console.log, kmsg.log
	cmd     *exec.Cmd
	started time.Time

	mu          sync.Mutex
	state       guestState
	status      int // the command's exit status, when stateExited
	phase       bootPhase
	ready       time.Duration // from start to rxe up
	readyUptime string        // the guest's own uptime then
	ended       time.Duration
	kernel      []string // kernel problems seen in its log
	bootReports []string // kernel problems seen on the console before /init ran
	lastLine    string   // the console's last non-empty line
	bootWait    time.Duration
	qemuErr     []string // what qemu printed on stderr
	stopWhy     string
	recent      []string // the command's last few console lines
	failQuote   []string // a Go test's first failure, as the console showed it
	crashLines  int      // lines of a crash's trace still to quote
	finished    chan struct{}

	// onNICStall, if set, is called once when the kernel first reports
	// the NIC stalled; it must not block (probeSet.run).
	onNICStall func()
	stallSeen  bool

	// probeVCPUs, if set, looks at the guest's vCPUs through qemu's
	// monitor and returns an account of them, and whether one had
	// interrupts off throughout (probeVCPUs in vcpuprobe.go). The lab
	// calls it before killing a guest that stopped answering; the verdict
	// of a guest that hung or did not boot quotes the account, that of a
	// guest stopped after its peer failed only when it had a vCPU with
	// interrupts off.
	probeVCPUs   func() (string, bool)
	vcpus        string
	vcpusIRQsOff bool
}

// Quoting a Go test's failure in the verdict: the lines before the first
// "--- FAIL:" (where t.Fatal's message is), that line, and the names of
// the tests that failed with it; or, for a test binary that crashed
// (status 2, no FAIL line), the lines before its "panic:" or "fatal
// error:" and the first lines of its trace. A command that failed with
// neither is quoted by its last lines.
const (
	quoteBefore = 8
	quoteMax    = 14
	quoteCrash  = 6 // lines quoted after a panic's first
)

// noteTestLine keeps what a verdict quotes of a failing Go test, from a
// console line as clip returns it; g.mu is held.
func (g *guest) noteTestLine(t string) {
	if t == "" {
		return
	}
	switch {
	case g.crashLines > 0 && len(g.failQuote) < quoteMax:
		g.failQuote = append(g.failQuote, t)
		g.crashLines--
	case strings.HasPrefix(t, "--- FAIL:") && len(g.failQuote) < quoteMax:
		if len(g.failQuote) == 0 {
			g.failQuote = append(g.failQuote, g.recent...)
		}
		g.failQuote = append(g.failQuote, t)
	case (strings.HasPrefix(t, "panic: ") || strings.HasPrefix(t, "fatal error: ")) && len(g.failQuote) == 0:
		g.failQuote = append(append(g.failQuote, g.recent...), t)
		g.crashLines = quoteCrash
	}
	if len(g.recent) == quoteBefore {
		g.recent = append(g.recent[:0], g.recent[1:]...)
	}
	g.recent = append(g.recent, t)
}

// qemuArgs is the qemu command line of guest i.
func qemuArgs(l *Lab, k *Kernel, initrd, runDir, sockDir, token string, i, smp, mem int, interactive bool) []string {
	con := "stdio,id=con,signal=off"
	if interactive {
		con = "stdio,id=con,mux=on,signal=off"
	}
	args := []string{
		"-name", fmt.Sprintf("softroce-g%d", i),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-accel", "tcg,thread=multi", "-cpu", "max",
		"-smp", strconv.Itoa(smp), "-m", strconv.Itoa(mem),
		"-kernel", k.Image(), "-initrd", initrd,
		// The whole kernel log goes to the console until /init lowers the
		// console's level (to 4, errors only): a guest that hangs before
		// /init then leaves its boot log in console.log. earlyprintk shows
		// what happens before the serial driver is up. no_timer_check skips
		// the boot-time IO-APIC timer check, which a vCPU starved by a
		// loaded host fails ("IO-APIC + timer doesn't work!", a panic seen
		// in the lab); virtual machines do not need it. tsc=reliable: with
		// two vCPUs the kernel's TSC sync check fails under TCG and falls
		// back to the HPET, whose reads qemu emulates (20 to 45 µs each, and
		// a system call: no vDSO), so every clock read of a Go runtime cost
		// that; TCG's TSC is the host's, one clock for every vCPU.
		"-append", fmt.Sprintf("console=ttyS0 earlyprintk=serial,ttyS0 loglevel=7 no_timer_check tsc=reliable panic=-1 mitigations=off 8250.nr_uarts=2 %s lab.index=%d lab.token=%s", l.Append, i, token),
		"-chardev", con, "-serial", "chardev:con",
		// fd 3 is the pipe the lab reads the kernel log from.
		"-chardev", "file,id=kmsg,path=/dev/fd/3", "-serial", "chardev:kmsg",
		"-netdev", fmt.Sprintf("stream,id=net0,server=off,addr.type=unix,addr.path=%s", hubAddr(sockDir)),
		// A speed, so that rxe's port queries do not log "speed is unknown".
		// event_idx=off: with the event-index handshake, qemu 7.2 under
		// TCG now and then missed the guest's kick and never took its
		// frames again (docs/lab.md, "A guest NIC that stops sending");
		// the flag handshake costs nothing measurable here.
		"-device", fmt.Sprintf("virtio-net-pci,id=%s,netdev=net0,mac=52:54:00:4c:41:%02x,speed=10000,duplex=full,event_idx=off", nicID, i),
		"-fsdev", "local,id=lab,path=" + l.Root + ",security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=lab,mount_tag=lab",
		"-fsdev", "local,id=labrun,path=" + runDir + ",security_model=none,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=labrun,mount_tag=labrun",
	}
	if interactive {
		args = append(args, "-mon", "chardev=con,mode=readline")
	} else { // for a look at a stalled NIC (probeNICStall)
		args = append(args, "-chardev", fmt.Sprintf("socket,id=mon,path=%s,server=on,wait=off", monitorAddr(sockDir, i)),
			"-mon", "chardev=mon,mode=readline")
	}
	if l.GDBPort != 0 { // to look into a stuck vCPU (docs/lab.md)
		args = append(args, "-gdb", fmt.Sprintf("tcp:127.0.0.1:%d", l.GDBPort+i-1))
	}
	return args
}

// startGuest starts qemu for guest g. Its console is streamed to out with a
// per-guest prefix and kept in console.log; its kernel log is kept in
// kmsg.log and scanned for problems. When interactive, the console is the
// user's terminal instead.
func startGuest(g *guest, args []string, dir string, token string, out *syncWriter, interactive bool) error {
	g.finished = make(chan struct{})
	g.dir = dir
	g.cmd = exec.Command("qemu-system-x86_64", args...)
	// qemu dies with the lab, even if the lab itself is killed.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: !interactive}

	kr, kw, err := os.Pipe()
	if err != nil {
		return err
	}
	g.cmd.ExtraFiles = []*os.File{kw}
	conLog, err := os.Create(dir + "/console.log")
	if err != nil {
		return err
	}
	kmsgLog, err := os.Create(dir + "/kmsg.log")
	if err != nil {
		conLog.Close()
		return err
	}
	var conR io.ReadCloser
	if interactive {
		g.cmd.Stdin, g.cmd.Stdout = os.Stdin, os.Stdout
	} else if conR, err = g.cmd.StdoutPipe(); err != nil {
		return err
	}
	errR, err := g.cmd.StderrPipe()
	if err != nil {
		return err
	}
	g.started = time.Now()
	if err := g.cmd.Start(); err != nil {
		kr.Close()
		kw.Close()
		conLog.Close()
		kmsgLog.Close()
		return fmt.Errorf("%s: starting qemu: %w", g.name, err)
	}
	kw.Close()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the kernel log
		defer wg.Done()
		defer kmsgLog.Close()
		sc := bufio.NewScanner(kr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			fmt.Fprintln(kmsgLog, line)
			if msg, bad := kernelReport(line); bad {
				g.mu.Lock()
				g.kernel = append(g.kernel, msg)
				probe := nicStall.MatchString(msg) && !g.stallSeen && g.onNICStall != nil
				if probe {
					g.stallSeen = true
				}
				g.mu.Unlock()
				out.printf("[%s kernel] %s\n", g.name, msg)
				if probe {
					g.onNICStall()
				}
			}
		}
		kr.Close()
	}()
	go func() { // qemu's own complaints
		defer wg.Done()
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			line := sc.Text()
			g.mu.Lock()
			g.qemuErr = append(g.qemuErr, line)
			g.mu.Unlock()
			out.printf("[%s qemu] %s\n", g.name, line)
		}
	}()
	if conR != nil {
		wg.Add(1)
		go func() { // the console
			defer wg.Done()
			sc := bufio.NewScanner(conR)
			sc.Buffer(make([]byte, 64*1024), 1024*1024)
			for sc.Scan() {
				line := strings.TrimRight(sc.Text(), "\r")
				fmt.Fprintln(conLog, line)
				if g.consoleLine(line, token) {
					out.printf("[%s] %s\n", g.name, line)
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		conLog.Close()
		_ = g.cmd.Wait()
		g.mu.Lock()
		g.ended = time.Since(g.started)
		if g.state == stateRunning {
			g.state = stateNoReport
		}
		g.mu.Unlock()
		close(g.finished)
	}()
	return nil
}

// consoleLine records one console line and reports whether to stream it.
// The kernel's boot log (everything before /init's @@LAB-INIT, and kernel
// lines until @@LAB-READY) is kept in console.log only; so are the markers.
// Before /init runs, the console is also the only place a kernel problem
// shows (kmsg.log starts with /init).
func (g *guest) consoleLine(line, token string) bool {
	t := clip(line)
	if t != "" {
		g.mu.Lock()
		g.lastLine = t
		g.mu.Unlock()
	}
	if rest, ok := strings.CutPrefix(line, "@@LAB-"); ok && g.marker(rest, token) {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.phase {
	case phaseKernel:
		if msg, bad := consoleKernelReport(line); bad {
			g.bootReports = append(g.bootReports, msg)
		}
		return false
	case phaseInit:
		return !isConsoleKernelLine(line)
	}
	g.noteTestLine(t)
	return true
}

// clip is a console line as a verdict keeps it: trimmed, and bounded by
// consoleLineMax.
func clip(line string) string {
	t := strings.TrimSpace(line)
	if len(t) > consoleLineMax {
		t = t[:consoleLineMax] + "..."
	}
	return t
}

// marker handles the init's "@@LAB-INIT token", "@@LAB-READY token uptime"
// and "@@LAB-EXIT token rc" console lines; it reports whether the line was one.
func (g *guest) marker(rest, token string) bool {
	f := strings.Fields(rest)
	if len(f) < 2 || f[1] != token {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case f[0] == "INIT":
		g.phase = max(g.phase, phaseInit)
	case f[0] == "READY":
		g.phase = phaseReady
		g.ready = time.Since(g.started)
		if len(f) == 3 {
			g.readyUptime = f[2]
		}
	case f[0] == "EXIT" && len(f) == 3:
		rc, err := strconv.Atoi(f[2])
		if err != nil {
			return false
		}
		if g.state == stateRunning {
			g.state, g.status = stateExited, rc
		}
	default:
		return false
	}
	return true
}

// kill stops a guest that is still running and records why.
func (g *guest) kill(state guestState, why string) {
	g.mu.Lock()
	if g.state == stateRunning {
		g.state, g.stopWhy = state, why
	}
	g.mu.Unlock()
	if g.cmd != nil && g.cmd.Process != nil {
		_ = g.cmd.Process.Kill()
	}
}

// killUnbooted kills the guest if it is running and has not reported
// @@LAB-READY (the boot watchdog, after wait); it reports whether it did.
func (g *guest) killUnbooted(wait time.Duration) bool {
	g.mu.Lock()
	unbooted := g.state == stateRunning && g.phase < phaseReady
	if unbooted {
		g.state, g.bootWait = stateNoBoot, wait
	}
	g.mu.Unlock()
	if unbooted && g.cmd != nil && g.cmd.Process != nil {
		_ = g.cmd.Process.Kill()
	}
	return unbooted
}

// verdict says why the guest failed, or "" if it passed.
func (g *guest) verdict(timeout time.Duration) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var why []string
	switch g.state {
	case stateExited:
		switch g.status {
		case 0:
		case 125:
			why = append(why, "the guest's init failed before the command ran (see its console)")
		case 126:
			why = append(why, "the command passed but unloading our kernel module failed")
		default:
			why = append(why, fmt.Sprintf("command exited with status %d", g.status))
		}
	case stateNoReport:
		msg := "qemu exited without the guest reporting a result (kernel panic or crash)"
		if len(g.qemuErr) > 0 {
			msg += ": " + g.qemuErr[len(g.qemuErr)-1]
		}
		why = append(why, msg)
	case stateHung:
		why = append(why, fmt.Sprintf("no result within the %s deadline (hung); killed", timeout))
	case stateNoBoot:
		why = append(why, g.noBootWhy())
	case stateStopped, statePeerFailed:
		why = append(why, g.stopWhy)
	}
	if g.vcpus != "" && (g.state == stateHung || g.state == stateNoBoot || g.state == statePeerFailed && g.vcpusIRQsOff) {
		why = append(why, g.vcpus)
	}
	switch {
	case len(g.kernel) > 0:
		why = append(why, fmt.Sprintf("kernel %s (%d report(s) in kmsg.log)", g.kernel[0], len(g.kernel)))
	case len(g.bootReports) > 0: // kmsg.log, when there is one, has them too
		why = append(why, fmt.Sprintf("kernel %s (%d report(s) in console.log)", g.bootReports[0], len(g.bootReports)))
	}
	if len(why) == 0 {
		return ""
	}
	v := g.name + ": " + strings.Join(why, "; ")
	if g.state == stateExited && g.status != 0 {
		q := g.failQuote
		if len(q) == 0 {
			q = g.recent
		}
		if len(q) > 0 {
			v += "\n    | " + strings.Join(q, "\n    | ")
		}
	}
	return v
}

// noBootWhy describes a guest the boot watchdog killed; g.mu is held.
func (g *guest) noBootWhy() string {
	within := fmt.Sprintf("did not boot within %gs", g.bootWait.Seconds())
	var where string
	switch {
	case g.lastLine == "":
		return within + " (no console output); killed"
	case g.phase == phaseKernel:
		where = "/init never ran"
	default:
		where = "/init ran but never reported ready"
	}
	return fmt.Sprintf("%s (%s; console stopped after: %s); killed", within, where, g.lastLine)
}

// bootFailureOnly reports whether the guest failed only by not booting: the
// boot watchdog killed it and no kernel problem was seen.
func (g *guest) bootFailureOnly() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == stateNoBoot && len(g.kernel) == 0 && len(g.bootReports) == 0
}

// nicStall returns the guest's first report of a stalled NIC ("" if none),
// and whether it has another kind of kernel report too.
func (g *guest) nicStall() (msg string, other bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range slices.Concat(g.kernel, g.bootReports) {
		switch {
		case !nicStall.MatchString(r):
			other = true
		case msg == "":
			msg = r
		}
	}
	return msg, other
}

// stoppedForPeer reports whether the guest was only stopped because another
// guest failed (it has no failure of its own: no kernel report, no vCPU
// found with interrupts off).
func (g *guest) stoppedForPeer() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == statePeerFailed && len(g.kernel) == 0 && len(g.bootReports) == 0 && !g.vcpusIRQsOff
}

// failedEarly reports whether the guest has ended badly (used to stop its
// peers instead of letting them wait for it until the deadline).
func (g *guest) failedEarly() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state != stateRunning && !(g.state == stateExited && g.status == 0)
}

// syncWriter serialises lines from several guests onto one writer.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) printf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, format, args...)
}
