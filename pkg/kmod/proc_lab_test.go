//go:build lab

package kmod_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

const childEnv = "RDMAPLUS_AA_CHILD"

// TestLabChild is the other process of the isolation tests; it does
// nothing unless started by them.
func TestLabChild(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		return
	}
	if mode == "memlock" {
		if err := memlockChild(); err != nil {
			t.Fatal(err)
		}
		return
	}
	ctx, err := verbs.Open(labenv.Device(t))
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := ctx.AllocPD()
	mr, err := pd.AllocMR(4*page, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if mode == "armed" {
		d, err := kmod.Open()
		if err != nil {
			t.Fatal(err)
		}
		dm, err := d.NewDomain(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		if err := dm.Notify(kmod.NotifyOptions{Threshold: 1, Interval: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if err := dm.Arm(mr.RKey(), mr.Addr(), 4*page, kmod.WL|kmod.RL); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("READY %d %d %d\n", mr.RKey(), mr.Addr(), os.Getpid())
	// Hold everything until stdin ends (a shell suite pipes a sleep in).
	bufio.NewReader(os.Stdin).ReadString('\n')
}

type child struct {
	cmd  *exec.Cmd
	in   *os.File
	key  uint32
	addr uint64
}

func startChild(t *testing.T, mode string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLabChild$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	c := &child{cmd: cmd, in: w}
	t.Cleanup(func() { w.Close(); cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "READY" {
			k, _ := strconv.ParseUint(f[1], 10, 32)
			a, _ := strconv.ParseUint(f[2], 10, 64)
			c.key, c.addr = uint32(k), a
			go func() {
				for sc.Scan() {
				}
			}()
			return c
		}
	}
	t.Fatalf("child (%s) did not get ready", mode)
	return nil
}

// A process cannot arm another process's memory region, and cannot tell
// it from a key no region has (no key oracle).
func TestLabIsolation(t *testing.T) {
	d := openDev(t)
	c := startChild(t, "plain")
	dm := newDomain(t, d, 4096)
	err := dm.Arm(c.key, c.addr, page, kmod.W|kmod.WL)
	if !errors.Is(err, kmod.ErrNoRegion) || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("arming another process's region: %v, want ErrNoRegion (ENOENT)", err)
	}
	// the same answer for a key with the index of the child's region and
	// another key byte, and for an index no region has
	for _, k := range []uint32{c.key ^ 0x5a, c.key | 0x00ffff00} {
		err := dm.Arm(k, c.addr, page, kmod.W|kmod.WL)
		if !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("arming key %#x (no region): %v, want ENOENT", k, err)
		}
	}
	// Even this process's own verbs context is not enough: the region
	// must come from a uverbs file this process has open.
	p := newPair(t, 1)
	if err := dm.Arm(p.key(), p.addr(0), page, kmod.W|kmod.WL); err != nil {
		t.Fatalf("arming our own region: %v", err)
	}
	if err := dm.Disarm(p.key(), p.addr(0), page); err != nil {
		t.Fatal(err)
	}
	if st, _ := d.Stats(); st.Pages != 0 || st.HooksArmed {
		t.Fatalf("after Disarm: %+v", st)
	}
}

// kill -9 of a process with armed pages tears everything down.
func TestLabKill9(t *testing.T) {
	d := openDev(t)
	idle(t, d)
	c := startChild(t, "armed")
	st, err := d.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Domains != 1 || st.Pages != 4 || st.MRs != 1 || !st.HooksArmed {
		t.Fatalf("with the child armed: %+v", st)
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()
	st = idle(t, d)
	t.Logf("after kill -9: %+v", st)
}
