//go:build lab

package perftest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/internal/aalab"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/perftest"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

const (
	page   = aalab.Page
	aaPort = 7570  // the target's rdma_cm port (unused by perftest)
	ptPort = 18515 // perftest's default side-channel port
)

// runClient runs an unmodified perftest client on guest 2 against guest
// 1's side-channel port and returns its output and error.
func runClient(t *testing.T, cmd string) ([]byte, error) {
	t.Helper()
	addr, err := labenv.AddrOf(1)
	if err != nil {
		t.Fatal(err)
	}
	args := append(strings.Fields(cmd), "-F", "-d", labenv.Device(t), "-p", fmt.Sprint(ptPort), addr)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
}

// A phase is one unmodified perftest client run against one page of the
// target: the page's actions, and what must reach the handler.
type phase struct {
	name string
	cmd  string // perftest program and its arguments (the target's address is appended)
	page int
	act  activeaccess.Actions
	kind activeaccess.Kind
	msgs int // messages the client moves (iterations times queue pairs)
	size int
}

var phases = []phase{
	// writes change memory and are logged with their data
	{"write", "ib_write_bw -s 4096 -n 200", 0, activeaccess.W | activeaccess.R | activeaccess.WLD, activeaccess.KindPut, 200, 4096},
	// two queue pairs, W=0: the data reaches only the log
	{"intercept", "ib_write_bw -s 4096 -n 100 -q 2", 1, activeaccess.Intercept, activeaccess.KindPut, 200, 4096},
	// reads served from memory, logged with the data served
	{"read", "ib_read_bw -s 4096 -n 200", 2, activeaccess.W | activeaccess.R | activeaccess.RLD, activeaccess.KindGet, 200, 4096},
	// small writes cycling through the page, logged without data
	{"small", "ib_write_bw -s 64 -n 500", 3, activeaccess.W | activeaccess.R | activeaccess.WL, activeaccess.KindPut, 500, 64},
}

type seen struct {
	off, n     int
	data       []byte
	suppressed bool
	kind       activeaccess.Kind
	source     *activeaccess.Peer
}

