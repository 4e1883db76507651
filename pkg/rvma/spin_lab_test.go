//go:build lab

package rvma_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
)

// TestLabEndpointSpinTwoSenders is a halo exchange's receiving side: two
// senders fill every epoch of one window together, and the receiver
// takes each epoch with Spin and releases it before the next. Neither
// sender can tell by its own count that an epoch completed, so each must
// be told before its next put, or that put goes to the completed epoch
// and is refused (a stale put, which costs its stripe). The receiver's
// spin keeps its progress loop parked, so the spin and Release must send
// the notices themselves, and at once. Before they did, a stale put and
// its stripe's replacement came every second epoch, and a notice storm
// (every retry of a push that could not reach one sender re-sent it to
// both) 40 notices an epoch; docs/rvma.md, Plan 9.
func TestLabEndpointSpinTwoSenders(t *testing.T) {
	recv := labListen(t, 7491, nil)
	senders := []*rvma.Endpoint{labListen(t, 7492, nil), labListen(t, 7493, nil)}
	const mb, size, buffers, epochs = rvma.Mailbox(0x5A1D0001), 256, 4, 30
	_, _, posted := openPosted(t, recv, mb, rvma.WindowOptions{Threshold: 2 * size}, buffers, buffers, 2*size)
	fillTogether(t, recv, senders, mb, posted, size, epochs, (*rvma.Posted).Spin)
	// One notice per sender and epoch (the head's move) and one each when
	// it resolved; a rare stale put is allowed (a notice and a put may
	// take different stripes), not one every second epoch.
	stale := senders[0].Stats().StalePuts + senders[1].Stats().StalePuts
	notices := recv.Stats().Notices
	t.Logf("%d epochs: %d notices, %d stale puts", epochs, notices, stale)
	if stale > 2 {
		t.Errorf("%d stale puts in %d epochs, want at most 2", stale, epochs)
	}
	if limit := uint64(2*epochs + 8); notices > limit {
		t.Errorf("%d notices for %d epochs of two senders, want at most %d", notices, epochs, limit)
	}
}

// fillTogether has each sender put size bytes into every epoch of the
// window at mb, sender i at offset i*size, and takes each epoch from the
// posted buffers in turn with wait, checking its record and bytes before
// releasing the buffer.
func fillTogether(t *testing.T, recv *rvma.Endpoint, senders []*rvma.Endpoint, mb rvma.Mailbox, posted []*rvma.Posted, size, epochs int,
	wait func(*rvma.Posted, context.Context) (rvma.Record, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srcs := make([][]byte, len(senders))
	for i, ep := range senders {
		b, err := ep.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		srcs[i] = b
	}
	n := uint64(len(senders))
	for e := 0; e < epochs; e++ {
		var ops []*rvma.PutOp
		for i, ep := range senders {
			copy(srcs[i], pattern(size, byte(e*len(senders)+i)))
			ops = append(ops, ep.PutAsync(ctx, recv.Addr(), mb, uint64(i*size), srcs[i]))
		}
		p := posted[e%len(posted)]
		rec, err := wait(p, ctx)
		if err != nil {
			t.Fatalf("epoch %d: %v (receiver %+v)", e, err, recv.Stats())
		}
		if rec.Epoch != uint64(e) || rec.Len != n*uint64(size) || rec.Ops != n {
			t.Fatalf("epoch %d: record %+v, want %d bytes in %d puts", e, rec, n*uint64(size), n)
		}
		for i := range senders {
			if got, want := p.Bytes()[i*size:(i+1)*size], pattern(size, byte(e*len(senders)+i)); !bytes.Equal(got, want) {
				t.Fatalf("epoch %d, sender %d: bytes %x..., want %x...", e, i, got[:8], want[:8])
			}
		}
		if err := p.Release(); err != nil {
			t.Fatal(err)
		}
		for i, op := range ops {
			if err := op.Wait(ctx); err != nil {
				t.Fatalf("epoch %d, sender %d: %v", e, i, err)
			}
		}
	}
}
