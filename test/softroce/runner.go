package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A Lab boots guests and runs suites in them.
type Lab struct {
	Root       string // the repository, shared read-only into every guest as /lab
	Cache      string // kernels and initramfs archives, outside git
	KernelName string
	MemMiB     int
	Smp        int
	Append     string // extra kernel command line
	GDBPort    int    // guest i serves qemu's gdbstub on 127.0.0.1:GDBPort+i-1; 0: none
	// Kmod, when set, is our module already built (by DKMS, say) for the
	// guest kernel, loaded instead of one built from kmod/; it must live
	// inside the repository (guests see only that).
	Kmod string
	out  *syncWriter

	kernel *Kernel
	initrd string
	kmods  []string // our modules, as paths in the guest
}

// Guest-side paths.
const (
	guestRepo   = "/lab"
	guestRun    = "/labrun"
	guestDevice = "rxe0"
	kmodDevice  = "/dev/rdmaplus"
	// failGrace is how long the other guests may go on after one failed
	// before the lab stops them (they are usually waiting for it).
	failGrace = 10 * time.Second
	// bootTimeout is how long a guest may take from qemu's start to its
	// @@LAB-READY before the boot watchdog kills it. A boot takes 6 to 8 s
	// on an idle machine and two or three times that with other labs
	// running; a guest that hangs while booting (rarely, one shows no
	// output at all) would otherwise hold the suite until its deadline.
	bootTimeout = 90 * time.Second
)

// bootWatchdog is the boot watchdog's delay for a suite with this deadline:
// bootTimeout, or two thirds of a shorter deadline, so that it still fires
// first and leaves time for the command.
func bootWatchdog(timeout time.Duration) time.Duration {
	w := timeout * 2 / 3
	if w >= bootTimeout {
		return bootTimeout
	}
	if w >= 10*time.Second {
		return w.Round(time.Second)
	}
	return w
}

func (l *Lab) buildDir(parts ...string) string {
	return filepath.Join(append([]string{l.Root, "build"}, parts...)...)
}

func (l *Lab) guestPath(host string) string {
	rel, err := filepath.Rel(l.Root, host)
	if err != nil || strings.HasPrefix(rel, "..") {
		panic("lab: guest path of a file outside the repository: " + host)
	}
	return filepath.ToSlash(filepath.Join(guestRepo, rel))
}

// Prepare installs the host packages, fetches the guest kernel, builds the
// initramfs and our kernel modules. Everything is cached; a second call with
// nothing changed does no work beyond checking.
func (l *Lab) Prepare(ctx context.Context) error {
	// Several labs may run at once (two developers' shells, a suite and a
	// gotest): they share the cache and build/kmod, so preparing is serialised.
	unlock, err := lockFile(l.buildDir("lab", ".prepare.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if err := ensurePackages(ctx, hostPackages...); err != nil {
		return err
	}
	k, err := getKernel(ctx, l.KernelName, l.Cache)
	if err != nil {
		return err
	}
	l.kernel = k
	if l.initrd, err = buildInitramfs(ctx, k, l.Cache); err != nil {
		return err
	}
	// Our module, and the lab's own self-test modules (one that WARNs),
	// built side by side.
	out := l.buildDir("kmod", k.Name+"-"+k.ABI)
	var (
		wg      sync.WaitGroup
		kos     []string
		err1    error
		errSelf error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, errSelf = buildModule(ctx, k, filepath.Join(l.Root, "test", "softroce", "selftest"), filepath.Join(out, "selftest"))
	}()
	if l.Kmod != "" {
		kos, err1 = l.givenModule()
	} else {
		kos, err1 = buildModule(ctx, k, filepath.Join(l.Root, "kmod"), filepath.Join(out, "rdmaplus"))
	}
	wg.Wait()
	if err := errors.Join(err1, errSelf); err != nil {
		return err
	}
	l.kmods = nil
	for _, ko := range kos {
		l.kmods = append(l.kmods, l.guestPath(ko))
	}
	return nil
}

// givenModule checks the module -kmod names: a file inside the repository.
func (l *Lab) givenModule() ([]string, error) {
	abs, err := filepath.Abs(l.Kmod)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(abs); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("-kmod %s: not a module file (%v)", l.Kmod, err)
	}
	if rel, err := filepath.Rel(l.Root, abs); err != nil || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("-kmod %s: must live inside the repository %s (guests see only that)", l.Kmod, l.Root)
	}
	logf("loading the given module %s instead of building kmod/", l.Kmod)
	return []string{abs}, nil
}