// TestLabPerftestSource: unmodified perftest clients on guest 2 (ib_write_bw,
// ib_read_bw) are sources of an Active Access target on guest 1 that
// answers perftest's side channel (Serve): every byte they write or read
// reaches the domain's handler exactly once, with the data; W=0 keeps the
// writes out of memory; the module refuses and loses nothing.
func TestLabPerftestSource(t *testing.T) {
	if !aalab.Server(t) {
		for _, p := range phases {
			aalab.Await(t, "pt-ready-"+p.name)
			out, err := runClient(t, p.cmd)
			if err != nil {
				t.Fatalf("%s: %v\n%s", p.cmd, err, out)
			}
			t.Logf("%s:\n%s", p.cmd, out)
			aalab.Signal(t, "pt-done-"+p.name)
		}
		return
	}
	tg := aalab.Listen(t, aaPort, 4*page, &activeaccess.TargetOptions{LogSize: 1 << 21})
	var mu sync.Mutex
	var got []seen
	d, err := tg.NewDomain(func(a *activeaccess.Access) {
		mu.Lock()
		got = append(got, seen{a.Offset, a.Length, a.Data, a.Suppressed, a.Kind, a.Source})
		mu.Unlock()
	}, &activeaccess.DomainOptions{Notify: activeaccess.Event})
	if err != nil {
		t.Fatal(err)
	}
	mem := tg.Memory()
	for _, p := range phases {
		copy(mem[p.page*page:], aalab.Pattern(p.page*page, page, byte(p.page+1)))
		if err := d.Associate(p.page*page, page, p.act); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", aalab.TargetAddr(t, ptPort).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	mtu, err := tg.PathMTU()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range phases {
		t.Run(p.name, func(t *testing.T) {
			before := d.Processed()
			aalab.Signal(t, "pt-ready-"+p.name)
			conn, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			err = perftest.ServeConn(aalab.Timeout(t, 90*time.Second), conn, tg, &perftest.Options{Offset: p.page * page})
			conn.Close()
			if err != nil {
				t.Fatalf("ServeConn: %v", err)
			}
			aalab.Await(t, "pt-done-"+p.name)
			// every packet of every message: at least one entry each
			want := uint64(p.msgs * ((p.size + mtu.Bytes() - 1) / mtu.Bytes()))
			for i := 0; i < 200 && d.Processed()-before < want; i++ {
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // nothing more may come
			mu.Lock()
			acc := got
			got = nil
			mu.Unlock()
			checkPhase(t, p, acc, mem, mtu.Bytes())
		})
	}
	refused, lost := d.Refused()
	st, err := tg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("module: %+v", st)
	if refused != 0 || lost != 0 || st.Missed != 0 {
		t.Fatalf("refused %d, lost %d, hook hits missed %d", refused, lost, st.Missed)
	}
}

func checkPhase(t *testing.T, p phase, acc []seen, mem []byte, mtu int) {
	t.Helper()
	lo, hi := p.page*page, (p.page+1)*page
	orig := aalab.Pattern(lo, page, byte(p.page+1))
	bytesSeen := 0
	var last []byte // the data of the page's last write, as memory must show it
	for i, a := range acc {
		switch {
		case a.kind != p.kind:
			t.Fatalf("access %d: %v, want %v", i, a.kind, p.kind)
		case a.off < lo || a.off+a.n > hi || a.n > mtu:
			t.Fatalf("access %d: [%d, +%d) outside page %d or above the MTU", i, a.off, a.n, p.page)
		case a.source != nil:
			t.Fatalf("access %d names a library source %+v", i, a.source)
		case a.suppressed != (p.act&activeaccess.W == 0 && p.kind == activeaccess.KindPut):
			t.Fatalf("access %d: suppressed %v with actions %v", i, a.suppressed, p.act)
		}
		bytesSeen += a.n
		logsData := p.act&(activeaccess.WLD|activeaccess.RLD) != 0
		if logsData != (len(a.data) == a.n) {
			t.Fatalf("access %d: %d bytes of data for %d bytes with actions %v", i, len(a.data), a.n, p.act)
		}
		if p.kind == activeaccess.KindGet && !bytes.Equal(a.data, orig[a.off-lo:a.off-lo+a.n]) {
			t.Fatalf("read %d at %d: the data logged is not the data served", i, a.off)
		}
		if p.kind == activeaccess.KindPut && logsData {
			if last == nil {
				last = append([]byte(nil), orig...)
			}
			copy(last[a.off-lo:], a.data)
		}
	}
	if bytesSeen != p.msgs*p.size {
		t.Fatalf("the handler saw %d bytes in %d accesses; the client moved %d messages of %d bytes", bytesSeen, len(acc), p.msgs, p.size)
	}
	// where: messages of a page each cover the page, every byte msgs
	// times (so a lost access and a duplicate cannot cancel out);
	// smaller ones step through it by their size
	if p.size == page {
		var times [page]int
		for _, a := range acc {
			for i := a.off - lo; i < a.off-lo+a.n; i++ {
				times[i]++
			}
		}
		for i, n := range times {
			if n != p.msgs {
				t.Fatalf("byte %d of the page was accessed %d times, want %d", i, n, p.msgs)
			}
		}
	} else {
		for i, a := range acc {
			if a.n != p.size || (a.off-lo)%p.size != 0 {
				t.Fatalf("access %d: [%d, +%d), not one whole %d-byte message", i, a.off-lo, a.n, p.size)
			}
		}
	}
	now := mem[lo:hi]
	switch {
	case p.act&activeaccess.W == 0 || p.kind == activeaccess.KindGet:
		if !bytes.Equal(now, orig) {
			t.Fatal("the page changed")
		}
	case last != nil:
		if !bytes.Equal(now, last) {
			t.Fatal("memory differs from the data the log shows written")
		}
		if bytes.Equal(now, orig) {
			t.Fatal("the writes did not change the page")
		}
	}
	t.Logf("%s: %d accesses, %d bytes, all checked", p.cmd, len(acc), bytesSeen)
}

// TestLabPerftestRefused: perftest knows nothing of credits, so it can
// fill a log whose handler is stuck. The module refuses the write that
// does not fit: the client fails with a completion error instead of the
// write going unlogged, ServeConn reports the client's early exit, and
// the handler gets exactly the writes that were logged, none other.
func TestLabPerftestRefused(t *testing.T) {
	const cmd = "ib_write_bw -s 1024 -n 100"
	if !aalab.Server(t) {
		aalab.Await(t, "ptr-ready")
		out, err := runClient(t, cmd)
		if err == nil {
			t.Fatalf("%s succeeded into a full log:\n%s", cmd, out)
		}
		if !strings.Contains(string(out), "Failed status 10:") { // IBV_WC_REM_ACCESS_ERR
			t.Fatalf("%s did not fail with a remote access error:\n%s", cmd, out)
		}
		t.Logf("%s failed as it must (%v):\n%s", cmd, err, out)
		aalab.Signal(t, "ptr-done")
		return
	}
	tg := aalab.Listen(t, aaPort+1, page, &activeaccess.TargetOptions{LogSize: 1 << 14, MaxSources: 1})
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock() // before the target's Close waits for the handler
	var mu sync.Mutex
	n, bad := 0, 0
	d, err := tg.NewDomain(func(a *activeaccess.Access) {
		<-release
		mu.Lock()
		n++
		if a.Length != 1024 || len(a.Data) != 1024 || !a.Suppressed {
			bad++
		}
		mu.Unlock()
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Associate(0, page, activeaccess.Intercept); err != nil {
		t.Fatal(err)
	}
	orig := aalab.Pattern(0, page, 9)
	copy(tg.Memory(), orig)
	ln, err := net.Listen("tcp", aalab.TargetAddr(t, ptPort).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	st0, err := tg.Stats() // the module's counters are global
	if err != nil {
		t.Fatal(err)
	}
	aalab.Signal(t, "ptr-ready")
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	serr := perftest.ServeConn(aalab.Timeout(t, 90*time.Second), conn, tg, nil)
	conn.Close()
	if !errors.Is(serr, perftest.ErrClientLeft) {
		t.Fatalf("ServeConn: %v, want the client's early exit (ErrClientLeft)", serr)
	}
	aalab.Await(t, "ptr-done")
	refused, lost := d.Refused()
	if refused == 0 || lost != 0 {
		t.Fatalf("refused %d, lost %d", refused, lost)
	}
	st, err := tg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	logged := st.Entries - st0.Entries
	unblock()
	for i := 0; i < 100 && d.Processed() < logged; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	switch {
	case n == 0 || uint64(n) != logged:
		t.Fatalf("the handler saw %d writes, the module logged %d", n, logged)
	case st.RefusedWrites-st0.RefusedWrites != refused:
		t.Fatalf("the module refused %d writes, the domain's log %d", st.RefusedWrites-st0.RefusedWrites, refused)
	case bad != 0:
		t.Fatalf("%d accesses were not whole suppressed 1 KiB writes with their data", bad)
	case !bytes.Equal(tg.Memory(), orig):
		t.Fatal("W=0 page changed")
	}
	t.Logf("%d writes logged and handled, %d refused (the client's error); ServeConn: %v", n, refused, serr)
}
