//go:build lab

package jbmt_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// self dials this guest's own JBMT service (a loopback connection).
func self(t *testing.T, ctx context.Context, s *jbmt.Service) *jbmt.Peer {
	t.Helper()
	addr := netip.AddrPortFrom(netip.MustParseAddr(labenv.Addr()), 0)
	p, err := s.Dial(ctx, addr)
	if err != nil {
		t.Fatalf("Dial %v: %v", addr, err)
	}
	return p
}

// alloc allocates n bytes outside the Go heap, freed when the test ends.
func alloc(t *testing.T, n int) []byte {
	t.Helper()
	b, err := jbmt.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jbmt.Free(b) })
	return b
}

// region allocates n bytes outside the Go heap and registers them.
func region(t *testing.T, s *jbmt.Service, n int, r jbmt.Rights) ([]byte, *jbmt.Region) {
	t.Helper()
	b := alloc(t, n)
	reg, err := s.Register(b, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return b, reg
}

// hole takes b's pages away, part of a buffer that a cleanup frees whole:
// an inaccessible mapping replaces them in one step (the kernel unmaps
// them first, as munmap does: transfers over them fail with ErrFault and
// cached ranges over them are dropped). A bare munmap would leave a gap
// that the Go runtime may map for itself, and the buffer's Free would
// then unmap that under it.
func hole(t *testing.T, b []byte) {
	t.Helper()
	if _, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&b[0]), uintptr(len(b)), unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED); err != nil {
		t.Fatalf("mmap over %d bytes: %v", len(b), err)
	}
}

// unmap takes b's pages out of the address space (unix.Munmap takes only
// whole mappings it made); nothing may free them after.
func unmap(t *testing.T, b []byte) {
	t.Helper()
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0); e != 0 {
		t.Fatalf("munmap: %v", e)
	}
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// signal and await pass a barrier of the lab's guests, or fail the test.
func signal(t *testing.T, name string) {
	t.Helper()
	if err := labenv.Signal(name); err != nil {
		t.Fatal(err)
	}
}

