//go:build lab

package getlog_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/getlog"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/internal/aalab"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

const (
	pages  = 16
	size   = pages * aalab.Page
	rounds = 3
	gets   = 25
	name   = "replaying-reader"
	// childEnv makes the test binary the reader process: its value is
	// "<mode>:<barrier prefix>".
	childEnv = "GETLOG_LAB_READER"
)

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		os.Exit(reader(v))
	}
	os.Exit(m.Run())
}

// plan is the reader's k-th round of gets: the same every time it runs.
func plan(k int) [][2]int {
	rng := rand.New(rand.NewPCG(42, uint64(k)))
	var out [][2]int
	for i := 0; i < gets; i++ {
		n := 1 + rng.IntN(9000)
		out = append(out, [2]int{rng.IntN(size - n), n})
	}
	return out
}

func netipFrom(a string, p uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(a), p)
}

// version is the memory's content in round k.
func version(k int) byte { return byte(0x30 + k) }

func ports(mode activeaccess.Mode) (rdma uint16, replay string) {
	return 7660 + uint16(mode), fmt.Sprint(7670 + int(mode))
}

// reader is the reader process: it reads each round's gets after the
// target wrote that round's memory, checks them, says so on stdout, and
// waits to be killed. Exit status 1 on any failure.
func reader(v string) int {
	m, prefix, _ := strings.Cut(v, ":")
	mode := activeaccess.ModeTransparent
	if m == activeaccess.ModeMediated.String() {
		mode = activeaccess.ModeMediated
	}
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "reader:", err); return 1 }
	a, err := labenv.AddrOf(1)
	if err != nil {
		return fail(err)
	}
	port, _ := ports(mode)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var s *activeaccess.Source
	for k := 0; k < rounds; k++ {
		if err := labenv.Wait(ctx, fmt.Sprint(prefix, "-mem-", k)); err != nil {
			return fail(err)
		}
		if s == nil { // the target listens once it wrote round 0's memory
			if s, err = activeaccess.Dial(ctx, netipFrom(a, port), &activeaccess.SourceOptions{Name: name}); err != nil {
				return fail(err)
			}
		}
		for _, g := range plan(k) {
			buf := make([]byte, g[1])
			if err := s.GetWait(ctx, g[0], buf); err != nil {
				return fail(err)
			}
			if !bytes.Equal(buf, aalab.Pattern(g[0], g[1], version(k))) {
				return fail(fmt.Errorf("round %d: get [%d, +%d) read other bytes than the target holds", k, g[0], g[1]))
			}
		}
		if err := labenv.Signal(fmt.Sprint(prefix, "-read-", k)); err != nil {
			return fail(err)
		}
	}
	fmt.Println("READ ALL") // no Flush: the kill comes before the target handled them all
	time.Sleep(time.Hour)
	return 0
}

// TestLabGetLog: a reader process on guest 2 reads the target's memory in
// rounds while the target rewrites it between rounds; the target logs
// every byte served (RLD) to files. The reader is killed with SIGKILL
// (without flushing), a new process connects under the same name, recovers
// its log and re-executes the same gets from the Replayer: every byte is
// the one read before, although the memory now holds other data; the log
// then ends (io.EOF), and a live get sees the current memory.
func TestLabGetLog(t *testing.T) { aalab.ForModes(t, testGetLog) }

func testGetLog(t *testing.T, mode activeaccess.Mode, b func(string) string) {
	port, rport := ports(mode)
	prefix := b("r")
	if aalab.Server(t) {
		tg := aalab.Listen(t, port, size, &activeaccess.TargetOptions{LogSize: 1 << 20, Mode: mode})
		file := filepath.Join(t.TempDir(), "a-file")
		os.WriteFile(file, nil, 0o644)
		for _, bad := range []struct {
			tg          *activeaccess.Target
			off, length int
			dir         string
			want        error
		}{
			{nil, 0, aalab.Page, "/tmp", getlog.ErrInvalid}, {tg, 0, aalab.Page, "", getlog.ErrInvalid},
			{tg, 1, aalab.Page, "/tmp", getlog.ErrInvalid}, {tg, 0, 2 * size, t.TempDir(), activeaccess.ErrRange},
			{tg, 0, aalab.Page, file, syscall.ENOTDIR},
		} {
			if _, err := getlog.New(bad.tg, bad.off, bad.length, bad.dir, nil); !errors.Is(err, bad.want) {
				t.Fatalf("New(%v, %d, %d, %q): %v; want %v", bad.tg != nil, bad.off, bad.length, bad.dir, err, bad.want)
			}
		}
		l, err := getlog.New(tg, 0, size, t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ln, err := net.Listen("tcp", net.JoinHostPort(labenv.Addr(), rport))
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- l.ServeReplay(aalab.Timeout(t, 300*time.Second), ln) }()
		for k := 0; k < rounds; k++ {
			copy(tg.Memory(), aalab.Pattern(0, size, version(k)))
			aalab.Signal(t, fmt.Sprint(prefix, "-mem-", k))
			aalab.Await(t, fmt.Sprint(prefix, "-read-", k))
		}
		copy(tg.Memory(), aalab.Pattern(0, size, 0x77)) // what a live get now sees
		aalab.Signal(t, b("final"))
		aalab.Await(t, b("recovered"))
		t.Logf("%v: %d entries logged for %q", mode, l.Count(name), name)
		if err := l.Err(); err != nil {
			t.Fatal(err)
		}
		if err := tg.Err(); err != nil {
			t.Fatalf("target: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-served; err != nil {
			t.Fatalf("ServeReplay: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		return
	}

	defer aalab.Signal(t, b("recovered"))
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+mode.String()+":"+prefix)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "READ ALL\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the reader process failed: %q %s", line, stderr.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	aalab.Await(t, b("final"))

	ctx := aalab.Timeout(t, 120*time.Second)
	s := aalab.Dial(t, port, name)
	a, _ := labenv.AddrOf(1)
	start := time.Now()
	r, err := getlog.Recover(ctx, s, net.JoinHostPort(a, rport), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: recovered %d entries in %v", mode, r.Remaining(), time.Since(start).Round(time.Millisecond))
	var nbytes int
	for k := 0; k < rounds; k++ {
		for i, g := range plan(k) {
			buf := make([]byte, g[1])
			if err := r.Get(g[0], buf); err != nil {
				t.Fatalf("replay of round %d get %d [%d, +%d): %v", k, i, g[0], g[1], err)
			}
			if !bytes.Equal(buf, aalab.Pattern(g[0], g[1], version(k))) {
				t.Fatalf("replay of round %d get %d [%d, +%d): other bytes than were read", k, i, g[0], g[1])
			}
			nbytes += g[1]
		}
	}
	if err := r.Get(0, make([]byte, 8)); !errors.Is(err, io.EOF) || r.Remaining() != 0 {
		t.Fatalf("after the replay: %v, %d entries left", err, r.Remaining())
	}
	t.Logf("%v: %d gets, %d bytes replayed byte-identical (%d repeated entries skipped)", mode, rounds*gets, nbytes, r.Skipped())
	live := make([]byte, 100)
	if err := s.GetWait(ctx, 1000, live); err != nil || !bytes.Equal(live, aalab.Pattern(1000, 100, 0x77)) {
		t.Fatalf("live get after the replay: %v", err)
	}
	if _, err := getlog.Fetch(ctx, net.JoinHostPort(a, rport), strings.Repeat("x", 300), 1); !errors.Is(err, getlog.ErrInvalid) {
		t.Fatalf("Fetch with a long name: %v", err)
	}
}