// buildGo compiles the Go binaries a suite asks for into build/lab/bin,
// and runs the top-level Makefile's targets it names (make=: C programs,
// which land under build/).
func (l *Lab) buildGo(ctx context.Context, s *Suite) error {
	bin := l.buildDir("lab", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	for _, pkg := range s.GoTests {
		name := binName(pkg, true)
		if err := l.goCmd(ctx, "test", "-c", "-tags", "lab", "-o", filepath.Join(bin, name), pkg); err != nil {
			return err
		}
		dir, err := l.goOutput(ctx, "list", "-tags", "lab", "-f", "{{.Dir}}", pkg)
		if err != nil {
			return err
		}
		// lab_gotest runs the binary from its package directory, as go test does.
		if err := os.WriteFile(filepath.Join(bin, name+".dir"), []byte(l.guestPath(strings.TrimSpace(dir))+"\n"), 0o644); err != nil {
			return err
		}
	}
	for _, pkg := range s.GoBuilds {
		if err := l.goCmd(ctx, "build", "-o", filepath.Join(bin, binName(pkg, false)), pkg); err != nil {
			return err
		}
	}
	for _, target := range s.Makes {
		cmd := exec.CommandContext(ctx, "make", "-C", l.Root, target)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("make %s: %w\n%s", target, err, tail(string(b), 60))
		}
	}
	return nil
}

func (l *Lab) goCmd(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = l.Root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail(string(b), 60))
	}
	return nil
}

func (l *Lab) goOutput(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = l.Root
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return string(b), nil
}

// guestAddr is guest i's address on the lab segment.
func guestAddr(i int) string { return fmt.Sprintf("10.77.0.%d", i) }

