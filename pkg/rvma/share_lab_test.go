//go:build lab

package rvma_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// TestLabEndpointShare is TestLabEndpointSpinTwoSenders's exchange on a
// window that promises each sender's share (WindowOptions.Share): each
// sender moves to the next epoch by its own count once it put its half,
// so no put is ever stale and the receiver pushes an entry only when the
// senders run short of descriptors, not at every move of the head.
func TestLabEndpointShare(t *testing.T) {
	recv := labListen(t, 7494, nil)
	senders := []*rvma.Endpoint{labListen(t, 7495, nil), labListen(t, 7496, nil)}
	const mb, size, buffers, epochs = rvma.Mailbox(0x5A1D0002), 256, wire.MaxDescs + 1, 30
	_, _, posted := openPosted(t, recv, mb, rvma.WindowOptions{Threshold: 2 * size, Share: size}, buffers, buffers, 2*size)
	fillTogether(t, recv, senders, mb, posted, size, epochs, (*rvma.Posted).Wait)
	// A sender is pushed an entry when it resolves the window and when it
	// is down to its last descriptor: about one per MaxDescs-1 epochs.
	stale := senders[0].Stats().StalePuts + senders[1].Stats().StalePuts
	notices := recv.Stats().Notices
	t.Logf("%d epochs: %d notices, %d stale puts", epochs, notices, stale)
	if stale != 0 {
		t.Errorf("%d stale puts, want none: each sender knows when it is done with an epoch", stale)
	}
	if limit := uint64(2 * (epochs/(wire.MaxDescs-2) + 2)); notices > limit {
		t.Errorf("%d notices for %d epochs of two senders, want at most %d", notices, epochs, limit)
	}
}

// TestLabEndpointShareBroken breaks the promise: one sender puts a whole
// epoch in one put, so the other's share finds the epoch completed. Its
// put is refused as stale and retried into the next epoch; no buffer
// loses or gains a byte it should not.
func TestLabEndpointShareBroken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recv := labListen(t, 7497, nil)
	a, b := labListen(t, 7498, nil), labListen(t, 7499, nil)
	// Buffers of four shares, epochs of two: a puts at 0, b at 2*size.
	const mb, size = rvma.Mailbox(0x5A1D0003), 256
	w, _, posted := openPosted(t, recv, mb, rvma.WindowOptions{Threshold: 2 * size, Share: size}, 4, 4, 4*size)
	srcA, err := a.Alloc(2 * size)
	if err != nil {
		t.Fatal(err)
	}
	srcB, err := b.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	put := func(ep *rvma.Endpoint, off uint64, src []byte, seed byte) {
		t.Helper()
		copy(src, pattern(len(src), seed))
		if err := ep.Put(ctx, recv.Addr(), mb, off, src); err != nil {
			t.Fatalf("put of %d bytes at %d: %v", len(src), off, err)
		}
	}
	take := func(e int, want map[uint64][]byte) {
		t.Helper()
		p := posted[e]
		rec, err := p.Wait(ctx)
		if err != nil {
			t.Fatalf("epoch %d: %v", e, err)
		}
		if rec.Epoch != uint64(e) || rec.Len != 2*size || rec.Flags&rvma.FlagLate != 0 {
			t.Fatalf("epoch %d: record %+v", e, rec)
		}
		got := p.Bytes()
		for off, w := range want {
			if !bytes.Equal(got[off:off+uint64(len(w))], w) {
				t.Fatalf("epoch %d: bytes at %d are %x..., want %x...", e, off, got[off:off+8], w[:8])
			}
		}
		if untouched := got[2*size:]; len(want) == 1 && !bytes.Equal(untouched, make([]byte, 2*size)) {
			t.Fatalf("epoch %d: bytes beyond a's put changed", e)
		}
	}
	// Both resolve the window and fill epoch 0 as promised.
	put(a, 0, srcA[:size], 1)
	put(b, 2*size, srcB, 2)
	take(0, map[uint64][]byte{0: pattern(size, 1), 2 * size: pattern(size, 2)})
	// a puts two shares at once: epoch 1 completes without b.
	put(a, 0, srcA, 3)
	take(1, map[uint64][]byte{0: pattern(2*size, 3)})
	// b's share still targets epoch 1 by its own count: refused, and
	// retried into epoch 2, which a completes.
	put(b, 2*size, srcB, 4)
	put(a, 0, srcA[:size], 5)
	take(2, map[uint64][]byte{0: pattern(size, 5), 2 * size: pattern(size, 4)})
	if got := b.Stats().StalePuts; got != 1 {
		t.Fatalf("b: %d stale puts, want 1", got)
	}
	if got := a.Stats().StalePuts; got != 0 {
		t.Fatalf("a: %d stale puts, want 0", got)
	}
	if recv.Counting() == rvma.CountModule {
		deadline := time.Now().Add(10 * time.Second)
		for w.Stats().Stale != 1 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if st := w.Stats(); st.Stale != 1 {
			t.Fatalf("the receiver counted %d stale puts, want b's one (%+v)", st.Stale, st)
		}
	}
}
