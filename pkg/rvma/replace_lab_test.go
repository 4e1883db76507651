//go:build lab

package rvma

// Stripe replacement seen from the accepting side of a link (which sends
// on it the entries, answers and reports its windows owe the dialer, and
// puts to the dialer over a link of its own):
//
//   - a replacement stripe installed before its Accept returned, whose QP
//     cannot send yet: the dialer's puts and the entries pushed to it wait
//     for it, and every put lands once;
//   - a stripe broken only on the accepting side, which the dialer never
//     replaces, fails the link after Endpoint.replaceWait, and the
//     dialer's puts, which need the entries the accepting side can no
//     longer push, go on over a new link instead of hanging.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabStripe -test.v

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// replacePair returns endpoints a and b and b's window mb (one-put epochs
// of 64 bytes, n buffers, never released), with a link a dialled and b
// accepted, and b's own link to a.
func replacePair(t *testing.T, ctx context.Context, port uint16, n int, opts *EndpointOptions) (a, b *Endpoint, mb Mailbox, pb []*Posted) {
	t.Helper()
	a = guestListen(t, port, &EndpointOptions{Stripes: 1})
	b = guestListen(t, port+1, opts)
	ma, mb := Mailbox(0x5e1a), Mailbox(0x5e1b)
	if _, err := a.InitWindow(ma, &WindowOptions{Threshold: 64}); err != nil {
		t.Fatal(err)
	}
	w, err := b.InitWindow(mb, &WindowOptions{Threshold: 64})
	if err != nil {
		t.Fatal(err)
	}
	// Buffers of 64 and 65 bytes in turn: an entry describes no more
	// than MaxDescs of them (Entry.Through derives only buffers like the
	// last descriptor's), so a needs b's entries beyond those.
	mem, err := b.Alloc(n * 65)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		p, err := w.Post(ctx, mem[i*65:i*65+64+i%2], nil)
		if err != nil {
			t.Fatal(err)
		}
		pb = append(pb, p)
	}
	if err := a.Put(ctx, b.Addr(), mb, 0, patterned(64, 0)); err != nil {
		t.Fatalf("a's first put to b: %v", err)
	}
	b.mu.Lock()
	nb := len(b.links)
	b.mu.Unlock()
	if nb != 0 {
		t.Fatalf("b has %d links of its own before it put anything, want 0 (puts go only on links their sender dialled)", nb)
	}
	return a, b, mb, pb
}

// stripe0 is stripe 0 of the link ep dialled to peer, or of the one peer
// dialled to ep (accepted).
func stripe0(ep, peer *Endpoint, accepted bool) *stripe {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if !accepted {
		return ep.links[peer.Addr()].stripes[0].Load()
	}
	for _, l := range ep.accepted {
		if l.peer == peer.Addr() {
			return l.stripes[0].Load()
		}
	}
	return nil
}

// checkEpochs checks that b's epochs 0..n-1 hold a's puts 0..n-1, once each.
func checkEpochs(t *testing.T, ctx context.Context, pb []*Posted, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		rec, err := pb[i].Wait(ctx)
		if err != nil || rec.Len != 64 || !bytes.Equal(pb[i].Bytes()[:64], patterned(64, i)) {
			t.Fatalf("b's epoch %d: %+v %v", i, rec, err)
		}
	}
}

func TestLabStripeReplacedUnderAccept(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const puts = 20 // more than a view's descriptors: the entries pushed meanwhile matter
	a, b, mb, pb := replacePair(t, ctx, guestPort+50, puts+1, &EndpointOptions{Stripes: 1})

	// a replaces its stripe; b holds the replacement between installing it
	// and accepting it, while a puts (waiting for the stripe) and b owes a
	// the entries of its window.
	old, oldB := stripe0(a, b, false), stripe0(b, a, true)
	b.acceptDelay.Store(int64(300 * time.Millisecond))
	defer b.acceptDelay.Store(0)
	old.broken(errors.New("test: stripe taken out of service"))
	for stripe0(b, a, true) == oldB {
		if ctx.Err() != nil {
			t.Fatal("b never installed a replacement stripe")
		}
		time.Sleep(100 * time.Microsecond)
	}
	start := time.Now()
	for i := 1; i <= puts; i++ {
		if err := a.Put(ctx, b.Addr(), mb, 0, patterned(64, i)); err != nil {
			t.Fatalf("put %d of a across the replacement: %v", i, err)
		}
	}
	t.Logf("%d puts of a in %v across a replacement held 300 ms before Accept", puts, time.Since(start))
	if now := stripe0(a, b, false); now == old || now == nil {
		t.Fatal("a's stripe was not replaced")
	}
	checkEpochs(t, ctx, pb, puts+1)
	if sa, sb := a.Stats(), b.Stats(); sa.LinkFailures != 0 || sb.LinkFailures != 0 {
		t.Errorf("link failures: a %d, b %d, want 0", sa.LinkFailures, sb.LinkFailures)
	}
}

func TestLabStripeNotReplaced(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const puts = 12 // beyond the descriptors a has: a needs b's entries
	a, b, mb, pb := replacePair(t, ctx, guestPort+52, puts+1, &EndpointOptions{Stripes: 1, DialTimeout: time.Second})

	// b's side of the stripe fails alone: a sees nothing and never dials
	// a replacement, and b cannot push its entries to a.
	stripe0(b, a, true).broken(errors.New("test: failed on the accepting side only"))
	start := time.Now()
	for i := 1; i <= puts; i++ {
		if err := a.Put(ctx, b.Addr(), mb, 0, patterned(64, i)); err != nil {
			t.Fatalf("a's put %d after b's stripe failed alone: %v", i, err)
		}
	}
	took := time.Since(start)
	t.Logf("a's %d puts took %v (b's replaceWait %v)", puts, took, b.replaceWait())
	if took < b.replaceWait() {
		t.Errorf("the puts took %v, less than replaceWait %v: one should have waited for b's entry until b failed the link", took, b.replaceWait())
	}
	checkEpochs(t, ctx, pb, puts+1)
	if st := b.Stats(); st.LinkFailures != 1 {
		t.Errorf("b saw %d link failures, want 1", st.LinkFailures)
	}
}
