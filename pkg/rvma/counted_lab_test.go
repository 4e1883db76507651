//go:build lab

package rvma_test

// Windows the kernel module counts (docs/rvma.md, section 6): puts are
// plain RDMA WRITEs, the module counts each packet as it places it and
// writes the completion record, and Posted.Spin polls that record alone.
// The other endpoint tests run in this mode too (-rvma.counting=module,
// the suites' first run); this one checks what only it has.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabEndpointCounted -test.v

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

func TestLabEndpointCounted(t *testing.T) {
	ep := labListen(t, 7476, &rvma.EndpointOptions{Stripes: 4, Counting: rvma.CountModule})
	if got := ep.Counting(); got != rvma.CountModule {
		t.Fatalf("Counting() = %v, want module", got)
	}
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src, err := ep.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("spin sees the module's record", func(t *testing.T) {
		const mb, bufLen, piece = rvma.Mailbox(0xC0A1), 32 << 10, 2 << 10
		_, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{}, 4, 4, bufLen)
		for epoch := 0; epoch < 6; epoch++ {
			want := pattern(bufLen, byte(epoch*17+3))
			copy(src, want)
			p := posted[epoch%4]
			// Puts from another goroutine, in random order over the
			// four stripes; this one spins on the record.
			errs := make(chan error, 1)
			go func() {
				var ops []*rvma.PutOp
				for _, i := range rand.Perm(bufLen / piece) {
					ops = append(ops, ep.PutAsync(ctx, self, mb, uint64(i*piece), src[i*piece:(i+1)*piece]))
				}
				for _, op := range ops {
					if err := op.Wait(ctx); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
			rec, err := p.Spin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Epoch != uint64(epoch) || rec.Len != bufLen || rec.Ops != bufLen/piece || rec.Flags != 0 || rec.Cap != bufLen {
				t.Fatalf("epoch %d: record %+v", epoch, rec)
			}
			if !bytes.Equal(p.Bytes(), want) {
				t.Fatalf("epoch %d: bytes differ", epoch)
			}
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			if c, ok := p.Completion().Load(); !ok || c != rec {
				t.Fatalf("completion pointer %+v %v, want %+v", c, ok, rec)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("ops count messages, not packets", func(t *testing.T) {
		const mb, size = rvma.Mailbox(0xC0A2), 10000 // several packets at any rxe MTU
		w, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 3}, 2, 2, 4*size)
		want := pattern(3*size, 9)
		copy(src, want)
		for i := 0; i < 3; i++ {
			if err := ep.Put(ctx, self, mb, uint64(i*size), src[i*size:(i+1)*size]); err != nil {
				t.Fatal(err)
			}
		}
		rec, err := posted[0].Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Ops != 3 || rec.Len != 3*size || rec.Flags != 0 {
			t.Fatalf("record %+v, want 3 puts of %d bytes", rec, size)
		}
		if !bytes.Equal(posted[0].Bytes()[:3*size], want) {
			t.Fatal("bytes differ")
		}
		// IncEpoch hands the next buffer over with what arrived.
		if err := ep.Put(ctx, self, mb, 0, src[:size]); err != nil {
			t.Fatal(err)
		}
		rec, err = w.IncEpoch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Epoch != 1 || rec.Ops != 1 || rec.Len != size || rec.Flags != rvma.FlagPartial {
			t.Fatalf("IncEpoch record %+v", rec)
		}
		if s := w.Stats(); s.Puts != 4 || s.Bytes != 4*size || s.EpochsCompleted != 2 || s.Stale != 0 {
			t.Fatalf("stats %+v", s)
		}
	})

	t.Run("a key kept without memory", func(t *testing.T) {
		// The module keeps each multi-packet message's key from its first
		// packet to its last (docs/kmod.md, "Keyed buffers"). For a QP it
		// was not told of, that takes memory in softirq, and when none is
		// to be had the message is refused, which the sender cannot tell
		// from a stale put's (it would re-issue the put into the next
		// epoch). The endpoint names its stripes' QPs to the module, so
		// their keys never take memory there: with every allocation of
		// one failing, a put of several packets lands in its epoch and
		// no allocation is even tried.
		const mb, size = rvma.Mailbox(0xC0A7), 10000 // several packets at any rxe MTU
		w, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 1}, 2, 2, size)
		want := pattern(size, 13)
		copy(src, want)
		before := ep.Stats().StalePuts
		if err := labenv.SetKeyStoreFaults(1); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { labenv.SetKeyStoreFaults(0) })
		if err := ep.Put(ctx, self, mb, 0, src[:size]); err != nil {
			t.Fatalf("put with no memory for keys: %v", err)
		}
		rec, err := posted[0].Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Ops != 1 || rec.Len != size || !bytes.Equal(posted[0].Bytes()[:size], want) {
			t.Fatalf("record %+v: the put is not in its epoch, or its bytes differ", rec)
		}
		if n, err := labenv.KeyStoreFaults(); n != 1 || err != nil {
			t.Fatalf("key store faults left: %d %v, want 1 (a key of a named QP took memory)", n, err)
		}
		if got := ep.Stats().StalePuts - before; got != 0 {
			t.Fatalf("sender counted %d refusals, want none", got)
		}
		if s := w.Stats(); s.Stale != 0 || s.Puts != 1 || s.Bytes != size || s.RefusedPackets != 0 {
			t.Fatalf("window stats %+v, want one put and no refusal", s)
		}
	})

	t.Run("one buffer, released and re-posted", func(t *testing.T) {
		const mb, bufLen, piece = rvma.Mailbox(0xC0A5), 1 << 20, 128 << 10
		big, err := ep.Alloc(bufLen)
		if err != nil {
			t.Fatal(err)
		}
		_, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{}, 1, 1, bufLen)
		p := posted[0]
		for epoch := 0; epoch < 4; epoch++ {
			want := pattern(bufLen, byte(epoch+40))
			copy(big, want)
			var ops []*rvma.PutOp
			for i := 0; i < bufLen/piece; i++ {
				ops = append(ops, ep.PutAsync(ctx, self, mb, uint64(i*piece), big[i*piece:(i+1)*piece]))
			}
			for _, op := range ops {
				if err := op.Wait(ctx); err != nil {
					t.Fatalf("epoch %d: %v", epoch, err)
				}
			}
			rec, err := p.Wait(ctx)
			if err != nil || rec.Epoch != uint64(epoch) || rec.Len != bufLen || !bytes.Equal(p.Bytes(), want) {
				t.Fatalf("epoch %d: %+v %v", epoch, rec, err)
			}
			clear(p.Bytes())
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("zero-length put", func(t *testing.T) {
		const mb = rvma.Mailbox(0xC0A3)
		openPosted(t, ep, mb, rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 1}, 1, 1, 64)
		if err := ep.Put(ctx, self, mb, 0, nil); !errors.Is(err, rvma.ErrInvalid) {
			t.Fatalf("zero-length put to a counted window: %v, want ErrInvalid", err)
		}
	})

	t.Run("a window asking for CountLibrary is counted by the library", func(t *testing.T) {
		// Counted by the library, a window takes a zero-length put (its
		// immediate is counted), which a counted one refuses.
		const mb = rvma.Mailbox(0xC0A6)
		_, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: 2, Counting: rvma.CountLibrary}, 1, 1, 4096)
		copy(src, pattern(64, 6))
		if err := ep.Put(ctx, self, mb, 0, nil); err != nil {
			t.Fatalf("zero-length put to a library-counted window: %v", err)
		}
		if err := ep.Put(ctx, self, mb, 0, src[:64]); err != nil {
			t.Fatal(err)
		}
		rec, err := posted[0].Wait(ctx)
		if err != nil || rec.Len != 64 || rec.Ops != 2 || !bytes.Equal(posted[0].Bytes()[:64], src[:64]) {
			t.Fatalf("%+v %v", rec, err)
		}
	})

	t.Run("GuardNone is counted by the library", func(t *testing.T) {
		const mb = rvma.Mailbox(0xC0A4)
		_, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{Guard: rvma.GuardNone}, 1, 1, 4096)
		copy(src, pattern(4096, 5))
		if err := ep.Put(ctx, self, mb, 0, src[:4096]); err != nil {
			t.Fatal(err)
		}
		if rec, err := posted[0].Wait(ctx); err != nil || rec.Len != 4096 || rec.Ops != 1 {
			t.Fatalf("%+v %v", rec, err)
		}
	})
}
