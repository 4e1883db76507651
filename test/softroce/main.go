// Command softroce is the SoftRoCE lab: it boots qemu guests running a stock
// Debian kernel with the real rdma_rxe driver and our kernel module, joins
// them on one Ethernet segment, and runs suites and Go lab tests in them.
//
// Usage:
//
//	go run ./test/softroce setup                  install host packages, fetch the kernel, build everything
//	go run ./test/softroce run SUITE...           run suites (paths, or names in test/softroce/suites)
//	go run ./test/softroce all                    run every suite in test/softroce/suites
//	go run ./test/softroce bench                  run every benchmark in test/softroce/bench
//	go run ./test/softroce gotest [-guests N] PKG [TESTFLAGS]  run a package's lab tests
//	go run ./test/softroce shell [-guests N]      a shell on guest 1 (Ctrl-A X quits qemu)
//	go run ./test/softroce list                   list the suites
//
// See docs/lab.md for the design.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "softroce: "+format+"\n", args...)
}

// Suites are tests (make test runs them all); benchmarks are suites that
// print figures and take longer (make bench).
const (
	suitesDir = "test/softroce/suites"
	benchDir  = "test/softroce/bench"
)

func usage() {
	fmt.Fprint(os.Stderr, `usage: softroce COMMAND [flags] [args]

commands:
  setup                     install host packages, fetch the guest kernel, build initramfs and modules
  run [flags] SUITE...      run suites (files, or names of files in test/softroce/suites)
  all [flags]               run every suite in test/softroce/suites
  bench [flags]             run every benchmark in test/softroce/bench
  gotest [flags] PKG [TESTFLAGS...]
                            compile PKG's lab tests (-tags lab) and run them in the guests,
                            e.g. gotest -guests 2 ./pkg/verbs -test.run 'TestWrite$' -test.v
  shell [flags]             boot guests and open a shell on guest 1 (Ctrl-A X quits)
  list                      list the suites with their settings

-kernel bookworm|trixie|sid picks the guest kernel (Debian 12's 6.1 by default,
13's 6.12, unstable's 7.x); run, all, bench, gotest and setup take several,
comma-separated, or "all", and run everything on each in turn.

Run "softroce COMMAND -h" for the flags.
`)
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := dispatch(ctx, os.Args[1], os.Args[2:])
	var ue usageError
	switch {
	case err == nil:
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "softroce:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "softroce:", err)
		os.Exit(1)
	}
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func dispatch(ctx context.Context, cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	l := &Lab{out: &syncWriter{w: os.Stdout}}
	kernelFlag := fs.String("kernel", defaultKernel, "guest kernel ("+kernelNames()+"); run, all, bench, gotest and setup also take several, comma-separated, or \"all\"")
	fs.StringVar(&l.Cache, "cache", defaultCache(), "cache for guest kernels and initramfs archives")
	fs.IntVar(&l.MemMiB, "mem", 1024, "guest memory in MiB")
	fs.IntVar(&l.Smp, "smp", 0, "vCPUs per guest; 0: 2 for a single guest, 1 each for several (a suite's smp= overrides)")
	fs.StringVar(&l.Append, "append", "", "extra guest kernel command line")
	fs.IntVar(&l.GDBPort, "gdb", 0, "serve guest i's qemu gdbstub on 127.0.0.1:N+i-1 (0: none; docs/lab.md)")
	fs.StringVar(&l.Kmod, "kmod", "", "load this rdmaplus.ko (inside the repository; built by DKMS, say) instead of building kmod/ for the guest kernel")
	guests := 1
	var timeout time.Duration
	if cmd == "gotest" || cmd == "shell" {
		fs.IntVar(&guests, "guests", 1, "number of guests (1 to 4)")
	}
	if cmd == "gotest" || cmd == "run" || cmd == "all" || cmd == "bench" {
		fs.DurationVar(&timeout, "timeout", 0, "override every suite's deadline")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageError{err.Error()}
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	l.Root = root
	kernels, err := parseKernels(*kernelFlag)
	if err != nil {
		return usageError{err.Error()}
	}
	if len(kernels) > 1 && (cmd == "shell" || cmd == "list") {
		return usageError{fmt.Sprintf("%s: -kernel takes one kernel", cmd)}
	}
	l.KernelName = kernels[0]
	if guests < 1 || guests > maxGuests {
		return usageError{fmt.Sprintf("-guests %d: want 1 to %d", guests, maxGuests)}
	}
	if l.GDBPort != 0 && (l.GDBPort < 1024 || l.GDBPort > 65536-maxGuests) {
		return usageError{fmt.Sprintf("-gdb %d: want a port from 1024 to %d", l.GDBPort, 65536-maxGuests)}
	}

	switch cmd {
	case "setup":
		return forKernels(ctx, l, kernels, func(l *Lab) error {
			t0 := time.Now()
			if err := l.Prepare(ctx); err != nil {
				return err
			}
			logf("ready in %.1fs: kernel %s %s, initramfs %s", time.Since(t0).Seconds(), l.kernel.Name, l.kernel.ABI, l.initrd)
			return nil
		})
	case "list":
		var suites []*Suite
		for _, dir := range []string{suitesDir, benchDir} {
			more, err := allSuites(root, dir)
			if err != nil {
				return err
			}
			suites = append(suites, more...)
		}
		for _, s := range suites {
			fmt.Printf("%-24s guests=%d timeout=%s %s\n", s.Name, s.Guests, s.Timeout, s.Path)
		}
		return nil
	case "run", "all", "bench":
		var suites []*Suite
		if cmd == "all" || cmd == "bench" {
			if fs.NArg() > 0 {
				return usageError{cmd + " takes no arguments"}
			}
			dir := suitesDir
			if cmd == "bench" {
				dir = benchDir
			}
			suites, err = allSuites(root, dir)
			if err == nil && len(suites) == 0 {
				err = fmt.Errorf("no suites in %s", dir)
			}
		} else {
			if fs.NArg() == 0 {
				return usageError{"run: name at least one suite"}
			}
			suites, err = namedSuites(root, fs.Args())
		}
		if err != nil {
			return err
		}
		for _, s := range suites {
			if timeout > 0 {
				s.Timeout = timeout
			}
		}
		return forKernels(ctx, l, kernels, func(l *Lab) error {
			mine := forKernel(suites, l.KernelName)
			if len(mine) < len(suites) && cmd == "run" {
				return fmt.Errorf("run: a suite named is not for kernel %s (its kernels= setting)", l.KernelName)
			}
			return runSuites(ctx, l, mine)
		})
	case "gotest":
		if fs.NArg() == 0 {
			return usageError{"gotest: name a package, e.g. ./pkg/verbs"}
		}
		pkg := fs.Arg(0)
		s := &Suite{
			Name:    "gotest-" + binName(pkg, false),
			Guests:  guests,
			Timeout: 10 * time.Minute,
			GoTests: []string{pkg},
			Command: "lab_gotest " + binName(pkg, false) + quoteArgs(fs.Args()[1:]),
		}
		if timeout > 0 {
			s.Timeout = timeout
		}
		return forKernels(ctx, l, kernels, func(l *Lab) error { return runSuites(ctx, l, []*Suite{s}) })
	case "shell":
		if err := l.Prepare(ctx); err != nil {
			return err
		}
		s := &Suite{Name: "shell", Guests: guests, Command: "true"}
		_, err := l.Run(ctx, s, true, 1)
		return err
	default:
		usage()
		return usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
}

// defaultKernel is the guest kernel of a lab run without -kernel.
const defaultKernel = "bookworm"

// parseKernels reads the -kernel flag: one kernel flavour, several
// separated by commas, or "all" (every flavour, oldest first).
func parseKernels(v string) ([]string, error) {
	if v == "all" {
		return kernelOrder, nil
	}
	var out []string
	seen := map[string]bool{}
	for _, k := range strings.Split(v, ",") {
		k = strings.TrimSpace(k)
		if _, ok := kernelFlavours[k]; !ok {
			return nil, fmt.Errorf("-kernel %q: unknown guest kernel %q (known: %s, or all)", v, k, kernelNames())
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out, nil
}

// forKernels runs f with a lab on each kernel in turn, going on after a
// failure; with several kernels it ends with one line per kernel.
func forKernels(ctx context.Context, l *Lab, kernels []string, f func(*Lab) error) error {
	if len(kernels) == 1 {
		return f(l)
	}
	var lines []string
	failed := 0
	for _, k := range kernels {
		lk := *l
		lk.KernelName = k
		logf("=== kernel %s", k)
		err := f(&lk)
		line := "ok   kernel " + k
		if err != nil {
			failed++
			line = fmt.Sprintf("FAIL kernel %s: %s", k, strings.SplitN(err.Error(), "\n", 2)[0])
		}
		lines = append(lines, line)
		if ctx.Err() != nil {
			break
		}
	}
	fmt.Println()
	for _, line := range lines {
		fmt.Println(line)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d kernels failed", failed, len(kernels))
	}
	return nil
}

// runDirName is the directory under build/lab/runs that keeps a suite's
// logs: its name on the default kernel, name@kernel on another.
func runDirName(suite, kernel string) string {
	if kernel == "" || kernel == defaultKernel {
		return suite
	}
	return suite + "@" + kernel
}

func quoteArgs(args []string) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteString(" " + shellQuote(a))
	}
	return b.String()
}

// runSuites prepares the lab once and runs the suites one after another
// (guests of one suite boot in parallel; suites share the two cores).
func runSuites(ctx context.Context, l *Lab, suites []*Suite) error {
	t0 := time.Now()
	if err := l.Prepare(ctx); err != nil {
		return err
	}
	logf("lab ready in %.1fs: kernel %s %s", time.Since(t0).Seconds(), l.kernel.Name, l.kernel.ABI)
	passed, failed := 0, 0
	var summary []string
	for _, s := range suites {
		if ctx.Err() != nil {
			break
		}
		logf("suite %s: %d guest(s), deadline %s, boot watchdog %gs", s.Name, s.Guests, s.Timeout, bootWatchdog(s.Timeout).Seconds())
		res, retried, err := runSuite(ctx, l, s)
		var line string
		switch {
		case err != nil:
			line = fmt.Sprintf("FAIL %s: %v", s.Name, err)
		case s.ExpectFail != nil:
			line = expectedFailure(s, res)
		case len(res.failures) > 0:
			line = fmt.Sprintf("FAIL %s (%.1fs):\n  %s\n  logs: %s", s.Name, res.elapsed.Seconds(), strings.Join(res.failures, "\n  "), res.logs)
		default:
			line = fmt.Sprintf("ok   %s (%.1fs)", s.Name, res.elapsed.Seconds())
		}
		if retried != "" {
			line += "\n  (" + retried + ")"
		}
		if strings.HasPrefix(line, "ok") {
			passed++
		} else {
			failed++
		}
		logf("%s", line)
		summary = append(summary, line)
	}
	fmt.Println()
	for _, line := range summary {
		fmt.Println(line)
	}
	fmt.Printf("lab: %d passed, %d failed\n", passed, failed)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted")
	}
	if failed > 0 {
		return fmt.Errorf("%d lab suite(s) failed", failed)
	}
	return nil
}

// runSuite runs a suite, and once more when the first attempt failed only
// because of the lab (see retryReason): a guest that did not boot, or a
// guest NIC that stopped sending, is not a verdict on the suite. retried
// says why it ran twice ("" when it did not); the result is the second
// attempt's.
func runSuite(ctx context.Context, l *Lab, s *Suite) (res *runResult, retried string, err error) {
	res, err = l.Run(ctx, s, false, 1)
	if err != nil || res.retry == "" || ctx.Err() != nil {
		return res, "", err
	}
	kept := filepath.Join(res.logs, "attempt1")
	retried = fmt.Sprintf("second attempt: the first (%.1fs, logs in %s) failed only because of the lab: %s", res.elapsed.Seconds(), kept, res.retry)
	logf("suite %s: RETRYING ONCE after %.1fs: the run failed only because of the lab (%s); the first attempt's logs are kept in %s",
		s.Name, res.elapsed.Seconds(), res.retry, kept)
	res, err = l.Run(ctx, s, false, 2)
	if err != nil {
		return nil, retried, fmt.Errorf("second attempt: %w", err)
	}
	return res, retried, nil
}

// expectedFailure judges a lab self-test: it must fail, for the reason it
// names, and leave nothing running.
func expectedFailure(s *Suite, res *runResult) string {
	msg := strings.Join(res.failures, "\n")
	switch {
	case len(res.failures) == 0:
		return fmt.Sprintf("FAIL %s: the run passed but was expected to fail with /%s/", s.Name, s.ExpectFail)
	case strings.Contains(msg, "outlived the run"):
		return fmt.Sprintf("FAIL %s: %s", s.Name, msg)
	case !s.ExpectFail.MatchString(msg):
		return fmt.Sprintf("FAIL %s: failed, but not with /%s/:\n  %s", s.Name, s.ExpectFail, strings.ReplaceAll(msg, "\n", "\n  "))
	}
	return fmt.Sprintf("ok   %s (%.1fs; failed as expected: %s)", s.Name, res.elapsed.Seconds(), strings.ReplaceAll(msg, "\n", "; "))
}

// allSuites loads every *.sh in dir, in name order.
func allSuites(root, dir string) ([]*Suite, error) {
	files, err := filepath.Glob(filepath.Join(root, dir, "*.sh"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	return namedSuites(root, files)
}

func namedSuites(root string, names []string) ([]*Suite, error) {
	var suites []*Suite
	for _, n := range names {
		p := n
		if !strings.Contains(n, "/") {
			p = filepath.Join(root, suitesDir, strings.TrimSuffix(n, ".sh")+".sh")
			if b := filepath.Join(root, benchDir, strings.TrimSuffix(n, ".sh")+".sh"); !fileExists(p) && fileExists(b) {
				p = b
			}
		} else if !filepath.IsAbs(p) {
			abs, err := filepath.Abs(p)
			if err != nil {
				return nil, err
			}
			p = abs
		}
		s, err := loadSuite(root, p)
		if err != nil {
			return nil, err
		}
		suites = append(suites, s)
	}
	return suites, nil
}

// repoRoot finds the repository root (the directory with go.mod) from the
// working directory upwards.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside the repository (no go.mod above the working directory)")
		}
		dir = parent
	}
}

func defaultCache() string {
	if c := os.Getenv("SOFTROCE_CACHE"); c != "" {
		return c
	}
	if c, err := os.UserCacheDir(); err == nil {
		return filepath.Join(c, "rdmaplus-softroce")
	}
	return filepath.Join(os.TempDir(), "rdmaplus-softroce")
}
