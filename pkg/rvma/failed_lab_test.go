//go:build lab

package rvma

// The endpoint's own machinery fails: its loopback bind QP is forced into
// the error state, so the unbind that guards a completed epoch fails. The
// endpoint must stop instead of leaving the epoch waiting for an unbind
// that never completes. (When the kernel module counts, the module guards
// the epoch and publishes it before any unbind: the epoch is complete, and
// Wait reports it whole, with ErrFailed if the failure came first. Nor
// does any later epoch need a bind: senders write through the window's
// mailbox key. The failure shows when a window the library counts binds a
// memory window: then the endpoint fails as it does here when the library
// counts.)
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabEndpointFailed -test.v

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

func TestLabEndpointFailed(t *testing.T) {
	labenv.Device(t)
	ep := guestListen(t, guestPort+40, &EndpointOptions{Stripes: 1})
	const mb = Mailbox(0xFA11ED)
	w, err := ep.InitWindow(mb, &WindowOptions{Kind: EpochBytes})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := ep.Alloc(2 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	p0, err := w.Post(context.Background(), mem[:4096], nil)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := w.Post(context.Background(), mem[4096:], nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := bytes.Repeat([]byte{0xA5}, 100)
	if err := ep.Put(ctx, ep.Addr(), mb, 0, first); err != nil {
		t.Fatal(err)
	}
	if err := ep.e.mem.bindQP.ToError(); err != nil {
		t.Fatal(err)
	}
	// The rest of epoch 0: the window completes it and asks for the
	// unbind, which fails. The put itself may land first or fail with
	// the links.
	err = ep.Put(ctx, ep.Addr(), mb, 100, make([]byte, 3996))
	t.Logf("the put that completes the epoch: %v", err)

	start := time.Now()
	r, err := p0.Wait(ctx)
	t.Logf("Wait returned after %v: %+v, %v", time.Since(start), r, err)
	if ep.Counting() == CountModule {
		if (err != nil && !errors.Is(err, ErrFailed)) || r.Epoch != 0 || r.Len != 4096 || r.Flags&FlagClosed != 0 {
			t.Fatalf("Wait on the epoch the module completed: %+v, %v; want it whole", r, err)
		}
	} else if !errors.Is(err, ErrFailed) || r.Flags&FlagFailed == 0 || r.Epoch != 0 || r.Len < 100 {
		t.Fatalf("Wait on the epoch whose unbind failed: %+v, %v; want ErrFailed with FlagFailed", r, err)
	}
	if !bytes.Equal(mem[:100], first) {
		t.Fatal("the first put's bytes changed")
	}
	if ep.Counting() == CountModule {
		untilBindFails(ctx, t, ep, mb, []*Posted{p0, p1})
	} else if r, err := p1.Wait(ctx); !errors.Is(err, ErrFailed) || r.Epoch != 1 || r.Len != 0 {
		t.Fatalf("Wait on the next buffer: %+v, %v; want ErrFailed, empty", r, err)
	}
	if err := ep.Err(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Endpoint.Err: %v", err)
	} else {
		t.Logf("Endpoint.Err: %v", err)
	}
	for what, err := range map[string]error{
		"Put":        ep.Put(ctx, ep.Addr(), mb, 0, first),
		"InitWindow": func() error { _, err := ep.InitWindow(mb+1, &WindowOptions{}); return err }(),
		"Alloc":      func() error { _, err := ep.Alloc(4096); return err }(),
		"Post":       func() error { _, err := w.Post(ctx, mem[:4096], nil); return err }(),
		"IncEpoch":   func() error { _, err := w.IncEpoch(ctx); return err }(),
	} {
		if !errors.Is(err, ErrFailed) {
			t.Errorf("%s after the failure: %v, want ErrFailed", what, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Errorf("Window.Close: %v", err)
	}
	if err := ep.Close(); err != nil {
		t.Errorf("Endpoint.Close: %v", err)
	}
	if err := ep.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// untilBindFails goes on with whole epochs of ps (p0 holds epoch 0,
// handed over; the others are pending, in turn): the module's windows
// need no bind, so the broken bind queue pair does not stop them. Then a
// window the library counts posts a buffer, whose memory window bind
// fails the endpoint.
func untilBindFails(ctx context.Context, t *testing.T, ep *Endpoint, mb Mailbox, ps []*Posted) {
	t.Helper()
	extra, err := ep.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	full := bytes.Repeat([]byte{0x5A}, 4096)
	if err := ps[0].Release(ctx); err != nil {
		t.Fatalf("Release of epoch 0: %v", err)
	}
	for epoch := uint64(1); epoch <= 20; epoch++ {
		p := ps[epoch%uint64(len(ps))]
		putErr := ep.Put(ctx, ep.Addr(), mb, 0, full)
		r, err := p.Wait(ctx)
		if putErr != nil || err != nil || r.Epoch != epoch || r.Len != 4096 || !bytes.Equal(p.Bytes(), full) {
			t.Fatalf("epoch %d without binds: put %v, Wait %+v, %v", epoch, putErr, r, err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatalf("Release of epoch %d: %v", epoch, err)
		}
	}
	if ep.Err() != nil {
		t.Fatalf("the endpoint failed without a bind: %v", ep.Err())
	}
	lw, err := ep.InitWindow(mb+2, &WindowOptions{Kind: EpochBytes, Counting: CountLibrary})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lw.Post(ctx, extra, nil); err != nil && !errors.Is(err, ErrFailed) {
		t.Fatalf("Post to a window the library counts: %v", err)
	}
	// The endpoint fails every window: the next epoch is handed over
	// failed, empty.
	if r, err := ps[21%len(ps)].Wait(ctx); !errors.Is(err, ErrFailed) || r.Epoch != 21 || r.Len != 0 {
		t.Fatalf("Wait on the next buffer after the failed bind: %+v, %v; want ErrFailed, empty", r, err)
	}
}
