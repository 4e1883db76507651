//go:build lab

package rvma

// Stripe replacement seen from the accepting side of a link, which uses
// the link for its own puts too (the peer dialled first):
//
//   - a replacement stripe is installed before its Accept returns, and its
//     QP cannot send until then: puts in that interval wait for it instead
//     of failing on it (a post on a QP in INIT once broke the new stripe
//     for good, and the four-guest halo exchange hung);
//   - a stripe broken only on the accepting side, which the dialer never
//     replaces, fails the link after Endpoint.replaceWait, and the puts
//     waiting for it dial a new link instead of hanging.
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

// replacePair returns endpoints a and b, a's window ma and b's window mb
// (one-put epochs of 64 bytes, n buffers each, never released), with a
// link that a dialled and b uses for its puts to a.
func replacePair(t *testing.T, ctx context.Context, port uint16, n int, opts *Options) (a, b *Endpoint, ma, mb Mailbox, pa []*Posted) {
	t.Helper()
	a = guestListen(t, port, &Options{Stripes: 1})
	b = guestListen(t, port+1, opts)
	ma, mb = Mailbox(0x5e1a), Mailbox(0x5e1b)
	for _, x := range []struct {
		ep *Endpoint
		mb Mailbox
	}{{a, ma}, {b, mb}} {
		w, err := x.ep.InitWindow(x.mb, WindowOptions{Threshold: 64})
		if err != nil {
			t.Fatal(err)
		}
		mem, err := x.ep.Alloc(n * 64)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			p, err := w.Post(mem[i*64:(i+1)*64], nil)
			if err != nil {
				t.Fatal(err)
			}
			if x.ep == a {
				pa = append(pa, p)
			}
		}
	}
	if err := a.Put(ctx, b.Addr(), mb, 0, patterned(64, 0)); err != nil {
		t.Fatalf("a's first put to b: %v", err)
	}
	if err := b.Put(ctx, a.Addr(), ma, 0, patterned(64, 1)); err != nil {
		t.Fatalf("b's first put to a: %v", err)
	}
	b.mu.Lock()
	l := b.links[a.Addr()]
	b.mu.Unlock()
	if l == nil || l.dial {
		t.Fatalf("b's link to a: %+v, want the one a dialled", l)
	}
	return a, b, ma, mb, pa
}

func stripe0(ep, peer *Endpoint) *stripe {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.links[peer.Addr()].stripes[0].Load()
}

func TestLabStripeReplacedUnderAccept(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const puts = 5
	a, b, ma, _, pa := replacePair(t, ctx, guestPort+50, puts+2, &Options{Stripes: 1})

	// a replaces its stripe; b holds the replacement between installing it
	// and accepting it, and puts to a in that interval.
	old, oldB := stripe0(a, b), stripe0(b, a)
	b.acceptDelay.Store(int64(300 * time.Millisecond))
	defer b.acceptDelay.Store(0)
	old.broken(errors.New("test: stripe taken out of service"))
	for stripe0(b, a) == oldB {
		if ctx.Err() != nil {
			t.Fatal("b never installed a replacement stripe")
		}
		time.Sleep(100 * time.Microsecond)
	}
	start := time.Now()
	for i := 0; i < puts; i++ {
		if err := b.Put(ctx, a.Addr(), ma, 0, patterned(64, 2+i)); err != nil {
			t.Fatalf("put %d of b while its new stripe waits for Accept: %v", i, err)
		}
	}
	t.Logf("%d puts of b in %v, issued while a replacement stripe was held 300 ms before Accept", puts, time.Since(start))
	if now := stripe0(a, b); now == old || now == nil {
		t.Fatal("a's stripe was not replaced")
	}
	for i := 0; i <= puts; i++ { // epoch 0 is b's first put
		rec, err := pa[i].Wait(ctx)
		if err != nil || rec.Len != 64 || !bytes.Equal(pa[i].Bytes(), patterned(64, 1+i)) {
			t.Fatalf("a's epoch %d: %+v %v", i, rec, err)
		}
	}
	if st := b.Stats(); st.LinkFailures != 0 {
		t.Errorf("b saw %d link failures, want 0", st.LinkFailures)
	}
}

func TestLabStripeNotReplaced(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, b, ma, mb, pa := replacePair(t, ctx, guestPort+52, 4, &Options{Stripes: 1, DialTimeout: time.Second})

	// b's side of the stripe fails alone: a sees nothing and never dials
	// a replacement.
	stripe0(b, a).broken(errors.New("test: failed on the accepting side only"))
	start := time.Now()
	if err := b.Put(ctx, a.Addr(), ma, 0, patterned(64, 2)); err != nil {
		t.Fatalf("b's put after its stripe failed alone: %v", err)
	}
	took := time.Since(start)
	t.Logf("b's put went through after %v (replaceWait %v)", took, b.replaceWait())
	if took < b.replaceWait() {
		t.Errorf("the put took %v, less than replaceWait %v: it should have waited for a replacement first", took, b.replaceWait())
	}
	rec, err := pa[1].Wait(ctx)
	if err != nil || rec.Len != 64 || !bytes.Equal(pa[1].Bytes(), patterned(64, 2)) {
		t.Fatalf("a's epoch 1: %+v %v", rec, err)
	}
	if st := b.Stats(); st.LinkFailures != 1 {
		t.Errorf("b saw %d link failures, want 1", st.LinkFailures)
	}
	// a learns of the link's end from the disconnection and dials anew.
	if err := a.Put(ctx, b.Addr(), mb, 0, patterned(64, 3)); err != nil {
		t.Fatalf("a's put after b failed the link: %v", err)
	}
}