func await(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if err := labenv.Wait(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// loadToken waits for the token guest 1 published under name.
func loadToken(t *testing.T, ctx context.Context, name string) jbmt.Token {
	t.Helper()
	var tok jbmt.Token
	for labenv.Load(name, &tok) != nil {
		if ctx.Err() != nil {
			t.Fatalf("guest 1 published no token %q", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return tok
}

// dialGuest1 dials guest 1's JBMT service.
// needTwoGuests fails the test unless the boot has two guests.
func needTwoGuests(t *testing.T) {
	t.Helper()
	if n, err := labenv.Guests(); err != nil || n != 2 {
		t.Fatalf("this test needs a boot of two guests (have %d)", n)
	}
}

// redial dials server until it connects (5 s a try) or ctx ends, which
// fails the test: for a peer whose device or link just came back.
func redial(t *testing.T, ctx context.Context, s *jbmt.Service, server netip.AddrPort) *jbmt.Peer {
	t.Helper()
	for {
		try, cancelTry := context.WithTimeout(ctx, 5*time.Second)
		p, err := s.Dial(try, server)
		cancelTry()
		if err == nil {
			return p
		}
		if ctx.Err() != nil {
			t.Fatalf("Dial after the peer's device came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func dialGuest1(t *testing.T, ctx context.Context, s *jbmt.Service) *jbmt.Peer {
	t.Helper()
	a, err := labenv.AddrOf(1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Dial(ctx, netip.AddrPortFrom(netip.MustParseAddr(a), 0))
	if err != nil {
		t.Fatalf("Dial guest 1: %v", err)
	}
	return p
}

// settle waits up to two seconds for the sections of transfers that
// returned to give back their pages, and returns the statistics then. A
// get returns when its last section's answer arrives; the serving side
// (this guest too, over a loopback connection) releases that section when
// its own send completes, a moment later.
func settle(t *testing.T) jbmt.Stats {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		st := stats(t)
		if sectionPinned(st) == 0 || time.Now().After(deadline) {
			return st
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkUnpinned: no section is left pinned once every operation returned
// (what stays pinned belongs to idle cached ranges).
func checkUnpinned(t *testing.T) {
	t.Helper()
	if st := settle(t); sectionPinned(st) != 0 {
		t.Errorf("%d pages still pinned with no transfer in flight (%d in idle cached ranges)", st.PinnedPages, st.PinCacheIdle)
	}
}

// sectionPinned is what sections hold pinned: all but the idle cached
// ranges.
func sectionPinned(st jbmt.Stats) uint64 {
	return st.PinnedPages - st.PinCacheIdle
}

// TestLabTransferLoopback (suite jbmt): puts into a registered region and
// gets back from it over this guest's own connection, at sizes around
// page and section boundaries, from a Go slice at an odd address to an
// odd offset: every byte arrives, the bytes around the target range are
// untouched, and nothing is left pinned.
func TestLabTransferLoopback(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const size = 4 << 20
	mem, reg := region(t, s, size, jbmt.Read|jbmt.Write)
	before := stats(t)
	var moved uint64
	for i, n := range []int{1, 100, 4095, 4096, 4097, 256<<10 - 1, 256 << 10, 256<<10 + 1, 1<<20 + 777, 3 << 20} {
		off := uint64(13 + i*4096)
		for j := range mem {
			mem[j] = 0xee
		}
		src := random(n+5, uint64(i))[5:] // a slice that starts off alignment
		got, err := p.Put(ctx, src, reg.Token(), off)
		if err != nil || got != n {
			t.Fatalf("Put of %d bytes at %d: %d, %v", n, off, got, err)
		}
		if !bytes.Equal(mem[off:off+uint64(n)], src) {
			t.Fatalf("Put of %d bytes at %d: the region holds other bytes", n, off)
		}
		if mem[off-1] != 0xee || (off+uint64(n) < size && mem[off+uint64(n)] != 0xee) {
			t.Fatalf("Put of %d bytes at %d wrote around its range", n, off)
		}
		dst := make([]byte, n+3)[3:]
		got, err = p.Get(ctx, dst, reg.Token(), off)
		if err != nil || got != n {
			t.Fatalf("Get of %d bytes at %d: %d, %v", n, off, got, err)
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("Get of %d bytes at %d brought other bytes", n, off)
		}
		moved += uint64(n)
	}
	st := stats(t)
	if st.PutBytes-before.PutBytes != moved || st.GetBytes-before.GetBytes != moved ||
		st.Puts-before.Puts != 10 || st.Gets-before.Gets != 10 || st.OpErrors != before.OpErrors ||
		st.SectionsServed-before.SectionsServed != st.Sections-before.Sections {
		t.Errorf("counters %+v after 10 puts and 10 gets of %d bytes each way (before %+v)", st, moved, before)
	}
	t.Logf("%d bytes each way in %d sections", moved, st.Sections-before.Sections)
	checkUnpinned(t)
}

// TestLabTransferErrors (suite jbmt): each refusal comes back as its own
// error and leaves the connection up (the next transfer succeeds, no
// disconnect is counted): a wrong key, a revoked token (ErrStale) and one
// whose generation was changed (ErrBadToken), a region without the right,
// a range past its end, an unmapped page in the region and in the local
// buffer, an empty buffer.
func TestLabTransferErrors(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	mem, rw := region(t, s, 1<<20, jbmt.Read|jbmt.Write)
	_, ro := region(t, s, 1<<16, jbmt.Read)
	_, wo := region(t, s, 1<<16, jbmt.Write)
	before := stats(t)
	buf := make([]byte, 8192)
	ok := func(what string) {
		t.Helper()
		copy(mem, "after")
		if n, err := p.Get(ctx, buf[:5], rw.Token(), 0); err != nil || n != 5 || string(buf[:5]) != "after" {
			t.Fatalf("a Get after %s: %d, %v, %q", what, n, err, buf[:5])
		}
	}
	wrong := rw.Token()
	wrong.Key ^= 1
	if _, err := p.Get(ctx, buf, wrong, 0); !errors.Is(err, jbmt.ErrBadToken) {
		t.Errorf("Get with a wrong key: %v, want ErrBadToken", err)
	}
	ok("a wrong key")
	if _, err := p.Put(ctx, buf, ro.Token(), 0); !errors.Is(err, jbmt.ErrPermission) {
		t.Errorf("Put into a read-only region: %v, want ErrPermission", err)
	}
	if _, err := p.Get(ctx, buf, wo.Token(), 0); !errors.Is(err, jbmt.ErrPermission) {
		t.Errorf("Get from a write-only region: %v, want ErrPermission", err)
	}
	ok("missing rights")
	if _, err := p.Get(ctx, buf[:20], rw.Token(), 1<<20-10); !errors.Is(err, jbmt.ErrRange) {
		t.Errorf("Get past the region's end: %v, want ErrRange", err)
	}
	if _, err := p.Put(ctx, buf[:1], rw.Token(), 1<<62); !errors.Is(err, jbmt.ErrRange) {
		t.Errorf("Put far past the region's end: %v, want ErrRange", err)
	}
	ok("a range past the end")

	// a hole in the region: its third page taken away
	holed, hr := region(t, s, 8*4096, jbmt.Read|jbmt.Write)
	hole(t, holed[2*4096:3*4096])
	if n, err := p.Get(ctx, buf, hr.Token(), 4096); !errors.Is(err, jbmt.ErrFault) {
		t.Errorf("Get over an unmapped page of the region: %d, %v, want ErrFault", n, err)
	}
	if _, err := p.Put(ctx, buf, hr.Token(), 4096); !errors.Is(err, jbmt.ErrFault) {
		t.Errorf("Put over an unmapped page of the region: %v, want ErrFault", err)
	}
	// and in the local buffer
	local, err := jbmt.Alloc(3 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	unmap(t, local[4096:2*4096])
	if n, err := p.Get(ctx, local, rw.Token(), 0); !errors.Is(err, jbmt.ErrFault) && !errors.Is(err, syscall.EFAULT) {
		t.Errorf("Get into an unmapped local page: %d, %v, want ErrFault", n, err)
	}
	unmap(t, local)
	ok("unmapped pages")

	if _, err := p.Get(ctx, nil, rw.Token(), 0); !errors.Is(err, jbmt.ErrInvalid) {
		t.Errorf("Get of nothing: %v, want ErrInvalid", err)
	}
	tok := ro.Token()
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, buf, tok, 0); !errors.Is(err, jbmt.ErrStale) {
		t.Errorf("Get with a revoked token: %v, want ErrStale", err)
	}
	ok("a revoked token")
	// the same id and key under a later generation: never issued
	tok.Gen++
	if _, err := p.Get(ctx, buf, tok, 0); !errors.Is(err, jbmt.ErrBadToken) {
		t.Errorf("Get with a revoked token's generation changed: %v, want ErrBadToken", err)
	}
	// a live token's id under another generation with its key: never issued
	other := rw.Token()
	other.Gen--
	if _, err := p.Put(ctx, buf[:1], other, 0); !errors.Is(err, jbmt.ErrBadToken) {
		t.Errorf("Put with a live token's generation changed: %v, want ErrBadToken", err)
	}
	ok("a changed generation")

	st := stats(t)
	if st.Disconnects != before.Disconnects || st.SectionsRefused-before.SectionsRefused < 10 {
		t.Errorf("counters %+v after the refusals (before %+v): want no disconnect and 10 refusals", st, before)
	}
	// each refusal counted by its reason (over loopback this host served them)
	var sum uint64
	for _, c := range []struct {
		why       string
		now, then uint64
		want      uint64
	}{
		{"never issued", st.RefusedNoEnt, before.RefusedNoEnt, 3},
		{"stale", st.RefusedStale, before.RefusedStale, 1},
		{"permission", st.RefusedPerm, before.RefusedPerm, 2},
		{"range", st.RefusedRange, before.RefusedRange, 2},
		{"fault", st.RefusedFault, before.RefusedFault, 2},
		{"nomem", st.RefusedNoMem, before.RefusedNoMem, 0},
		{"invalid", st.RefusedInval, before.RefusedInval, 0},
	} {
		if d := c.now - c.then; d != c.want {
			t.Errorf("refusals counted as %s: %d, want %d", c.why, d, c.want)
		}
		sum += c.now - c.then
	}
	if d := st.SectionsRefused - before.SectionsRefused; sum != d {
		t.Errorf("refusals by reason sum to %d, sections_refused moved by %d", sum, d)
	}
	checkUnpinned(t)
}

// TestLabTransferUnprivileged (suite jbmt): a process without
// CAP_IPC_LOCK under a 64 KiB RLIMIT_MEMLOCK (where ibv_reg_mr of the
// same buffer fails) puts and gets 16 MiB, 256 times its limit.
func TestLabTransferUnprivileged(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const n = 16 << 20
	mem, reg := region(t, s, n, jbmt.Read|jbmt.Write)
	src := random(n, 99)
	dst := make([]byte, n)
	var err error
	labenv.AsUnprivileged(t, 64<<10, 0, func() {
		if _, err = p.Put(ctx, src, reg.Token(), 0); err != nil {
			return
		}
		_, err = p.Get(ctx, dst, reg.Token(), 0)
	})
	if err != nil {
		t.Fatalf("under a 64 KiB memlock limit: %v", err)
	}
	if !bytes.Equal(mem, src) || !bytes.Equal(dst, src) {
		t.Fatal("the bytes differ")
	}
	checkUnpinned(t)
}

// TestLabTransferCancel (suite jbmt): a context cancelled while a large
// get runs ends it with the context's error, soon; the connection stays
// usable and nothing stays pinned.
func TestLabTransferCancel(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const n = 64 << 20
	_, reg := region(t, s, n, jbmt.Read|jbmt.Write)
	dst := make([]byte, n)
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	t0 := time.Now()
	got, err := p.Get(short, dst, reg.Token(), 0)
	took := time.Since(t0)
	t.Logf("a 64 MiB Get cancelled after 200 ms: %d bytes, %v, after %v", got, err, took.Round(time.Millisecond))
	if err == nil {
		return // the Get finished before its context ended: nothing to check
	}
	if !errors.Is(err, context.DeadlineExceeded) || took > 10*time.Second {
		t.Errorf("a cancelled Get: %v after %v, want the context's error soon", err, took)
	}
	if _, err := p.Get(ctx, dst[:4096], reg.Token(), 0); err != nil {
		t.Errorf("a Get after the cancelled one: %v", err)
	}
	checkUnpinned(t)
}

// TestTwoGuestsTransfer (suite jbmt-2guests): guest 1 registers 8 MiB
// and publishes its token; guest 2 gets all of it over the connection
// between the hosts and checks every byte, then puts other bytes into
// its second half at an odd offset, which guest 1 checks. Neither host
// is left with pages pinned.
func TestTwoGuestsTransfer(t *testing.T) {
	s := open(t)
	needTwoGuests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 8 << 20
	const off = n/2 + 1234
	want := random(n, 1)
	put := random(n/2-1234, 2)
	if labenv.Role() == "server" {
		mem, reg := region(t, s, n, jbmt.Read|jbmt.Write)
		copy(mem, want)
		if err := labenv.Publish("jbmt-token", reg.Token()); err != nil {
			t.Fatal(err)
		}
		await(t, ctx, "jbmt-xfer-put")
		if !bytes.Equal(mem[:off], want[:off]) || !bytes.Equal(mem[off:], put) {
			t.Error("the region does not hold what guest 2 put")
		}
		checkUnpinned(t)
		signal(t, "jbmt-xfer-checked")
		return
	}
	tok := loadToken(t, ctx, "jbmt-token")
	p := dialGuest1(t, ctx, s)
	got := make([]byte, n)
	t0 := time.Now()
	if m, err := p.Get(ctx, got, tok, 0); err != nil || m != n {
		t.Fatalf("Get of 8 MiB from guest 1: %d, %v", m, err)
	}
	took := time.Since(t0)
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes got from guest 1 differ")
	}
	t.Logf("8 MiB got from guest 1 in %v", took.Round(time.Millisecond))
	if m, err := p.Put(ctx, put, tok, off); err != nil || m != len(put) {
		t.Fatalf("Put into guest 1: %d, %v", m, err)
	}
	checkUnpinned(t)
	signal(t, "jbmt-xfer-put")
	await(t, ctx, "jbmt-xfer-checked")
}

// TestTwoGuestsTransferPeerGone (suite jbmt-2guests): guest 1 deletes
// its RDMA device while guest 2 gets from its region in a loop, blocking
// and asynchronous (gets of 4 KiB and 64 KiB, which start in the
// submitting call and end in the completion handler, or with the
// connection). Guest 2's gets fail with ErrPeerGone (never hang), and
// neither host keeps a page pinned. The region does not depend on a device: once guest 1 adds the
// device again, a new connection gets from the same token, every byte
// right. The lab fails the run on any kernel report, and on a module
// that does not unload.
func TestTwoGuestsTransferPeerGone(t *testing.T) {
	s := open(t)
	dev := labenv.Device(t)
	needTwoGuests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 32 << 20
	want := random(n, 3)
	if labenv.Role() == "server" {
		mem, reg := region(t, s, n, jbmt.Read)
		copy(mem, want)
		if err := labenv.Publish("gone2-token", reg.Token()); err != nil {
			t.Fatal(err)
		}
		await(t, ctx, "gone2-started")
		time.Sleep(300 * time.Millisecond)
		rdmaLink(t, "delete", dev)
		await(t, ctx, "gone2-failed")
		for st := stats(t); sectionPinned(st) != 0 || st.Peers != 0; st = stats(t) {
			if ctx.Err() != nil {
				t.Fatalf("with the device gone: %+v, want no peer and no page pinned", st)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rdmaLink(t, "add", dev, "type", "rxe", "netdev", "eth0")
		signal(t, "gone2-back")
		await(t, ctx, "gone2-done")
		checkUnpinned(t)
		signal(t, "gone2-checked")
		return
	}
	tok := loadToken(t, ctx, "gone2-token")
	p := dialGuest1(t, ctx, s)
	server := p.Addr()
	got := make([]byte, n)
	asyncErr := make(chan error, 1)
	go func() { asyncErr <- asyncGetsUntilError(ctx, s, p, tok) }()
	signal(t, "gone2-started")
	t0 := time.Now()
	var err error
	for err == nil && ctx.Err() == nil {
		_, err = p.Get(ctx, got, tok, 0)
	}
	t.Logf("Get while guest 1's device went: %v after %v", err, time.Since(t0).Round(time.Millisecond))
	if !errors.Is(err, jbmt.ErrPeerGone) {
		t.Fatalf("Get while the peer's device went: %v, want ErrPeerGone", err)
	}
	if err := <-asyncErr; !errors.Is(err, jbmt.ErrPeerGone) {
		t.Errorf("asynchronous gets while the peer's device went: %v, want ErrPeerGone", err)
	}
	t.Logf("asynchronous gets started in the submitting call since load: %d", sysfsJBMT(t, "async_direct"))
	if _, err := p.Get(ctx, got[:10], tok, 0); !errors.Is(err, jbmt.ErrPeerGone) {
		t.Errorf("Get on the lost connection: %v, want ErrPeerGone", err)
	}
	checkUnpinned(t)
	signal(t, "gone2-failed")
	await(t, ctx, "gone2-back")
	again := redial(t, ctx, s, server)
	clear(got)
	if m, err := again.Get(ctx, got, tok, 0); err != nil || m != n || !bytes.Equal(got, want) {
		t.Fatalf("Get over the new connection with the same token: %d, %v (bytes equal: %v)", m, err, bytes.Equal(got, want))
	}
	checkUnpinned(t)
	signal(t, "gone2-done")
	await(t, ctx, "gone2-checked")
}

// asyncGetsUntilError starts gets of 4 KiB and 64 KiB from offset 0 of
// tok's region, two at a time, again and again, until one fails: its
// error, once every get started has ended.
func asyncGetsUntilError(ctx context.Context, s *jbmt.Service, p *jbmt.Peer, tok jbmt.Token) error {
	bufs := [][]byte{make([]byte, 4096), make([]byte, 64<<10)}
	cs := make([]jbmt.Completion, 2)
	var first error
	for first == nil {
		for i, b := range bufs {
			if err := p.StartGet(b, tok, 0, uint64(i)); err != nil {
				return err
			}
		}
		for k := 0; k < len(bufs); {
			if err := s.Wait(ctx); err != nil {
				return err
			}
			m := s.Poll(cs)
			for _, c := range cs[:m] {
				if c.Err != nil && first == nil {
					first = c.Err
				}
			}
			k += m
		}
	}
	return first
}

// TestLabTransferUnmapDuring (suite jbmt): the buffer a 64 MiB get writes
// into loses its second half (munmap) while the get runs. The get ends
// with ErrFault having moved less than all (or, on a fast machine,
// finishes first); the pages in flight stay valid until their sections
// end (they are pinned), nothing stays pinned, and the connection serves
// the next get.
func TestLabTransferUnmapDuring(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const n = 64 << 20
	_, reg := region(t, s, n, jbmt.Read|jbmt.Write)
	dst, err := jbmt.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer unmap(t, dst[:n/2])
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		m, err := p.Get(ctx, dst, reg.Token(), 0)
		done <- result{m, err}
	}()
	time.Sleep(150 * time.Millisecond)
	unmap(t, dst[n/2:])
	r := <-done
	t.Logf("a 64 MiB Get whose second half was unmapped 150 ms in: %d bytes, %v", r.n, r.err)
	switch {
	case r.err == nil && r.n == n: // finished before the munmap
	case errors.Is(r.err, jbmt.ErrFault) && r.n < n:
	default:
		t.Errorf("Get: %d bytes, %v; want ErrFault and less than all", r.n, r.err)
	}
	if _, err := p.Get(ctx, dst[:4096], reg.Token(), 0); err != nil {
		t.Errorf("a Get after: %v", err)
	}
	checkUnpinned(t)
}

// helperEnv, when set, makes TestLabTransferHelper a child process that
// gets from the region whose token the variable holds, over its own
// connection, until it is killed.
const helperEnv = "JBMT_TEST_HELPER_TOKEN"

// TestLabTransferHelper is the child of TestLabTransferKilled; run
// directly it only checks that it is not one.
func TestLabTransferHelper(t *testing.T) {
	v := os.Getenv(helperEnv)
	if v == "" {
		return
	}
	var tok jbmt.Token
	if err := json.Unmarshal([]byte(v), &tok); err != nil {
		t.Fatal(err)
	}
	s := open(t)
	ctx := context.Background()
	p := self(t, ctx, s)
	dst := make([]byte, 32<<20)
	fmt.Println("helper: getting")
	for {
		if _, err := p.Get(ctx, dst, tok, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLabTransferKilled (suite jbmt): a process killed with SIGKILL while
// it gets 32 MiB sections in a loop from this process's region leaves
// nothing behind: no page pinned, no grant, the region still serving,
// and (the lab checks) no kernel report and a module that unloads.
func TestLabTransferKilled(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 32 << 20
	mem, reg := region(t, s, n, jbmt.Read|jbmt.Write)
	copy(mem, random(n, 5))
	tok, err := json.Marshal(reg.Token())
	if err != nil {
		t.Fatal(err)
	}
	before := stats(t)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLabTransferHelper$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(tok))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "helper: getting") {
	}
	go io.Copy(io.Discard, out)
	for st := stats(t); st.SectionsServed-before.SectionsServed < 8; st = stats(t) {
		if ctx.Err() != nil {
			t.Fatalf("the helper never got going: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	werr := cmd.Wait()
	t.Logf("helper killed with sections in flight: %v; %d sections served", werr,
		stats(t).SectionsServed-before.SectionsServed)
	// The helper's ranges went with its file; the region's stay cached.
	for st := stats(t); sectionPinned(st) != 0 || st.OpPinnedPages != 0; st = stats(t) {
		if ctx.Err() != nil {
			t.Fatalf("pages still pinned after the killed process: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p := self(t, ctx, s)
	got := make([]byte, 4096)
	if _, err := p.Get(ctx, got, reg.Token(), 0); err != nil || !bytes.Equal(got, mem[:4096]) {
		t.Errorf("a Get after the helper was killed: %v", err)
	}
}

// setParam writes a module parameter and restores it when the test ends.
func setParam(t *testing.T, name, v string) {
	t.Helper()
	path := "/sys/module/rdmaplus/parameters/" + name
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(path, old, 0o644) })
}

// sysfsJBMT reads one of the module's JBMT files.
func sysfsJBMT(t *testing.T, name string) uint64 {
	t.Helper()
	b, err := os.ReadFile("/sys/kernel/rdmaplus/jbmt/" + name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// budgetRun makes 8 gets and 8 puts of 64 KiB at once, each at its own
// offset of the region, from page-aligned buffers (so that a section
// spans as many pages on both hosts), and checks every byte when mem (the
// region's memory) is given.
func budgetRun(t *testing.T, ctx context.Context, p *jbmt.Peer, mem []byte, tok jbmt.Token) {
	t.Helper()
	const each = 64 << 10
	arena, err := jbmt.Alloc(16 * each)
	if err != nil {
		t.Fatal(err)
	}
	defer jbmt.Free(arena)
	errs := make(chan error, 16)
	for i := range 16 {
		go func() {
			off := uint64(i * each)
			buf := arena[off : off+each]
			data := random(each, uint64(100+i))
			var err error
			if i%2 == 0 {
				if mem != nil {
					copy(mem[off:], data)
				}
				if _, err = p.Get(ctx, buf, tok, off); err == nil && mem != nil && !bytes.Equal(buf, data) {
					err = fmt.Errorf("get %d: other bytes", i)
				}
			} else {
				copy(buf, data)
				if _, err = p.Put(ctx, buf, tok, off); err == nil && mem != nil && !bytes.Equal(mem[off:off+each], data) {
					err = fmt.Errorf("put %d: other bytes", i)
				}
			}
			errs <- err
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestLabTransferBudget (suite jbmt): with a pin budget of one page on
// each side, 8 gets and 8 puts of 64 KiB at once over the loopback
// connection all complete with every byte right: sections shrink to one
// page, operations wait for the budget, and the serving side answers
// NOPIN until it has a page. Neither side's high-water mark passes the
// budget.
func TestLabTransferBudget(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	mem, reg := region(t, s, 16*64<<10, jbmt.Read|jbmt.Write)
	setParam(t, "jbmt_pin_budget_pages", "1")
	p := self(t, ctx, s)
	// The connection may be older than the budget: its first section
	// larger than a page is served alone, and answers it the budget.
	if _, err := p.Get(ctx, make([]byte, 64<<10), reg.Token(), 0); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"op_pinned_hwm", "served_pinned_hwm"} {
		if err := os.WriteFile("/sys/kernel/rdmaplus/jbmt/"+f, []byte("0"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := stats(t)
	t0 := time.Now()
	budgetRun(t, ctx, p, mem, reg.Token())
	st := stats(t)
	t.Logf("16 transfers of 64 KiB at a budget of one page: %v, %d sections, %d NACKs, %d waits for budget",
		time.Since(t0).Round(time.Millisecond), st.Sections-before.Sections,
		sysfsJBMT(t, "nacks_sent"), sysfsJBMT(t, "budget_waits"))
	if op, served := sysfsJBMT(t, "op_pinned_hwm"), sysfsJBMT(t, "served_pinned_hwm"); op > 1 || served > 1 {
		t.Errorf("high-water marks: operations %d, serving %d pages; the budget is 1", op, served)
	}
	checkUnpinned(t)

	// a process's share: 3 pages of a budget of 1024
	setParam(t, "jbmt_pin_budget_pages", "1024")
	setParam(t, "jbmt_pin_share_pages", "3")
	if err := os.WriteFile("/sys/kernel/rdmaplus/jbmt/op_pinned_hwm", []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
	budgetRun(t, ctx, p, mem, reg.Token())
	if op := sysfsJBMT(t, "op_pinned_hwm"); op > 3 {
		t.Errorf("operations' high-water mark %d pages; the process's share is 3", op)
	}
	checkUnpinned(t)
}

// TestTwoGuestsTransferBudget (suite jbmt-2guests): guest 1 serves with a
// pin budget of one page; guest 2 (its own budget untouched) makes 8
// gets and 8 puts of 64 KiB at once against it. All complete with every
// byte right, guest 1 answering NOPIN while its page is taken and never
// holding more than it.
func TestTwoGuestsTransferBudget(t *testing.T) {
	s := open(t)
	needTwoGuests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if labenv.Role() == "server" {
		mem, reg := region(t, s, 16*64<<10, jbmt.Read|jbmt.Write)
		setParam(t, "jbmt_pin_budget_pages", "1")
		if err := labenv.Publish("budget-token", reg.Token()); err != nil {
			t.Fatal(err)
		}
		await(t, ctx, "budget-warm")
		if err := os.WriteFile("/sys/kernel/rdmaplus/jbmt/served_pinned_hwm", []byte("0"), 0o644); err != nil {
			t.Fatal(err)
		}
		nacks := sysfsJBMT(t, "nacks_sent")
		signal(t, "budget-go")
		await(t, ctx, "budget-done")
		hwm := sysfsJBMT(t, "served_pinned_hwm")
		t.Logf("served at a budget of one page: high-water mark %d, %d NACKs", hwm, sysfsJBMT(t, "nacks_sent")-nacks)
		if hwm > 1 {
			t.Errorf("serving high-water mark %d pages; the budget is 1", hwm)
		}
		// the region's bytes: guest 2 checked its gets; the puts land here
		const each = 64 << 10
		for i := 1; i < 16; i += 2 {
			if !bytes.Equal(mem[i*each:(i+1)*each], random(each, uint64(100+i))) {
				t.Errorf("put %d: the region holds other bytes", i)
			}
		}
		checkUnpinned(t)
		signal(t, "budget-checked")
		return
	}
	tok := loadToken(t, ctx, "budget-token")
	p := dialGuest1(t, ctx, s)
	// the connection may be older than guest 1's budget: a first get
	// learns it
	if _, err := p.Get(ctx, make([]byte, 64<<10), tok, 0); err != nil {
		t.Fatal(err)
	}
	signal(t, "budget-warm")
	await(t, ctx, "budget-go")
	t0 := time.Now()
	budgetRun(t, ctx, p, nil, tok)
	t.Logf("16 transfers of 64 KiB against a budget of one page: %v, %d NACKs received",
		time.Since(t0).Round(time.Millisecond), sysfsJBMT(t, "nacks_received"))
	checkUnpinned(t)
	signal(t, "budget-done")
	await(t, ctx, "budget-checked")
}

// TestLabTransferFaults (suite jbmt): a region never touched has no page
// in memory. A get from it and a put into it are served from a work item
// that faults the pages in (counted as deferred), and bring zeros and
// land every byte; the same range, resident now, is served at once in
// the completion handler.
func TestLabTransferFaults(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const n = 1 << 20
	mem, reg := region(t, s, 2*n, jbmt.Read|jbmt.Write)
	before := stats(t)
	got := make([]byte, n)
	for i := range got {
		got[i] = 0xff
	}
	if _, err := p.Get(ctx, got, reg.Token(), 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, n)) {
		t.Error("a get from untouched memory brought other bytes than zeros")
	}
	src := random(n, 9)
	if _, err := p.Put(ctx, src, reg.Token(), n); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem[n:], src) {
		t.Error("a put into untouched memory left other bytes")
	}
	// At least the first section each way faults; with transparent huge
	// pages (6.12's default) its fault brings in 2 MiB, and the rest of
	// the range is resident by the time its sections come.
	mid := stats(t)
	if mid.SectionsDefer-before.SectionsDefer < 2 {
		t.Errorf("%d sections deferred for faults, want at least 2 (one each way)", mid.SectionsDefer-before.SectionsDefer)
	}
	if _, err := p.Get(ctx, got, reg.Token(), n); err != nil || !bytes.Equal(got, src) {
		t.Fatalf("a get of the resident range: %v", err)
	}
	// Served inline unless the address space's lock was taken at that
	// moment (this process's runtime maps memory too): then deferred.
	st := stats(t)
	inline, deferred := st.SectionsInline-mid.SectionsInline, st.SectionsDefer-mid.SectionsDefer
	if inline < 1 || inline+deferred < 4 {
		t.Errorf("a resident range of 4 or 5 sections: %d served inline, %d deferred; want most inline", inline, deferred)
	}
	checkUnpinned(t)
}

// TestLabTransferCredits (suite jbmt): with one credit (one section in
// flight to the peer, all operations together), 8 gets and 8 puts of
// 64 KiB at once all complete with every byte right; and again with a
// pin budget of one page on each side, so that they also go through NACK
// and retry.
func TestLabTransferCredits(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	mem, reg := region(t, s, 16*64<<10, jbmt.Read|jbmt.Write)
	p := self(t, ctx, s)
	setParam(t, "jbmt_credits", "1")
	t0 := time.Now()
	budgetRun(t, ctx, p, mem, reg.Token())
	t.Logf("16 transfers of 64 KiB at once with one credit: %v", time.Since(t0).Round(time.Millisecond))
	setParam(t, "jbmt_pin_budget_pages", "1")
	before := stats(t)
	t0 = time.Now()
	budgetRun(t, ctx, p, mem, reg.Token())
	st := stats(t)
	t.Logf("and a pin budget of one page: %v, %d NACKs, %d waits for budget", time.Since(t0).Round(time.Millisecond),
		st.NACKsSent-before.NACKsSent, st.BudgetWaits-before.BudgetWaits)
	checkUnpinned(t)
}
