//go:build lab

package rvma_test

// The endpoint through its public API on one guest: the endpoint puts to
// its own listening address over a link of four stripes (rdma_cm to
// itself), so every byte crosses rxe. Each semantic of the issue that one
// process can show is checked here; the two-guest tests add real peers.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabEndpoint -test.v

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/netip"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

func labListen(t *testing.T, port uint16, opts *rvma.EndpointOptions) *rvma.Endpoint {
	t.Helper()
	labenv.Device(t)
	addr := netip.AddrPortFrom(netip.MustParseAddr(labenv.Addr()), port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep, err := rvma.Listen(ctx, addr, rvma.WithLabCounting(opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ep.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := ep.Close(); err != nil {
			t.Errorf("second close: %v", err)
		}
	})
	return ep
}

// openPosted opens a window on mb and posts n buffers of bufLen bytes,
// the first n of an arena of size buffers that it also returns.
func openPosted(t *testing.T, ep *rvma.Endpoint, mb rvma.Mailbox, o rvma.WindowOptions, n, size, bufLen int) (*rvma.Window, []byte, []*rvma.Posted) {
	t.Helper()
	w, err := ep.InitWindow(mb, &o)
	if err != nil {
		t.Fatal(err)
	}
	arena, err := ep.Alloc(size * bufLen)
	if err != nil {
		t.Fatal(err)
	}
	var posted []*rvma.Posted
	for i := 0; i < n; i++ {
		p, err := w.Post(context.Background(), arena[i*bufLen:(i+1)*bufLen], nil)
		if err != nil {
			t.Fatal(err)
		}
		posted = append(posted, p)
	}
	return w, arena, posted
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
	return b
}

func TestLabEndpointLoopback(t *testing.T) {
	ep := labListen(t, 7471, &rvma.EndpointOptions{Stripes: 4})
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const mb = rvma.Mailbox(0xABCD0001)
	const bufLen, piece = 16 << 10, 1 << 10
	w, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{Keep: 2}, 3, 3, bufLen)
	src, err := ep.Alloc(bufLen) // zero-copy sources
	if err != nil {
		t.Fatal(err)
	}

	orders := map[string]func(n int) []int{
		"forward": func(n int) []int {
			o := make([]int, n)
			for i := range o {
				o[i] = i
			}
			return o
		},
		"reverse": func(n int) []int {
			o := make([]int, n)
			for i := range o {
				o[i] = n - 1 - i
			}
			return o
		},
		"random": func(n int) []int { return rand.Perm(n) },
	}
	epoch := uint64(0)
	for round := 0; round < 2; round++ {
		for _, name := range []string{"forward", "reverse", "random"} {
			want := pattern(bufLen, byte(epoch*31+1))
			copy(src, want)
			var ops []*rvma.PutOp
			for _, i := range orders[name](bufLen / piece) {
				// Half the puts from endpoint memory (zero copy), half
				// from the Go heap (staged).
				s := src[i*piece : (i+1)*piece]
				if i%2 == 1 {
					s = append([]byte(nil), s...)
				}
				ops = append(ops, ep.PutAsync(ctx, self, mb, uint64(i*piece), s))
			}
			for _, op := range ops {
				if err := op.Wait(ctx); err != nil {
					t.Fatalf("%s round %d: %v", name, round, err)
				}
			}
			p := posted[epoch%3]
			rec, err := p.Wait(ctx)
			if err != nil {
				t.Fatalf("%s: wait: %v", name, err)
			}
			if rec.Epoch != epoch || rec.Len != bufLen || rec.Ops != bufLen/piece || rec.Flags != 0 {
				t.Fatalf("%s: record %+v, want epoch %d len %d ops %d", name, rec, epoch, bufLen, bufLen/piece)
			}
			if !bytes.Equal(p.Bytes(), want) {
				t.Fatalf("%s: epoch %d: bytes differ", name, epoch)
			}
			if c, ok := p.Completion().Load(); !ok || c != rec {
				t.Fatalf("%s: completion pointer %+v %v, want %+v", name, c, ok, rec)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			epoch++
		}
	}
	if got := w.Epoch(); got != epoch {
		t.Fatalf("window epoch %d, want %d", got, epoch)
	}
	if r := w.Rewind(5); len(r) != 2 || r[0].Epoch != epoch-1 || r[1].Epoch != epoch-2 {
		t.Fatalf("rewind: %+v", r)
	}
	t.Logf("6 epochs of 16 x 1 KiB over 4 stripes in forward, reverse and random order: bytes and records right; stats %+v; endpoint %+v",
		w.Stats(), ep.Stats())
	checkMetrics(t, ep, mb, map[string]float64{
		"rvma_window_puts_total": 6 * bufLen / piece, "rvma_window_bytes_total": 6 * bufLen,
		"rvma_window_epochs_completed_total": 6, "rvma_window_buffers_posted": 1, "rvma_window_buffers_held": 0,
		"rvma_window_stale_puts_total": 0, "rvma_window_module_refused_packets_total": 0, "rvma_endpoint_up": 1, "rvma_endpoint_windows": 1,
	})

	// A put that does not fit fails before anything is sent.
	if err := ep.Put(ctx, self, mb, bufLen-10, make([]byte, 11)); !errors.Is(err, rvma.ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	var pe *rvma.PutError
	if err := ep.Put(ctx, self, mb, bufLen-10, make([]byte, 11)); !errors.As(err, &pe) || pe.Len != 11 || pe.Offset != bufLen-10 {
		t.Fatalf("too large: %#v", err)
	}
	// No such mailbox.
	if err := ep.Put(ctx, self, 0xDEAD, 0, []byte("x")); !errors.Is(err, rvma.ErrNoMailbox) {
		t.Fatalf("no mailbox: %v", err)
	}
}

func TestLabEndpointNoBufferAndClose(t *testing.T) {
	ep := labListen(t, 7472, nil)
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A window with nothing posted: the put waits for a buffer until its
	// deadline, then fails with ErrNoBuffer; one posted later is filled.
	const mb = rvma.Mailbox(0x2)
	w, err := ep.InitWindow(mb, &rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	err = ep.Put(short, self, mb, 0, []byte("early"))
	cancelShort()
	if !errors.Is(err, rvma.ErrNoBuffer) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("put without a buffer: %v (endpoint %+v)", err, ep.Stats())
	}
	t.Logf("put without a buffer failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	mem, _ := ep.Alloc(4096)
	op := ep.PutAsync(ctx, self, mb, 0, []byte("waited"))
	time.Sleep(100 * time.Millisecond)
	select {
	case <-op.Done():
		t.Fatalf("put completed without a buffer: %v", op.Err())
	default:
	}
	p, err := w.Post(ctx, mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatalf("waiting put: %v", err)
	}
	rec, err := p.Wait(ctx)
	if err != nil || rec.Len != 6 || rec.Ops != 1 || string(mem[:6]) != "waited" {
		t.Fatalf("record %+v %v, bytes %q", rec, err, mem[:6])
	}

	// IncEpoch hands over a partial buffer with its true length.
	const mb3 = rvma.Mailbox(0x3)
	w3, _ := ep.InitWindow(mb3, &rvma.WindowOptions{Threshold: 4096})
	mem3, _ := ep.Alloc(4096)
	p3, _ := w3.Post(ctx, mem3, nil)
	if err := ep.Put(ctx, self, mb3, 100, []byte("partial")); err != nil {
		t.Fatal(err)
	}
	rec, err = w3.IncEpoch(ctx)
	if err != nil || rec.Len != 7 || rec.Flags&rvma.FlagPartial == 0 || string(mem3[100:107]) != "partial" {
		t.Fatalf("IncEpoch: %+v %v", rec, err)
	}
	if r, _ := p3.Load(); r != rec {
		t.Fatalf("Load %+v, IncEpoch %+v", r, rec)
	}

	// A closed window: puts fail with the NACK, counted at the receiver;
	// with CloseSilent they succeed and are counted as drops.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := ep.Put(ctx, self, mb, 0, []byte("late"))
		if errors.Is(err, rvma.ErrMailboxClosed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("put to a closed window: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the close notice is on its way
	}
	for w.Stats().Nacks == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := w.Stats().Nacks; n != 1 {
		t.Fatalf("receiver counted %d NACKs", n)
	}
	const mb4 = rvma.Mailbox(0x4)
	w4, _ := ep.InitWindow(mb4, &rvma.WindowOptions{CloseMode: rvma.CloseSilent})
	mem4, _ := ep.Alloc(4096)
	w4.Post(ctx, mem4, nil)
	if err := ep.Put(ctx, self, mb4, 0, []byte("before")); err != nil {
		t.Fatal(err)
	}
	w4.Close()
	time.Sleep(50 * time.Millisecond)
	if err := ep.Put(ctx, self, mb4, 0, []byte("after")); err != nil {
		t.Fatalf("put to a silently closed window: %v", err)
	}
	for w4.Stats().Drops == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s := w4.Stats(); s.Drops != 1 || string(mem4[:6]) != "before" {
		t.Fatalf("silent close: stats %+v, bytes %q", s, mem4[:6])
	}
	t.Logf("no buffer, IncEpoch, NACK and silent close right; endpoint %+v", ep.Stats())
}

// TestLabEndpointCloseUnderUse: an endpoint closed while goroutines spin
// on and wait for its buffers, with puts waiting for a buffer: Spin, Wait
// and the puts return ErrClosed, Load stays safe afterwards (a counted
// window's records are unmapped by then), and nothing faults or hangs.
func TestLabEndpointCloseUnderUse(t *testing.T) {
	ep := labListen(t, 7479, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const mb = rvma.Mailbox(0x7)
	_, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 4}, 3, 3, 4096)
	for i := 0; i < 6; i++ { // epoch 0 completes, epoch 1 half
		if err := ep.Put(ctx, ep.Addr(), mb, uint64(i*8), pattern(8, byte(i))); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 2)
	go func() { _, err := posted[1].Spin(ctx); errs <- err }()
	go func() { _, err := posted[2].Wait(ctx); errs <- err }()
	// Puts waiting for a buffer of a window that has none.
	const empty = rvma.Mailbox(0x8)
	if _, err := ep.InitWindow(empty, &rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 1}); err != nil {
		t.Fatal(err)
	}
	ops := make([]*rvma.PutOp, 16)
	for i := range ops {
		ops[i] = ep.PutAsync(ctx, ep.Addr(), empty, 0, pattern(8, 0))
	}
	time.Sleep(50 * time.Millisecond)
	if err := ep.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; !errors.Is(err, rvma.ErrClosed) {
			t.Errorf("spin or wait across Close: %v, want ErrClosed", err)
		}
	}
	for i, op := range ops {
		if err := op.Wait(ctx); !errors.Is(err, rvma.ErrClosed) {
			t.Errorf("put %d waiting for a buffer across Close: %v, want ErrClosed", i, err)
		}
	}
	if r, ok := posted[0].Load(); ok && r.Ops != 4 {
		t.Errorf("epoch 0 after Close: %+v", r)
	}
	for _, p := range posted[1:] {
		if r, ok := p.Load(); ok && r.Flags&rvma.FlagClosed == 0 {
			t.Errorf("a buffer pending at Close loads %+v", r)
		}
	}
}

// TestLabEndpointReopenAndLinger: a closed window's mailbox lingers
// (late puts get the NACK), is taken again at once by InitWindow (puts
// find the new window, the old buffer is untouched), and is freed when its
// linger ends (puts then fail with ErrNoMailbox); opening and closing one
// mailbox many times leaves no slot behind.
func TestLabEndpointReopenAndLinger(t *testing.T) {
	ep := labListen(t, 7475, nil)
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// putUntil puts until the outcome satisfies ok: a sender learns of a
	// close or a free by a notice that may still be on its way.
	putUntil := func(mb rvma.Mailbox, data []byte, what string, ok func(error) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := ep.Put(ctx, self, mb, 0, data)
			if ok(err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: put: %v", what, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	isClosed := func(err error) bool { return errors.Is(err, rvma.ErrMailboxClosed) }

	const mb = rvma.Mailbox(0x5)
	w1, err := ep.InitWindow(mb, &rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	mem1, _ := ep.Alloc(4096)
	p1, _ := w1.Post(ctx, mem1, nil)
	if err := ep.Put(ctx, self, mb, 0, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if _, err := p1.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	w1.Close()
	putUntil(mb, []byte("late"), "closed window", isClosed)

	// Reopened while lingering: puts reach the new window.
	w2, err := ep.InitWindow(mb, &rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 1})
	if err != nil {
		t.Fatalf("init on a lingering mailbox: %v", err)
	}
	mem2, _ := ep.Alloc(4096)
	p2, _ := w2.Post(ctx, mem2, nil)
	// Until the old window's last notice arrives, the sender may still
	// see it closed.
	isNil := func(err error) bool { return err == nil }
	putUntil(mb, []byte("second"), "reopened mailbox", isNil)
	rec, err := p2.Wait(ctx)
	if err != nil || rec.Ops != 1 || string(mem2[:6]) != "second" {
		t.Fatalf("reopened window: record %+v %v, bytes %q", rec, err, mem2[:6])
	}
	if string(mem1[:5]) != "first" {
		t.Fatalf("the closed window's buffer changed: %q", mem1[:5])
	}
	if n := len(ep.Windows()); n != 1 {
		t.Fatalf("%d windows after reopening one mailbox, want 1", n)
	}

	// Many cycles on one mailbox: every put lands in the window of its
	// cycle, and no slot stays behind.
	w2.Close()
	for i := 0; i < 40; i++ {
		w, err := ep.InitWindow(mb, &rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 1})
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		m, _ := ep.Alloc(64)
		p, _ := w.Post(ctx, m, nil)
		want := []byte{'c', byte(i)}
		putUntil(mb, want, "cycle", isNil)
		if rec, err := p.Wait(ctx); err != nil || !bytes.Equal(m[:2], want) || rec.Ops != 1 {
			t.Fatalf("cycle %d: record %+v %v, bytes %q", i, rec, err, m[:2])
		}
		w.Close()
	}
	if n := len(ep.Windows()); n != 1 {
		t.Fatalf("%d windows after 40 cycles on one mailbox, want 1 (lingering)", n)
	}

	// The linger ends: the mailbox is gone, puts fail with ErrNoMailbox;
	// a window without linger (negative) is freed at once. A GuardNone
	// window's buffers, handed over bound, are unbound when it is freed.
	for _, o := range []rvma.WindowOptions{
		{Kind: rvma.EpochOps, Threshold: 1, Linger: 300 * time.Millisecond},
		{Kind: rvma.EpochOps, Threshold: 1, Linger: -1, Guard: rvma.GuardNone},
	} {
		mbL := rvma.Mailbox(0x6)
		w, err := ep.InitWindow(mbL, &o)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := ep.Alloc(64)
		p, _ := w.Post(ctx, m, nil)
		if err := ep.Put(ctx, self, mbL, 0, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		w.Close()
		putUntil(mbL, []byte("y"), "freed window", func(err error) bool { return errors.Is(err, rvma.ErrNoMailbox) })
		if m[0] != 'x' {
			t.Fatalf("linger %v: buffer changed after close: %q", o.Linger, m[:1])
		}
		for _, w := range ep.Windows() {
			if w.Mailbox() == mbL {
				t.Fatalf("linger %v: mailbox still listed after its linger", o.Linger)
			}
		}
	}
	t.Logf("reopen, 40 cycles and linger right; endpoint %+v", ep.Stats())
}

func TestLabEndpointMisuse(t *testing.T) {
	labenv.Device(t)
	ctx := context.Background()
	if _, err := rvma.Listen(ctx, netip.MustParseAddrPort("0.0.0.0:7473"), nil); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("unspecified address: %v", err)
	}
	if _, err := rvma.Listen(ctx, netip.AddrPortFrom(netip.MustParseAddr(labenv.Addr()), 7473), &rvma.EndpointOptions{Stripes: 99}); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("99 stripes: %v", err)
	}
	ep := labListen(t, 7473, nil)
	if _, err := rvma.Listen(ctx, ep.Addr(), nil); err == nil {
		t.Fatal("second endpoint on the same address")
	}
	if _, err := ep.Alloc(0); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("Alloc(0): %v", err)
	}
	w, _ := ep.InitWindow(9, &rvma.WindowOptions{})
	if _, err := ep.InitWindow(9, &rvma.WindowOptions{}); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("second window on a mailbox: %v", err)
	}
	if _, err := w.Post(ctx, make([]byte, 64), nil); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("post of Go memory: %v", err)
	}
	if _, err := w.Post(ctx, nil, nil); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("post of nothing: %v", err)
	}
	wt, _ := ep.InitWindow(10, &rvma.WindowOptions{Threshold: 500})
	small, _ := ep.Alloc(100)
	if _, err := wt.Post(ctx, small, nil); !errors.Is(err, rvma.ErrTooLarge) {
		t.Fatalf("threshold beyond the buffer: %v", err)
	}
	if _, err := ep.InitWindow(11, &rvma.WindowOptions{Kind: rvma.EpochOps}); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("ops window without a threshold: %v", err)
	}
	if _, err := ep.InitWindow(12, &rvma.WindowOptions{Counting: 7}); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("counting 7: %v", err)
	}
	if _, err := ep.InitWindow(12, &rvma.WindowOptions{Counting: rvma.CountModule, Guard: rvma.GuardNone}); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("CountModule with GuardNone: %v", err)
	}
	// CountModule needs an endpoint the module counts.
	_, err := ep.InitWindow(12, &rvma.WindowOptions{Counting: rvma.CountModule})
	if module := ep.Counting() == rvma.CountModule; module && err != nil || !module && !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("CountModule on an endpoint counting with %v: %v", ep.Counting(), err)
	}
	// A peer that is not there: the dial fails within its timeout.
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = ep.Put(short, netip.AddrPortFrom(ep.Addr().Addr(), 7999), 9, 0, []byte("x"))
	if !errors.Is(err, rvma.ErrPeerGone) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("put to nobody: %v", err)
	}
	ep.Close()
	if err := ep.Put(ctx, ep.Addr(), 9, 0, []byte("x")); !errors.Is(err, rvma.ErrClosed) {
		t.Fatalf("put after Close: %v", err)
	}
	if _, err := ep.Alloc(10); !errors.Is(err, rvma.ErrClosed) {
		t.Fatalf("Alloc after Close: %v", err)
	}
	t.Logf("misuse errors right")
}

