// Package labenv is what a test running inside a SoftRoCE lab guest knows
// about its surroundings: which guest it is, the addresses of its peers, the
// RDMA device it must use, and a barrier and small published values shared
// by all guests of one boot.
//
// The lab (test/softroce) sets these through the environment of every
// command it runs in a guest. Outside the lab every accessor reports
// ErrNotInLab, so a lab test never mistakes the host for a guest.
//
// Lab tests are Go test files named *_lab_test.go that carry the build tag
// "lab". The lab compiles them with `go test -c -tags lab` and runs the
// binary in every guest. A lab test that needs a device calls Device(t),
// which fails the test (never skips it) when the guest has none.
package labenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Environment variables the lab sets in every guest command.
const (
	EnvIndex  = "LAB_INDEX"  // this guest's number, 1..LAB_GUESTS
	EnvGuests = "LAB_GUESTS" // how many guests this boot has
	EnvRole   = "LAB_ROLE"   // "server" on guest 1, "client" on the others
	EnvAddr   = "LAB_ADDR"   // this guest's IPv4 address on the lab segment
	EnvPeers  = "LAB_PEERS"  // the other guests' addresses, space-separated, by index
	EnvAddrs  = "LAB_ADDRS"  // every guest's address, space-separated, by index
	EnvDevice = "LAB_DEVICE" // the rxe device the lab created, e.g. "rxe0"
	EnvShared = "LAB_SHARED" // a directory every guest of this boot can read and write
	EnvOut    = "LAB_OUT"    // this guest's own output directory, kept with the run's logs
)

// ErrNotInLab is returned by the accessors when the process does not run
// inside a lab guest (the lab's environment is missing or malformed).
var ErrNotInLab = errors.New("labenv: not running inside a SoftRoCE lab guest")

// InLab reports whether the process runs inside a lab guest.
func InLab() bool { _, err := Index(); return err == nil }

// Index returns this guest's number (1-based) and fails with ErrNotInLab
// outside the lab.
func Index() (int, error) {
	n, err := strconv.Atoi(os.Getenv(EnvIndex))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%w: %s=%q", ErrNotInLab, EnvIndex, os.Getenv(EnvIndex))
	}
	return n, nil
}

// Guests returns how many guests this boot has.
func Guests() (int, error) {
	n, err := strconv.Atoi(os.Getenv(EnvGuests))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%w: %s=%q", ErrNotInLab, EnvGuests, os.Getenv(EnvGuests))
	}
	return n, nil
}

// Role returns "server" on guest 1 and "client" on every other guest.
func Role() string { return os.Getenv(EnvRole) }

// Addr returns this guest's IPv4 address on the lab segment.
func Addr() string { return os.Getenv(EnvAddr) }

// Peers returns the addresses of the other guests, ordered by guest index.
func Peers() []string { return strings.Fields(os.Getenv(EnvPeers)) }

// AddrOf returns the address of guest i (1-based); it fails when the boot
// has no such guest.
func AddrOf(i int) (string, error) {
	all := strings.Fields(os.Getenv(EnvAddrs))
	if i < 1 || i > len(all) {
		return "", fmt.Errorf("labenv: no guest %d in this boot of %d guests", i, len(all))
	}
	return all[i-1], nil
}

// TB is the part of testing.TB this package needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Device returns the name of the guest's RDMA device. It fails the test
// (never skips it) when the process is not in the lab or the device the lab
// announced is missing from /sys/class/infiniband.
func Device(t TB) string {
	t.Helper()
	if _, err := Index(); err != nil {
		t.Fatalf("%v (lab tests run only through test/softroce)", err)
	}
	dev := os.Getenv(EnvDevice)
	if dev == "" {
		t.Fatalf("labenv: %s is empty: the lab created no RDMA device", EnvDevice)
	}
	if _, err := os.Stat(filepath.Join("/sys/class/infiniband", dev)); err != nil {
		t.Fatalf("labenv: RDMA device %q missing in the guest: %v", dev, err)
	}
	return dev
}

// Signal marks the barrier point name as reached by this guest. Names are
// plain words (letters, digits, '-', '_', '.').
func Signal(name string) error {
	p, err := barrierPath(name)
	if err != nil {
		return err
	}
	return os.WriteFile(p, nil, 0o644)
}

// Wait blocks until some guest has called Signal(name) in this boot, or ctx
// ends (then it returns ctx's error wrapped with the name).
//
// It looks for the barrier's file every 5 ms at first, backing off to
// every 100 ms: the shared directory is a host mount, and under TCG each
// look costs the guest about 2 ms of CPU (a profile of a benchmark's
// target found a fixed 20 ms poll taking a quarter of its samples while
// it waited for the run to end).
func Wait(ctx context.Context, name string) error {
	p, err := barrierPath(name)
	if err != nil {
		return err
	}
	pause := 5 * time.Millisecond
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("labenv: waiting for %q: %w", name, ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
		t.Reset(pause)
	}
}

