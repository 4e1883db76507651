//go:build lab

package rvma

// The endpoint's own machinery fails: its loopback bind QP is forced into
// the error state, so the unbind that guards a completed epoch fails. The
// endpoint must stop instead of leaving the epoch waiting for an unbind
// that never completes. (When the kernel module counts, the module guards
// the epoch and publishes it before any unbind: the epoch is complete, and
// Wait reports it whole, with ErrFailed if the failure came first.)
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
	ep := guestListen(t, guestPort+40, &Options{Stripes: 1})
	const mb = Mailbox(0xFA11ED)
	w, err := ep.InitWindow(mb, WindowOptions{Kind: EpochBytes})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := ep.Alloc(2 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	p0, err := w.Post(mem[:4096], nil)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := w.Post(mem[4096:], nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := bytes.Repeat([]byte{0xA5}, 100)
	if err := ep.Put(ctx, ep.Addr(), mb, 0, first); err != nil {
		t.Fatal(err)
	}
	if err := ep.e.bindQP.ToError(); err != nil {
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
	if r, err := p1.Wait(ctx); !errors.Is(err, ErrFailed) || r.Epoch != 1 || r.Len != 0 {
		t.Fatalf("Wait on the next buffer: %+v, %v; want ErrFailed, empty", r, err)
	}
	if err := ep.Err(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Endpoint.Err: %v", err)
	} else {
		t.Logf("Endpoint.Err: %v", err)
	}
	for what, err := range map[string]error{
		"Put":        ep.Put(ctx, ep.Addr(), mb, 0, first),
		"InitWindow": func() error { _, err := ep.InitWindow(mb+1, WindowOptions{}); return err }(),
		"Alloc":      func() error { _, err := ep.Alloc(4096); return err }(),
		"Post":       func() error { _, err := w.Post(mem[:4096], nil); return err }(),
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