// TestLabEndpointWindowAPI is the receiver's API on real memory windows:
// completion pointers, one-time buffers, release and re-post through the
// rewind ring, Spin, waits across Close, and many goroutines waiting and
// releasing while puts stream in.
func TestLabEndpointWindowAPI(t *testing.T) {
	ep := labListen(t, 7474, &rvma.EndpointOptions{Stripes: 2})
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const mb = rvma.Mailbox(0x51)
	w, _ := ep.InitWindow(mb, &rvma.WindowOptions{Keep: 1})
	mem, _ := ep.Alloc(256 + 64)
	p, err := w.Post(ctx, mem[:256], nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Completion().Addr()%rvma.CompletionSize != 0 {
		t.Fatal("completion pointer not cache-line aligned")
	}
	if _, ok := p.Load(); ok {
		t.Fatal("record before completion")
	}
	ep.Put(ctx, self, mb, 0, pattern(200, 1))
	ep.Put(ctx, self, mb, 200, pattern(56, 2))
	rec, err := p.Spin(ctx)
	want := rvma.Record{Epoch: 0, Addr: uint64(uintptrOf(mem)), Len: 256, Ops: 2, Cap: 256}
	if err != nil || rec != want {
		t.Fatalf("Spin: %+v %v, want %+v", rec, err, want)
	}
	if r, ok := p.Completion().Load(); !ok || r != want || w.Epoch() != 1 || p.Epoch() != 0 {
		t.Fatalf("completion pointer %+v, epoch %d", r, w.Epoch())
	}
	// Released while in the rewind ring: kept; the next epoch pushes it
	// out and it is re-posted, and Wait refers to its new epoch.
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("double release: %v", err)
	}
	q, _ := w.Post(ctx, mem[256:], &rvma.PostOptions{OneTime: true})
	if err := ep.Put(ctx, self, mb, 0, pattern(64, 3)); err != nil {
		t.Fatal(err)
	}
	if r, err := q.Wait(ctx); err != nil || r.Flags != rvma.FlagOneTime || r.Epoch != 1 {
		t.Fatalf("one-time: %+v %v", r, err)
	}
	for deadline := time.Now().Add(5 * time.Second); p.Epoch() != 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if p.Epoch() != 2 {
		t.Fatalf("re-posted buffer holds epoch %d, want 2", p.Epoch())
	}
	if _, ok := p.Load(); ok {
		t.Fatal("re-posted buffer reports its old record as its own")
	}
	if r, _ := p.Completion().Load(); r.Epoch != 0 {
		t.Fatal("the completion pointer keeps the last record until the next one")
	}
	if err := ep.Put(ctx, self, mb, 0, pattern(256, 4)); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Wait(ctx); err != nil || r.Epoch != 2 || !bytes.Equal(mem[:256], pattern(256, 4)) {
		t.Fatalf("re-posted epoch: %+v %v", r, err)
	}
	if rw := w.Rewind(3); len(rw) != 1 || rw[0].Epoch != 2 {
		t.Fatalf("rewind %+v", rw)
	}
	if s := w.Stats(); s.EpochsCompleted != 3 || s.Held != 2 || s.Posted != 0 {
		t.Fatalf("stats %+v", s)
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Wait(ctx); !errors.Is(err, rvma.ErrInvalid) {
		t.Fatalf("wait on a released one-time buffer: %v", err)
	}

	// Waits across Close; the window refuses everything afterwards.
	w2, _ := ep.InitWindow(0x52, &rvma.WindowOptions{})
	m2, _ := ep.Alloc(100)
	p2, _ := w2.Post(ctx, m2, nil)
	ep.Put(ctx, self, 0x52, 0, []byte("some"))
	waitErr := make(chan error, 1)
	go func() { _, err := p2.Wait(ctx); waitErr <- err }()
	w2.Close()
	if err := w2.Close(); err != nil {
		t.Fatal("second Close")
	}
	if err := <-waitErr; !errors.Is(err, rvma.ErrClosed) {
		t.Fatalf("wait across Close: %v", err)
	}
	if r, _ := p2.Load(); r.Len != 4 || r.Flags&rvma.FlagClosed == 0 {
		t.Fatalf("record of the closed buffer: %+v", r)
	}
	if _, err := w2.Post(ctx, m2, nil); !errors.Is(err, rvma.ErrClosed) {
		t.Fatal(err)
	}
	if _, err := w2.IncEpoch(ctx); !errors.Is(err, rvma.ErrClosed) {
		t.Fatal(err)
	}

	// Many waiters releasing while one sender streams 50 epochs of 4 ops.
	// Which buffer takes which epoch depends on when each waiter releases
	// (three buffers can carry the stream alone while the fourth waiter is
	// not scheduled; the first waiter is made slow to have that happen), so
	// the waiters run until Close ends their waits, and every epoch must
	// have been seen exactly once. The slow waiter may release its buffer
	// after Close: its next Wait must return ErrClosed, not block.
	const epochs = 50
	w3, _ := ep.InitWindow(0x53, &rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 4, Keep: 2})
	m3, _ := ep.Alloc(4 * 64)
	var wg sync.WaitGroup
	var seenMu sync.Mutex
	seen := map[uint64]int{}
	for i := 0; i < 4; i++ {
		p, err := w3.Post(ctx, m3[i*64:(i+1)*64], nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r, err := p.Wait(ctx)
				if errors.Is(err, rvma.ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if r.Ops != 4 || r.Len != 64 {
					t.Errorf("record %+v", r)
				}
				seenMu.Lock()
				seen[r.Epoch]++
				seenMu.Unlock()
				if i == 0 {
					time.Sleep(3 * time.Millisecond)
				}
				if err := p.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var ops []*rvma.PutOp
	for e := 0; e < epochs; e++ {
		for i := 0; i < 4; i++ {
			ops = append(ops, ep.PutAsync(ctx, self, 0x53, uint64(i*16), pattern(16, byte(e))))
		}
	}
	for _, op := range ops {
		if err := op.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The last epoch's waiter may not have been woken yet: give every
	// waiter its record before Close turns the rest into ErrClosed
	// (a put completes at its sender before the receiver counts it).
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		seenMu.Lock()
		n := len(seen)
		seenMu.Unlock()
		if n == epochs {
			break
		}
	}
	w3.Close() // the waiters' buffers have no next epoch
	wg.Wait()
	if s := w3.Stats(); s.EpochsCompleted != epochs || s.Puts != 4*epochs || s.Late != 0 {
		t.Fatalf("stats %+v", s)
	}
	for e := uint64(0); e < epochs; e++ {
		if seen[e] != 1 {
			t.Errorf("epoch %d seen by %d waiters, want 1", e, seen[e])
		}
	}
	t.Logf("window API on real windows: completion pointers, one-time buffers, rewind and re-post, Spin, Close, %d streamed epochs with 4 waiters", epochs)
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// checkMetrics scrapes a Collector for ep and compares the metrics named in
// want (window metrics for mailbox mb, endpoint metrics for ep).
func checkMetrics(t *testing.T, ep *rvma.Endpoint, mb rvma.Mailbox, want map[string]float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(rvma.NewCollector(ep))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["endpoint"] != ep.Addr().String() || (labels["mailbox"] != "" && labels["mailbox"] != mb.String()) {
				continue
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			got[mf.GetName()] = v
		}
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("metric %s = %v (present %v), want %v", name, g, ok, w)
		}
	}
}

// TestLabEndpointNotices streams epochs from the one sender of a window:
// it moves on by its own count, so the receiver pushes its entry only when
// the sender is about to run out of descriptors, and always, at once,
// after an IncEpoch, which the sender cannot count: its next put goes to
// the next epoch without being refused. With MaxDescs+1 buffers posted
// the sender sees MaxDescs generations (one buffer is the application's)
// and is pushed once every MaxDescs-1 epochs; with 24 posted, a window
// the module counts describes all 23 (Entry.Through) and pushes once every
// 22 epochs, while one the library counts still describes MaxDescs.
func TestLabEndpointNotices(t *testing.T) {
	ep := labListen(t, 7478, &rvma.EndpointOptions{Stripes: 2})
	for i, buffers := range []int{wire.MaxDescs + 1, 24} {
		t.Run(fmt.Sprintf("%d buffers", buffers), func(t *testing.T) {
			labNotices(t, ep, rvma.Mailbox(0xABCD0077+i), buffers)
		})
	}
}

func labNotices(t *testing.T, ep *rvma.Endpoint, mb rvma.Mailbox, buffers int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const size, epochs = 64, 80
	w, err := ep.InitWindow(mb, &rvma.WindowOptions{Threshold: size})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	arena, err := ep.Alloc(buffers * size)
	if err != nil {
		t.Fatal(err)
	}
	var posted []*rvma.Posted
	for i := 0; i < buffers; i++ {
		p, err := w.Post(ctx, arena[i*size:(i+1)*size], nil)
		if err != nil {
			t.Fatal(err)
		}
		posted = append(posted, p)
	}
	src, err := ep.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	recv := func(gen int, want []byte) {
		t.Helper()
		p := posted[gen%len(posted)]
		rec, err := p.Wait(ctx)
		if err != nil {
			t.Fatalf("epoch %d: %v", gen, err)
		}
		if rec.Epoch != uint64(gen) || rec.Len != uint64(len(want)) || !bytes.Equal(p.Bytes()[:len(want)], want) {
			t.Fatalf("epoch %d: record %+v, bytes %x; want %d bytes %x", gen, rec, p.Bytes()[:len(want)], len(want), want)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var total uint64    // bytes put so far
	counted := func() { // the receiver has counted every byte put (IncEpoch takes what is counted)
		t.Helper()
		if ep.Counting() == rvma.CountModule {
			return // the module counts a byte as it places it, before the put completes
		}
		for w.Stats().Bytes != total {
			if ctx.Err() != nil {
				t.Fatalf("window stats %+v: not all of %d bytes counted", w.Stats(), total)
			}
			time.Sleep(time.Millisecond)
		}
	}
	gen := 0
	if err := ep.Put(ctx, ep.Addr(), mb, 0, src[:1]); err != nil { // resolves: the first notice
		t.Fatal(err)
	}
	total++
	counted()
	if _, err := w.IncEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	if err := posted[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	gen++
	before := ep.Stats().Notices
	for ; gen <= epochs; gen++ {
		want := pattern(size, byte(gen))
		copy(src, want)
		if err := ep.Put(ctx, ep.Addr(), mb, 0, src); err != nil {
			t.Fatalf("put %d: %v", gen, err)
		}
		total += size
		recv(gen, want)
	}
	sent := ep.Stats().Notices - before
	seen := buffers - 1 // generations the sender is shown
	if ep.Counting() == rvma.CountLibrary {
		seen = min(seen, wire.MaxDescs)
	}
	t.Logf("%d epochs from one sender, %d buffers posted: %d notices", epochs, buffers, sent)
	// Where a notice can land after the put that follows it (see
	// stalePutSlack), each stale put adds the notices that replace its
	// stripe's.
	if want := uint64(epochs/(seen-1)+2) + stalePutSlack(ep.Stats().StalePuts, seen); sent > want {
		t.Errorf("%d notices for %d epochs of one sender; want at most %d (one every %d epochs)", sent, epochs, want, seen-1)
	}
	// An epoch ended by IncEpoch: the sender learns it from a notice and
	// puts its next bytes into the next epoch.
	for i := 0; i < 3; i++ {
		copy(src, pattern(size/2, byte(gen)))
		if err := ep.Put(ctx, ep.Addr(), mb, 0, src[:size/2]); err != nil {
			t.Fatal(err)
		}
		total += size / 2
		counted()
		rec, err := w.IncEpoch(ctx)
		if err != nil || rec.Epoch != uint64(gen) || rec.Len != size/2 {
			t.Fatalf("IncEpoch: %+v, %v; want epoch %d with %d bytes", rec, err, gen, size/2)
		}
		recv(gen, pattern(size/2, byte(gen)))
		gen++
		want := pattern(size, byte(gen))
		copy(src, want)
		if err := ep.Put(ctx, ep.Addr(), mb, 0, src); err != nil {
			t.Fatalf("put after IncEpoch: %v", err)
		}
		total += size
		recv(gen, want)
		gen++
	}
	if st := w.Stats(); st.Late != 0 {
		t.Errorf("window stats %+v: late bytes", st)
	}
	if st := ep.Stats(); st.StalePuts != 0 && labenv.InlineLoopback() {
		// IncEpoch pushes its entry before it returns, and this rxe
		// places it before the post returns. A put refused as stale
		// would also cost its stripe, whose replacement pushes every
		// entry again (the notices above).
		t.Errorf("endpoint stats %+v: a put after IncEpoch was refused as stale", st)
	}
}

// stalePutSlack is how many more notices a one-guest test allows for
// stale puts, the sender being shown seen generations: none where rxe
// places a notice before its post returns (labenv.InlineLoopback), where
// a put can go stale only by a bug; elsewhere a notice and the put after
// it race as they would on a NIC, and each stale put costs its stripe.
// Around the replacement come the notice lost with the stripe, the
// pushes owed while no stripe of the link was live, and the repush of
// every seen entry, MaxDescs to a notice; how many of these land depends
// on timing, so each stale put is allowed twice the repush and the lost
// notice (four for up to MaxDescs entries, ten for 23). Runs of 6.12
// had 11 notices for 80 epochs with 23 seen and two stale puts, and 21
// with 7 seen and two stale puts (15 without): either way far from the
// one notice per epoch the test guards against.
func stalePutSlack(stale uint64, seen int) uint64 {
	if labenv.InlineLoopback() {
		return 0
	}
	return stale * 2 * uint64((seen+wire.MaxDescs-1)/wire.MaxDescs+1)
}