// guestEnv is the environment of guest i's command (see labenv).
func (l *Lab) guestEnv(s *Suite, i int, mode string) string {
	var all, peers []string
	for j := 1; j <= s.Guests; j++ {
		all = append(all, guestAddr(j))
		if j != i {
			peers = append(peers, guestAddr(j))
		}
	}
	role := "client"
	if i == 1 {
		role = "server"
	}
	kv := [][2]string{
		{"LAB_SUITE", s.Name},
		{"LAB_MODE", mode},
		{"LAB_INDEX", fmt.Sprint(i)},
		{"LAB_GUESTS", fmt.Sprint(s.Guests)},
		{"LAB_ROLE", role},
		{"LAB_ADDR", guestAddr(i)},
		{"LAB_ADDRS", strings.Join(all, " ")},
		{"LAB_PEERS", strings.Join(peers, " ")},
		{"LAB_DEVICE", guestDevice},
		{"LAB_SHARED", guestRun + "/shared"},
		{"LAB_OUT", fmt.Sprintf("%s/guest%d/out", guestRun, i)},
		{"LAB_BIN", l.guestPath(l.buildDir("lab", "bin"))},
		{"LAB_KMODS", strings.Join(l.kmods, " ")},
		{"LAB_KMOD_DEV", kmodDevice},
		{"LAB_SELFTEST_KMODS", l.guestPath(l.buildDir("kmod", l.kernel.Name+"-"+l.kernel.ABI, "selftest"))},
		{"LAB_DIR", guestRepo},
		{"LAB_KERNEL", l.kernel.Name + " " + l.kernel.ABI},
	}
	var b strings.Builder
	for _, e := range kv {
		fmt.Fprintf(&b, "%s=%s\n", e[0], shellQuote(e[1]))
	}
	return b.String()
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// commandScript is the bash script every guest runs.
func commandScript(s *Suite) string {
	var b strings.Builder
	// BASH_ENV gives every bash the suite starts, the suite itself
	// included, the helpers of lab.sh.
	b.WriteString("export BASH_ENV=" + guestRepo + "/test/softroce/guest/lab.sh\nsource \"$BASH_ENV\"\n")
	if s.Command != "" {
		b.WriteString(s.Command + "\n")
	} else {
		fmt.Fprintf(&b, "bash %s/%s\n", guestRepo, filepath.ToSlash(s.Path))
	}
	return b.String()
}

// runResult is the outcome of one suite.
type runResult struct {
	failures []string // one line a failed guest; empty when all passed
	logs     string
	elapsed  time.Duration
	// retry, when not empty, says why the run deserves a second
	// attempt: it failed only because of the lab (retryReason).
	retry string
}

// Run boots the suite's guests, runs it in each, and reports how each
// ended. attempt counts the runs of this suite in a row: from the second
// on, the previous attempt's logs are kept in the run directory as
// attempt<N-1>/.
func (l *Lab) Run(ctx context.Context, s *Suite, interactive bool, attempt int) (*runResult, error) {
	if err := l.buildGo(ctx, s); err != nil {
		return nil, err
	}
	runDir := l.buildDir("lab", "runs", runDirName(s.Name, l.KernelName))
	keep := ""
	if attempt > 1 {
		keep = fmt.Sprintf("attempt%d", attempt-1)
	}
	if err := resetRunDir(runDir, keep); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(runDir, "shared"), 0o777); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(runDir, "command"), []byte(commandScript(s)), 0o644); err != nil {
		return nil, err
	}
	mode := "run"
	if interactive {
		mode = "shell"
	}
	sockDir, err := os.MkdirTemp("", "softroce-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(sockDir)
	h, err := newHub(sockDir)
	if err != nil {
		return nil, fmt.Errorf("lab network: %w", err)
	}
	defer func() {
		h.Close()
		if s.Guests > 1 {
			l.out.printf("[%s] lab network: %d frames repeated, %d dropped (a guest's queue full)\n", s.Name, h.frames.Load(), h.dropped.Load())
		}
	}()

	tok := make([]byte, 8)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(tok)
	// Under TCG every vCPU is a host thread: with several guests on two
	// cores, one vCPU each keeps them from starving one another (a starved
	// guest misses RC ACK timeouts and retransmits).
	smp := l.Smp
	switch {
	case s.Smp > 0:
		smp = s.Smp
	case smp == 0 && s.Guests == 1:
		smp = 2
	case smp == 0:
		smp = 1
	}
	mem := l.MemMiB
	if s.MemMiB > 0 {
		mem = s.MemMiB
	}

	start := time.Now()
	guests := make([]*guest, s.Guests)
	var probes probeSet
	defer func() { // no qemu outlives a run, whatever happens
		probes.wait() // a look at a stalled NIC needs its qemu
		for _, g := range guests {
			if g != nil && g.finished != nil {
				g.kill(stateStopped, "stopped")
				<-g.finished
			}
		}
	}()
	for i := 1; i <= s.Guests; i++ {
		gdir := filepath.Join(runDir, fmt.Sprintf("guest%d", i))
		if err := os.MkdirAll(filepath.Join(gdir, "out"), 0o777); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(gdir, "env"), []byte(l.guestEnv(s, i, mode)), 0o644); err != nil {
			return nil, err
		}
		g := &guest{index: i, name: fmt.Sprintf("%s/g%d", s.Name, i)}
		if s.Guests == 1 {
			g.name = s.Name
		}
		if !interactive || i > 1 {
			g.onNICStall = func() {
				probes.run(func() {
					sum := probeNICStall(sockDir, i, h, filepath.Join(gdir, "nicstall.txt"))
					l.out.printf("[%s] NIC stall: %s\n", g.name, sum)
				})
			}
		}
		if !interactive || i > 1 { // the first shell guest's monitor is its console
			mon, path := monitorAddr(sockDir, i), filepath.Join(gdir, "vcpus.txt")
			g.probeVCPUs = func() (string, bool) { return probeVCPUs(mon, path) }
		}
		args := qemuArgs(l, l.kernel, l.initrd, runDir, sockDir, token, i, smp, mem, interactive && i == 1)
		if err := startGuest(g, args, gdir, token, l.out, interactive && i == 1); err != nil {
			return nil, err
		}
		guests[i-1] = g
	}

	timeout := s.Timeout
	bootWait := bootWatchdog(timeout)
	if interactive {
		// Guest 1's console is the user's terminal: its @@LAB-READY is
		// never seen.
		timeout, bootWait = 24*time.Hour, 0
	}
	waitGuests(ctx, guests, timeout, bootWait, interactive, l.out)

	res := &runResult{logs: runDir, elapsed: time.Since(start)}
	for _, g := range guests {
		if v := g.verdict(timeout); v != "" {
			res.failures = append(res.failures, v)
		}
		if g.readyUptime != "" {
			l.out.printf("[%s] rxe up after %.1fs (guest uptime %ss), powered off after %.1fs\n", g.name, g.ready.Seconds(), g.readyUptime, g.ended.Seconds())
		}
	}
	orphans := findProcesses(sockDir)
	if len(orphans) > 0 {
		res.failures = append(res.failures, fmt.Sprintf("qemu processes %v outlived the run (killed now)", orphans))
	}
	if len(orphans) == 0 && ctx.Err() == nil && !interactive {
		res.retry = retryReason(guests, timeout)
	}
	return res, nil
}

