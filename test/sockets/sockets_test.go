// Package sockets_test builds the sockets-over-RDMA shim
// (cmd/sockpreload: librdmaplus-sockets.so) and its conformance program
// (cmd/sockpreload/test/conformance.c) with the host's C
// compiler, and runs the program over loopback TCP twice: plainly, and
// with the shim preloaded (pass-through mode: no RDMA, every byte on the
// kernel socket). Both runs must pass every scenario, and the shim's
// debug summary must show that it followed the connections. (The test
// lives here because Go refuses a package directory holding C files
// without cgo.)
package sockets_test

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce        sync.Once
	buildDir         string
	buildSkip        string
	buildErr         error
	builtSo, builtPr string
)

// build compiles the shim and the conformance program into a temporary
// directory with cmd/sockpreload/Makefile, once for every test; it skips
// without a C compiler.
func build(t *testing.T) (so, prog string) {
	t.Helper()
	buildOnce.Do(func() {
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		if _, err := exec.LookPath(cc); err != nil {
			buildSkip = fmt.Sprintf("no C compiler (%s): %v", cc, err)
			return
		}
		if _, err := exec.LookPath("make"); err != nil {
			buildSkip = fmt.Sprintf("no make: %v", err)
			return
		}
		if buildDir, buildErr = os.MkdirTemp("", "sockpreload"); buildErr != nil {
			return
		}
		// The sources are read here as well: go test caches a result by
		// the files the test itself opens, not by what make reads.
		srcs, _ := filepath.Glob("../../cmd/sockpreload/*.[ch]")
		tests, _ := filepath.Glob("../../cmd/sockpreload/test/*.c")
		for _, f := range append(append(srcs, tests...), "../../cmd/sockpreload/Makefile") {
			if _, err := os.ReadFile(f); err != nil {
				buildErr = err
				return
			}
		}
		cmd := exec.Command("make", "-s", "-C", "../../cmd/sockpreload", "O="+buildDir, "CC="+cc)
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("make: %v\n%s", err, b)
		}
		builtSo = filepath.Join(buildDir, "librdmaplus-sockets.so")
		builtPr = filepath.Join(buildDir, "conformance")
	})
	if buildSkip != "" {
		t.Skip(buildSkip)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtSo, builtPr
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var passed = regexp.MustCompile(`(?m)^\d+ scenarios, 0 failed$`)

// run runs the conformance program in loopback mode with extra
// environment; it returns stdout and stderr.
func run(t *testing.T, prog string, env ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, "loopback")
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	for _, l := range strings.Split(stdout.String(), "\n") {
		if strings.HasPrefix(l, "FAIL") {
			t.Error(l)
		}
	}
	if err != nil {
		t.Fatalf("conformance loopback %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(env, " "), err, stdout.String(), stderr.String())
	}
	if !passed.MatchString(stdout.String()) ||
		!strings.Contains(stdout.String(), "ok server/handlers") {
		t.Fatalf("conformance loopback: no summary of passed scenarios:\n%s", stdout.String())
	}
	return stdout.String(), stderr.String()
}

func TestConformancePlainAndPreloaded(t *testing.T) {
	so, prog := build(t)
	out, _ := run(t, prog)
	t.Logf("plain: %s", passed.FindString(out))

	out, errOut := run(t, prog, "LD_PRELOAD="+so, "RDMAPLUS_SOCKETS_DEBUG=1")
	t.Logf("preloaded: %s", passed.FindString(out))

	// One summary line per process that exited normally: the client, the
	// server, and the exec'd and spawned readers.
	re := regexp.MustCompile(`(?m)^rdmaplus-sockets: pid \d+: connections (.*)$`)
	lines := re.FindAllStringSubmatch(errOut, -1)
	if len(lines) == 0 {
		t.Fatalf("no summary from the shim on stderr:\n%s", errOut)
	}
	largest := map[string]uint64{}
	var adoptedReaders int
	for _, l := range lines {
		t.Logf("summary: %s", l[1])
		v := map[string]uint64{}
		for _, kv := range regexp.MustCompile(`(\w+)=(\d+)`).FindAllStringSubmatch(l[1], -1) {
			n, _ := strconv.ParseUint(kv[2], 10, 64)
			v[kv[1]] = n
			if n > largest[kv[1]] {
				largest[kv[1]] = n
			}
		}
		if v["adopted"] >= 1 && v["read"] > 0 {
			adoptedReaders++
		}
		// The client and the server close every fd they open (dup'ed
		// aliases included): every connection object must be released.
		if (v["client"] >= 30 || v["server"] >= 30) && v["live"] != 0 {
			t.Errorf("live=%d at exit: a connection object outlived its fds", v["live"])
		}
	}
	// The client dials the server once per scenario; the server accepts
	// them; the readers in a new image find the inherited socket.
	for k, least := range map[string]uint64{"client": 30, "server": 30, "listener": 1, "connect_failed": 2,
		"read": 1 << 20, "written": 1 << 20, "fd_passed": 1, "splice": 1, "spawn": 1} {
		if largest[k] < least {
			t.Errorf("no process's summary has %s >= %d (largest %d)", k, least, largest[k])
		}
	}
	if largest["attached"] != 0 {
		t.Errorf("attached=%d in pass-through mode", largest["attached"])
	}
	if adoptedReaders < 2 {
		t.Errorf("%d processes adopted an inherited socket and read from it, want 2 (exec and posix_spawn)", adoptedReaders)
	}
}

// The shim exports its wrappers and nothing else (-fvisibility=hidden).
func TestExports(t *testing.T) {
	so, _ := build(t)
	f, err := elf.Open(so)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			got = append(got, s.Name)
		}
	}
	sort.Strings(got)
	want := strings.Fields(`__close __dup2 __fcntl __poll __poll_chk __ppoll_chk __read __read_chk
		__recv_chk __recvfrom_chk __select __send __write accept accept4 bind clone close
		close_range closefrom connect dup dup2 dup3 epoll_create epoll_create1 epoll_ctl
		epoll_pwait epoll_pwait2 epoll_wait execl execle execlp execv execve execveat execvp
		execvpe fcntl fcntl64 fdopen fexecve getpeername getsockname getsockopt ioctl listen
		poll posix_spawn posix_spawnp ppoll prctl pselect read readv recv recvfrom recvmmsg recvmsg
		select send sendfile sendfile64 sendmmsg sendmsg sendto setsockopt shutdown socket
		splice tee vmsplice write writev`)
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("exported symbols:\n got %s\nwant %s", strings.Join(got, " "), strings.Join(want, " "))
	}
}
