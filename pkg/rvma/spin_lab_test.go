//go:build lab

package rvma_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
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
// both) 40 notices an epoch; docs/rvma.md, "Measured findings" (several senders).
func TestLabEndpointSpinTwoSenders(t *testing.T) {
	recv := labListen(t, 7491, nil)
	senders := []*rvma.Endpoint{labListen(t, 7492, nil), labListen(t, 7493, nil)}
	const mb, size, buffers, epochs = rvma.Mailbox(0x5A1D0001), 256, 4, 30
	_, _, posted := openPosted(t, recv, mb, rvma.WindowOptions{Threshold: 2 * size}, buffers, buffers, 2*size)
	fillTogether(t, recv, senders, mb, posted, size, epochs, (*rvma.Posted).Spin)
	// One notice per sender and epoch (the head's move) and one each when
	// it resolved; a rare stale put is allowed (a notice and a put may
	// take different stripes), not one every second epoch. Where rxe
	// places a notice after its post returns, the next epoch's puts race
	// it as on a NIC: then each put may go stale once, not its retry (a
	// storm of retries would be more), and their stripes' notices.
	stale := senders[0].Stats().StalePuts + senders[1].Stats().StalePuts
	notices := recv.Stats().Notices
	t.Logf("%d epochs: %d notices, %d stale puts", epochs, notices, stale)
	maxStale := uint64(2)
	if !labenv.InlineLoopback() {
		maxStale = uint64(len(senders) * epochs)
	}
	if stale > maxStale {
		t.Errorf("%d stale puts in %d epochs, want at most %d", stale, epochs, maxStale)
	}
	if limit := uint64(2*epochs+8) + stalePutSlack(stale, buffers-1); notices > limit {
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
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for i, op := range ops {
			if err := op.Wait(ctx); err != nil {
				t.Fatalf("epoch %d, sender %d: %v", e, i, err)
			}
		}
	}
}

// TestLabEndpointSpinPingPong is rdmaperf's rvma_lat inside one process on
// two CPUs: two goroutines put to each other's window, each taking its
// epochs with Spin and releasing the buffer right after its answer. With
// the module counting, the module writes a record from the putter's system
// call on one CPU while the other CPU spins on it: the spinner can see the
// record before the module raises the window's done counter, and Release
// then refused the buffer as not handed over (found by the loopback
// benchmark, once in about 3000 epochs). Every epoch's bytes are checked.
func TestLabEndpointSpinPingPong(t *testing.T) {
	ep := labListen(t, 7486, &rvma.EndpointOptions{Stripes: 1})
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const epochs, size, bufs = 4000, 8, 8
	const mbA, mbB = rvma.Mailbox(0x5B1A0001), rvma.Mailbox(0x5B1A0002)
	_, _, inA := openPosted(t, ep, mbA, rvma.WindowOptions{}, bufs, bufs, size)
	_, _, inB := openPosted(t, ep, mbB, rvma.WindowOptions{}, bufs, bufs, size)
	side := func(first bool, in []*rvma.Posted, to rvma.Mailbox) error {
		src, err := ep.Alloc(size)
		if err != nil {
			return err
		}
		put := func(i int) error {
			binary.LittleEndian.PutUint64(src, uint64(i))
			return ep.PutAsync(ctx, self, to, 0, src).Wait(ctx)
		}
		for i := 0; i < epochs; i++ {
			if first {
				if err := put(i); err != nil {
					return fmt.Errorf("put %d: %w", i, err)
				}
			}
			p := in[i%bufs]
			rec, err := p.Spin(ctx)
			if err != nil {
				return fmt.Errorf("epoch %d: %w", i, err)
			}
			if got := binary.LittleEndian.Uint64(p.Bytes()); rec.Len != size || got != uint64(i) {
				return fmt.Errorf("epoch %d: record %+v, bytes hold %d", i, rec, got)
			}
			if !first {
				if err := put(i); err != nil {
					return fmt.Errorf("put %d: %w", i, err)
				}
			}
			if err := p.Release(ctx); err != nil {
				return fmt.Errorf("epoch %d: %w", i, err)
			}
		}
		return nil
	}
	errs := make(chan error, 2)
	go func() { errs <- side(true, inB, mbA) }()
	go func() { errs <- side(false, inA, mbB) }()
	var first error
	for range 2 {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel() // the other side stops too
		}
	}
	if first != nil {
		t.Fatal(first)
	}
	t.Logf("%d epochs each way, spun on and released on two CPUs (GOMAXPROCS %d)", epochs, runtime.GOMAXPROCS(0))
}