// retryReason decides whether a failed run is worth a second attempt: it
// failed only because of the lab, in one of three known ways, and says how.
func retryReason(guests []*guest, timeout time.Duration) string {
	if why := bootRetryReason(guests, timeout); why != "" {
		return why
	}
	if why := staleTrapReason(guests, timeout); why != "" {
		return why
	}
	return nicStallReason(guests, timeout)
}

// bootRetryReason: at least one guest did not boot (killed by the boot
// watchdog, with no kernel problem seen) and every other failed guest was
// merely stopped because of that. It returns the failed guests' verdicts,
// or "" (a test failure, a hang after boot, a kernel report: no retry).
func bootRetryReason(guests []*guest, timeout time.Duration) string {
	var noBoot []string
	for _, g := range guests {
		v := g.verdict(timeout)
		switch {
		case v == "":
		case g.bootFailureOnly():
			noBoot = append(noBoot, v)
		case g.stoppedForPeer():
		default:
			return ""
		}
	}
	return strings.Join(noBoot, "; ")
}

// nicStallReason: a guest's virtio NIC stopped sending (the kernel's NETDEV
// WATCHDOG). Seen with qemu 7.2 under TCG in 5 of 48 boots of a stress
// run moving 1.2 GB between guests: qemu missed the guest's kick and never
// took its frames again (docs/lab.md). The NIC has run without event
// indices since, which may have cured it. Every failure in a boot after
// such a stall may be a wait on the dead link, so a failed run whose only
// kernel reports are stalls is run again, unless a guest ended without
// reporting (a panic, a crash) or was found with a vCPU stuck with
// interrupts off. It returns the stalled guests' reports,
// or "".
func nicStallReason(guests []*guest, timeout time.Duration) string {
	var stalls []string
	failed := false
	for _, g := range guests {
		msg, other := g.nicStall()
		if g.verdict(timeout) != "" {
			failed = true
		}
		g.mu.Lock()
		crashed := g.state == stateNoReport || g.vcpusIRQsOff
		g.mu.Unlock()
		switch {
		case crashed, other:
			return ""
		case msg != "":
			stalls = append(stalls, fmt.Sprintf("%s: the NIC stopped sending (kernel %s)", g.name, msg))
		}
	}
	if !failed {
		return ""
	}
	return strings.Join(stalls, "; ")
}

