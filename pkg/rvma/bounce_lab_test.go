//go:build lab

package rvma_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
)

// Puts from Go memory are copied when PutAsync returns: small ones into
// the endpoint's bounce chunks, larger ones (and any while every chunk is
// lent) into a registration of their own. Each source is scribbled over
// right after PutAsync returns; the puts wait for a buffer, so more small
// ones hold a copy at once than there are chunks; every byte that arrives
// is checked, and afterwards every chunk is back.
func TestLabEndpointPutFromGoMemory(t *testing.T) {
	ep := labListen(t, 7477, nil)
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	puts := rvma.BounceMax + 200
	sizes := make([]int, puts)
	total := 0
	for i := range sizes {
		sizes[i] = 1 + i*97%512
		switch {
		case i%100 == 99:
			sizes[i] = 6000 // larger than a chunk: registered on its own
		case i%100 == 98:
			sizes[i] = 4096 // a whole chunk
		}
		total += sizes[i]
	}
	const mb = rvma.Mailbox(0xB0B0)
	w, err := ep.InitWindow(mb, &rvma.WindowOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := ep.Alloc(total)
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		want := pattern(total, byte(17*round+3))
		ops := make([]*rvma.PutOp, puts)
		off := 0
		for i, n := range sizes {
			src := append([]byte(nil), want[off:off+n]...)
			ops[i] = ep.PutAsync(ctx, self, mb, uint64(off), src)
			for k := range src {
				src[k] = ^src[k] // the put copied it: this must not arrive
			}
			off += n
		}
		if lent, all := rvma.BounceLent(ep); lent != rvma.BounceMax || all != rvma.BounceMax {
			t.Fatalf("round %d: %d of %d bounce chunks lent by puts waiting for a buffer, want all %d", round, lent, all, rvma.BounceMax)
		}
		// One-time, so that Release does not post it again for the next round.
		p, err := w.Post(ctx, mem, &rvma.PostOptions{OneTime: true})
		if err != nil {
			t.Fatal(err)
		}
		for i, op := range ops {
			if err := op.Wait(ctx); err != nil {
				t.Fatalf("round %d: put %d of %d bytes: %v", round, i, sizes[i], err)
			}
		}
		rec, err := p.Wait(ctx)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if rec.Len != uint64(total) || rec.Ops != uint64(puts) {
			t.Fatalf("round %d: record %+v, want %d bytes in %d puts", round, rec, total, puts)
		}
		if got := p.Bytes()[:total]; !bytes.Equal(got, want) {
			for k := range got {
				if got[k] != want[k] {
					t.Fatalf("round %d: byte %d is %#x, want %#x", round, k, got[k], want[k])
				}
			}
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if lent, _ := rvma.BounceLent(ep); lent != 0 {
			t.Fatalf("round %d: %d bounce chunks still lent after every put completed", round, lent)
		}
		// The 12 puts of 6000 B, and the small ones beyond the chunks.
		if got, want := ep.Stats().CopyRegistrations, uint64((round+1)*(puts-rvma.BounceMax)); got != want {
			t.Fatalf("round %d: %d copies registered on their own, want %d", round, got, want)
		}
	}
	checkMetrics(t, ep, mb, map[string]float64{"rvma_endpoint_copy_registrations_total": float64(2 * (puts - rvma.BounceMax))})
	t.Logf("2 rounds of %d puts from Go memory (%d bytes each round, 1 B to 6000 B; %d bounce chunks), sources overwritten at once: every byte right, every chunk back", puts, total, rvma.BounceMax)
}
