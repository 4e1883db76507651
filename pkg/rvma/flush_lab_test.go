//go:build lab

package rvma

// Puts flushed by a stripe failure that was not one of their sender's own
// refused requests. The sender's QP is forced into the error state while
// its puts are in flight, as a fatal event, a disconnection or an error on
// the responder side of the QP would do: some of those puts may have been
// placed, their acknowledgments lost with the QP. The sender cannot tell
// which, so it issues none again (that could place one twice and count it
// twice): each fails with ErrPeerGone, the link fails, and the next put
// resolves the mailbox anew. At the receiver every slot holds the put
// that targeted it or nothing, the count is exactly the bytes of the
// slots filled, and every put that succeeded is there.
//
// In loopback rxe runs a put's whole exchange within its post, so a put is
// rarely placed and not yet acknowledged there; between two guests the
// acknowledgment is a network trip away, and most rounds have such puts.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabFlushInDoubt -test.v
// and  go run ./test/softroce gotest -guests 2 ./pkg/rvma -test.run TestLabGuestsFlushInDoubt -test.v

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

const (
	flushSize   = 64
	flushSlots  = 192 // more than a stripe's puts in flight
	flushRounds = 3
	flushBuf    = (flushSlots + 1) * flushSize
	flushMB     = Mailbox(0xf1a5)
)

// flushWindow opens the receiver's window: buffers one slot longer than
// the puts fill and a threshold that puts placed once each never reach, so
// only IncEpoch ends an epoch and a put placed twice shows in its count.
func flushWindow(t *testing.T, b *Endpoint) (*Window, []*Posted) {
	t.Helper()
	w, err := b.InitWindow(flushMB, &WindowOptions{Threshold: flushBuf})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := b.Alloc((flushRounds + 1) * flushBuf)
	if err != nil {
		t.Fatal(err)
	}
	var pb []*Posted
	for r := 0; r <= flushRounds; r++ {
		p, err := w.Post(context.Background(), mem[r*flushBuf:(r+1)*flushBuf], nil)
		if err != nil {
			t.Fatal(err)
		}
		pb = append(pb, p)
	}
	return w, pb
}

// flushRound is round r at the sender: slot 0 alone (it resolves the
// mailbox, again after the link failed), then the others in flight with
// the stripe forced into the error state halfway. It returns the slots
// whose puts succeeded and how many failed with ErrPeerGone.
func flushRound(t *testing.T, ctx context.Context, a *Endpoint, dst netip.AddrPort, r int) (map[int]bool, int) {
	t.Helper()
	if err := a.Put(ctx, dst, flushMB, 0, patterned(flushSize, r*flushSlots)); err != nil {
		t.Fatalf("round %d: slot 0: %v", r, err)
	}
	ops := make([]*PutOp, flushSlots)
	for i := 1; i < flushSlots; i++ {
		ops[i] = a.PutAsync(ctx, dst, flushMB, uint64(i*flushSize), patterned(flushSize, r*flushSlots+i))
		if i == flushSlots/2 {
			a.mu.Lock()
			st := a.links[dst].stripes[0].Load()
			a.mu.Unlock()
			if err := st.qp.ToError(); err != nil {
				t.Fatalf("round %d: forcing the stripe into the error state: %v", r, err)
			}
		}
	}
	ok, inDoubt := map[int]bool{0: true}, 0
	for i := 1; i < flushSlots; i++ {
		switch err := ops[i].Wait(ctx); {
		case err == nil:
			ok[i] = true
		case errors.Is(err, ErrPeerGone):
			inDoubt++
		default:
			t.Fatalf("round %d: put to slot %d: %v, want success or ErrPeerGone", r, i, err)
		}
	}
	return ok, inDoubt
}

// flushCheck hands round r's epoch over and checks it: each slot holds its
// put or nothing, the count is the slots filled, and every slot in ok (nil
// between guests: the receiver does not know) is filled. It returns the
// slots filled.
func flushCheck(t *testing.T, ctx context.Context, w *Window, p *Posted, r int, ok map[int]bool) int {
	t.Helper()
	rec, err := w.IncEpoch(ctx)
	if err != nil {
		t.Fatalf("round %d: IncEpoch: %v", r, err)
	}
	got, zero, filled := p.Bytes(), make([]byte, flushSize), 0
	for i := 0; i < flushSlots; i++ {
		s := got[i*flushSize : (i+1)*flushSize]
		switch {
		case bytes.Equal(s, patterned(flushSize, r*flushSlots+i)):
			filled++
		case !bytes.Equal(s, zero):
			t.Fatalf("round %d: slot %d holds bytes of no put to it", r, i)
		case ok[i]:
			t.Fatalf("round %d: slot %d is empty, but its put succeeded", r, i)
		}
	}
	if rec.Epoch != uint64(r) {
		t.Fatalf("round %d: IncEpoch handed over epoch %d: epoch %d reached its threshold, which puts placed once each cannot: a put was placed twice", r, rec.Epoch, r)
	}
	if rec.Len != uint64(filled*flushSize) || rec.Ops != uint64(filled) {
		t.Fatalf("round %d: the epoch counted %d bytes in %d puts, but %d slots of %d bytes are filled: a put was placed twice", r, rec.Len, rec.Ops, filled, flushSize)
	}
	return filled
}