// resetRunDir empties a suite's run directory. When keep is not empty the
// previous run's files are moved into the new directory under that name.
func resetRunDir(runDir, keep string) error {
	if keep == "" {
		if err := os.RemoveAll(runDir); err != nil {
			return fmt.Errorf("clearing the run directory: %w", err)
		}
		return nil
	}
	tmp := runDir + ".previous"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("keeping the previous attempt's logs: %w", err)
	}
	if err := os.Rename(runDir, tmp); err != nil {
		return fmt.Errorf("keeping the previous attempt's logs: %w", err)
	}
	if err := os.MkdirAll(runDir, 0o777); err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(runDir, keep)); err != nil {
		return fmt.Errorf("keeping the previous attempt's logs: %w", err)
	}
	return nil
}

// findProcesses returns the pids of processes whose command line mentions
// marker, killing them: the lab's proof that it leaves no qemu behind.
func findProcesses(marker string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), marker) {
			pids = append(pids, pid)
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
		}
	}
	return pids
}

// lockFile takes an exclusive lock on path, creating it, and returns the
// function that releases it.
func lockFile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// waitGuests waits until every guest has ended. It kills them all at the
// deadline or when ctx ends; once one guest has failed, the others get
// failGrace to finish (they are usually waiting for it) and are then
// stopped. The boot watchdog kills, bootWait after the start (0: never),
// every guest that has not reported @@LAB-READY. Before the deadline, the
// grace or the boot watchdog kills a guest, the lab looks at its vCPUs
// (lookAtVCPUs). When guest 1 is an interactive shell, its exit dismisses
// the rest.
func waitGuests(ctx context.Context, guests []*guest, timeout, bootWait time.Duration, interactive bool, out *syncWriter) {
	ended := make(chan *guest, len(guests))
	for _, g := range guests {
		go func(g *guest) {
			<-g.finished
			ended <- g
		}(g)
	}
	killAll := func(state guestState, why string) {
		for _, g := range guests {
			g.kill(state, why)
		}
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var booted <-chan time.Time
	if bootWait > 0 {
		t := time.NewTimer(bootWait)
		defer t.Stop()
		booted = t.C
	}
	done := ctx.Done()
	var grace <-chan time.Time
	graceWhy := ""
	for remaining := len(guests); remaining > 0; {
		select {
		case g := <-ended:
			remaining--
			if interactive && g.index == 1 {
				killAll(stateDismissed, "")
			} else if g.failedEarly() && grace == nil {
				grace = time.After(failGrace)
				graceWhy = fmt.Sprintf("stopped %s after %s failed", failGrace, g.name)
			}
		case <-booted:
			booted = nil
			lookAtVCPUs(guests, func(g *guest) bool { return g.phase < phaseReady }, out)
			var unbooted []string
			for _, g := range guests {
				if g.killUnbooted(bootWait) {
					unbooted = append(unbooted, g.name)
					out.printf("[%s] boot watchdog: no @@LAB-READY after %gs; killing the guest (its boot log: console.log)\n", g.name, bootWait.Seconds())
				}
			}
			// The others wait in /init until every guest is up: they
			// cannot go on.
			if len(unbooted) > 0 {
				killAll(statePeerFailed, "stopped after "+strings.Join(unbooted, ", ")+" did not boot")
			}
		case <-grace:
			// A guest that outlived its peer's failure may be the one
			// that stopped answering (a peer's timeout is often the
			// first sign of it).
			lookAtVCPUs(guests, func(*guest) bool { return true }, out)
			killAll(statePeerFailed, graceWhy)
		case <-done:
			done = nil
			killAll(stateStopped, "interrupted")
		case <-deadline.C:
			lookAtVCPUs(guests, func(*guest) bool { return true }, out)
			killAll(stateHung, "")
		}
	}
}