func barrierPath(name string) (string, error) { return sharedPath("barrier.", name, "") }

// Publish writes v, as JSON, under name in the directory every guest of
// the boot shares, whole or not at all: a guest that reads it meanwhile
// finds the previous value or none, never half of it. Names are plain
// words, as for Signal.
func Publish(name string, v any) error {
	p, err := sharedPath("", name, ".json")
	if err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("labenv: publishing %q: %w", name, err)
	}
	if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// Load reads into v what some guest published under name (Publish). It
// fails, wrapping fs.ErrNotExist, when nothing was published yet.
func Load(name string, v any) error {
	p, err := sharedPath("", name, ".json")
	if err != nil {
		return err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("labenv: reading %q: %w", name, err)
	}
	return nil
}

// sharedPath is the file prefix+name+suffix in the shared directory, for
// a plain-word name.
func sharedPath(prefix, name, suffix string) (string, error) {
	dir := os.Getenv(EnvShared)
	if dir == "" {
		return "", fmt.Errorf("%w: %s is empty", ErrNotInLab, EnvShared)
	}
	if name == "" || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != "" || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("labenv: bad name %q", name)
	}
	return filepath.Join(dir, prefix+name+suffix), nil
}

// CaptureStdout runs f and returns what it printed on standard output: a
// lab test runs a package's runnable examples on the guest's device and
// checks their output with it.
func CaptureStdout(t TB, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("capturing standard output: %v", err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	func() {
		defer func() { os.Stdout = stdout; w.Close() }()
		f()
	}()
	return string(<-done)
}

// keyStoreFaults is the kernel module's test knob (docs/kmod.md, "Keyed
// buffers"): while positive, each first packet of a keyed multi-packet
// write on a QP not named to the module fails to keep its message's key,
// as a failed allocation would, and is refused; each such failure takes
// one off. A named QP's keys take no memory and are never failed.
const keyStoreFaults = "/sys/module/rdmaplus/parameters/rvma_fail_key_stores"

// SetKeyStoreFaults makes the next n key stores of the kernel module that
// need memory fail (0: none). It fails when the module is not loaded.
func SetKeyStoreFaults(n int) error {
	if err := os.WriteFile(keyStoreFaults, []byte(strconv.Itoa(n)), 0o644); err != nil {
		return fmt.Errorf("labenv: %w", err)
	}
	return nil
}

// KeyStoreFaults returns how many of the failures SetKeyStoreFaults asked
// for have not happened yet.
func KeyStoreFaults() (int, error) {
	b, err := os.ReadFile(keyStoreFaults)
	if err != nil {
		return 0, fmt.Errorf("labenv: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("labenv: %s: %w", keyStoreFaults, err)
	}
	return n, nil
}

// InlineLoopback reports whether the guest's rxe places a loopback
// RDMA WRITE before the ibv_post_send that sent it returns. On 6.1
// (Debian 12) a user QP's post runs rxe's requester, and a single-packet
// request its responder, in the poster's system call; from 6.12 on both
// run in work items, as a NIC runs them beside the CPU, so a write posted
// in one goroutine may land after another goroutine's next post. Kernels
// the lab does not run (6.2 to 6.11) count as the newer ones. Tests whose
// bounds rest on that ordering (how many puts can go stale in one guest)
// check them only where it holds.
func InlineLoopback() bool {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(string(b), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 6 || major == 6 && minor <= 1
}

// AsUnprivileged runs fn on an OS thread of its own, as a process without
// CAP_IPC_LOCK would (capabilities belong to a thread), with RLIMIT_MEMLOCK
// set to limit bytes for the process meanwhile. With uid > 0 the thread
// also takes that user id (setresuid(2) called raw acts on one thread), so
// the module sees another user. The thread is never reused.
func AsUnprivileged(t TB, limit uint64, uid int, fn func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		t.Fatalf("labenv: %v", err)
	}
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // and never unlocked: the thread goes with us
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- err
			return
		}
		data[unix.CAP_IPC_LOCK/32].Effective &^= 1 << (unix.CAP_IPC_LOCK % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- err
			return
		}
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: limit, Max: old.Max}); err != nil {
			done <- err
			return
		}
		if uid > 0 {
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), 0); e != 0 {
				done <- e
				return
			}
		}
		fn()
		done <- nil
	}()
	err := <-done
	if rerr := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old); rerr != nil {
		t.Fatalf("labenv: %v", rerr)
	}
	if err != nil {
		t.Fatalf("labenv: %v", err)
	}
}
