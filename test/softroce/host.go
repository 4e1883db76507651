package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// hostPackages are the Debian packages the lab needs on the host: qemu, the
// userspace that goes into the guests, the tools to build the initramfs and
// the compiler for modules and cgo, and the unmodified programs that sockets
// over RDMA carries in its suites.
var hostPackages = []string{
	"qemu-system-x86", "rdma-core", "ibverbs-utils", "rdmacm-utils",
	"ibverbs-providers", "libibverbs-dev", "librdmacm-dev", "perftest",
	"busybox-static", "cpio", "kmod", "xz-utils", "iproute2", "bash", "gcc", "make",
	"iperf3", "sockperf", "redis-server", "redis-tools", "nginx-light", "wrk", "curl",
	"memcached", "libmemcached-tools", "openssh-server", "openssh-client",
	"strace", "time",
}

// aptLists is refreshed at most once per process and only when it is older
// than aptMaxAge or a package cannot be found.
var (
	aptOnce   sync.Once
	aptErr    error
	aptMaxAge = 24 * time.Hour
)

func aptUpdate(ctx context.Context, force bool) error {
	if !force && aptListsFresh() {
		return nil
	}
	aptOnce.Do(func() {
		logf("apt-get update")
		aptErr = run(ctx, "", "apt-get", "update", "-q")
	})
	return aptErr
}

// aptListsState identifies the current state of apt's package lists.
func aptListsState() string {
	files, _ := filepath.Glob("/var/lib/apt/lists/*_Packages*")
	var newest int64
	for _, f := range files {
		if st, err := os.Stat(f); err == nil && st.ModTime().UnixNano() > newest {
			newest = st.ModTime().UnixNano()
		}
	}
	return fmt.Sprintf("%d/%d", len(files), newest)
}

func aptListsFresh() bool {
	files, _ := filepath.Glob("/var/lib/apt/lists/*_Packages*")
	for _, f := range files {
		if st, err := os.Stat(f); err == nil && time.Since(st.ModTime()) < aptMaxAge {
			return true
		}
	}
	return false
}

// missingPackages returns the packages of pkgs that dpkg does not list as
// installed.
func missingPackages(ctx context.Context, pkgs []string) []string {
	var missing []string
	for _, p := range pkgs {
		out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f", "${Status}", p).Output()
		if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), " installed") {
			missing = append(missing, p)
		}
	}
	return missing
}

// ensurePackages installs whatever of pkgs is missing; it is a no-op when all
// are present.
func ensurePackages(ctx context.Context, pkgs ...string) error {
	missing := missingPackages(ctx, pkgs)
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("host packages missing and not running as root; install them with: apt-get install --no-install-recommends %s", strings.Join(missing, " "))
	}
	if err := aptUpdate(ctx, false); err != nil {
		return err
	}
	logf("installing host packages: %s", strings.Join(missing, " "))
	// Wait for another apt (a second lab preparing at the same time)
	// instead of failing on its lock.
	args := append([]string{"install", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300"}, missing...)
	err := runEnv(ctx, "", []string{"DEBIAN_FRONTEND=noninteractive"}, "apt-get", args...)
	if err != nil {
		// The lists may be stale (an ABI package gone from the archive).
		if uerr := aptUpdate(ctx, true); uerr != nil {
			return fmt.Errorf("installing %s: %w (and apt-get update: %v)", strings.Join(missing, " "), err, uerr)
		}
		err = runEnv(ctx, "", []string{"DEBIAN_FRONTEND=noninteractive"}, "apt-get", args...)
	}
	if err != nil {
		return fmt.Errorf("installing %s: %w", strings.Join(missing, " "), err)
	}
	return nil
}

// run runs a command, sending its output to the lab's log on failure.
func run(ctx context.Context, dir, name string, args ...string) error {
	return runEnv(ctx, dir, nil, name, args...)
}

func runEnv(ctx context.Context, dir string, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(string(out), 40))
	}
	return nil
}

// output runs a command and returns its standard output.
func output(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