// flushAfter checks that a put after the failures lands (the last round).
func flushAfter(t *testing.T, ctx context.Context, a *Endpoint, dst netip.AddrPort) {
	t.Helper()
	if err := a.Put(ctx, dst, flushMB, 0, patterned(flushSize, 7)); err != nil {
		t.Fatalf("a put after the failures: %v", err)
	}
}

func flushAfterCheck(t *testing.T, ctx context.Context, w *Window, p *Posted) {
	t.Helper()
	if rec, err := w.IncEpoch(ctx); err != nil || rec.Len != flushSize || !bytes.Equal(p.Bytes()[:flushSize], patterned(flushSize, 7)) {
		t.Fatalf("the epoch after the failures: %+v %v", rec, err)
	}
}

func TestLabFlushInDoubt(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := guestListen(t, guestPort+60, &EndpointOptions{Stripes: 1})
	b := guestListen(t, guestPort+61, nil)
	w, pb := flushWindow(t, b)
	inDoubt := 0
	for r := 0; r < flushRounds; r++ {
		ok, n := flushRound(t, ctx, a, b.Addr(), r)
		inDoubt += n
		filled := flushCheck(t, ctx, w, pb[r], r, ok)
		t.Logf("round %d: %d puts succeeded, %d failed in doubt, %d slots filled", r, len(ok), n, filled)
	}
	if inDoubt == 0 {
		t.Fatal("no put was in flight when the stripe failed: the test did not test anything")
	}
	if st := a.Stats(); st.LinkFailures != flushRounds {
		t.Errorf("a's link failures: %d, want %d (one per round)", st.LinkFailures, flushRounds)
	}
	flushAfter(t, ctx, a, b.Addr())
	flushAfterCheck(t, ctx, w, pb[flushRounds])
}

// TestLabGuestsFlushInDoubt is the same between guests 1 (receiver) and 2
// (sender); other guests have nothing to do.
func TestLabGuestsFlushInDoubt(t *testing.T) {
	labenv.Device(t)
	n, err := labenv.Guests()
	if err != nil || n < 2 {
		t.Fatalf("this test needs at least two guests (have %d)", n)
	}
	idx, _ := labenv.Index()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	barrier := func(f func(context.Context, string) error, name string, r int) {
		t.Helper()
		if err := f(ctx, fmt.Sprintf("%s-flush-%s-%d", *countingFlag, name, r)); err != nil {
			t.Fatal(err)
		}
	}
	signal := func(_ context.Context, name string) error { return labenv.Signal(name) }
	dst := guestAddr(t, 1, guestPort+62)
	switch idx {
	case 1:
		b := guestListen(t, guestPort+62, nil)
		w, pb := flushWindow(t, b)
		barrier(signal, "ready", 0)
		filled := 0
		for r := 0; r < flushRounds; r++ {
			barrier(labenv.Wait, "sent", r)
			filled += flushCheck(t, ctx, w, pb[r], r, nil)
			barrier(signal, "checked", r)
		}
		barrier(labenv.Wait, "sent", flushRounds)
		flushAfterCheck(t, ctx, w, pb[flushRounds])
		t.Logf("%d slots filled over %d rounds of %d puts", filled, flushRounds, flushSlots)
	case 2:
		a := guestListen(t, guestPort+63, &EndpointOptions{Stripes: 1})
		barrier(labenv.Wait, "ready", 0)
		succeeded, inDoubt := 0, 0
		for r := 0; r < flushRounds; r++ {
			ok, n := flushRound(t, ctx, a, dst, r)
			succeeded, inDoubt = succeeded+len(ok), inDoubt+n
			barrier(signal, "sent", r)
			barrier(labenv.Wait, "checked", r)
		}
		flushAfter(t, ctx, a, dst)
		barrier(signal, "sent", flushRounds)
		t.Logf("%d puts succeeded, %d failed in doubt over %d rounds", succeeded, inDoubt, flushRounds)
		if inDoubt == 0 {
			t.Fatal("no put was in flight when the stripe failed: the test did not test anything")
		}
	}
}
