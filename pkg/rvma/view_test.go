package rvma

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

func viewEntry(seq, head uint64, kind EpochKind, th uint64, n int) wire.Entry {
	e := wire.Entry{Seq: seq, Mailbox: 0x42, Incarnation: 1, State: wire.StateOpen, Kind: wire.EpochKind(kind), Head: head}
	for i := 0; i < n; i++ {
		e.Descs[i] = wire.Desc{Addr: 0x1000 * (head + uint64(i) + 1), RKey: uint32(head) + uint32(i) + 1, Len: 100, Threshold: th}
		e.NDesc++
	}
	return e
}

func TestViewSingleSenderWalksEpochs(t *testing.T) {
	v := newSenderView(0x42, 1)
	if _, _, err := v.target(0, 1); !errors.Is(err, ErrNoBuffer) {
		t.Fatalf("no entry yet: %v", err)
	}
	if !v.update(viewEntry(2, 0, EpochBytes, 100, 3)) {
		t.Fatal("entry refused")
	}
	// 3 epochs of 2 puts each, no update from the receiver in between.
	for g := uint64(0); g < 3; g++ {
		for p := uint64(0); p < 2; p++ {
			gen, d, err := v.target(p*50, 50)
			if err != nil || gen != g || d.RKey != uint32(g)+1 {
				t.Fatalf("epoch %d put %d: gen %d rkey %d %v", g, p, gen, d.RKey, err)
			}
			v.commit(gen, 50)
		}
	}
	if gen, _, err := v.target(0, 1); !errors.Is(err, ErrNoBuffer) || gen != 3 {
		t.Fatalf("beyond the descriptors: gen %d %v", gen, err)
	}
	if v.update(viewEntry(2, 3, EpochBytes, 100, 1)) {
		t.Fatal("entry with the same sequence taken")
	}
	if !v.update(viewEntry(4, 3, EpochBytes, 100, 1)) {
		t.Fatal("newer entry refused")
	}
	if gen, _, err := v.target(0, 1); err != nil || gen != 3 {
		t.Fatalf("gen %d %v", gen, err)
	}
	if len(v.mine) != 0 {
		t.Fatalf("contributions to completed epochs kept: %v", v.mine)
	}
}

func TestViewSeveralSenders(t *testing.T) {
	v := newSenderView(0x42, 1)
	v.update(viewEntry(2, 0, EpochOps, 4, 3))
	if v.revisits() {
		t.Fatal("a first put revisits")
	}
	gen, _, _ := v.target(0, 10)
	v.commit(gen, 10) // one of 4 ops: stay on gen 0
	if gen, _, _ := v.target(10, 10); gen != 0 {
		t.Fatalf("moved to %d on its own share", gen)
	}
	if !v.revisits() { // others may have completed gen 0: look for an update first
		t.Fatal("a put back at a generation it shares does not revisit")
	}
	// Others completed gen 0: an out-of-date update is ignored, the new one moves the view.
	v.update(viewEntry(6, 1, EpochOps, 4, 2))
	v.update(viewEntry(4, 0, EpochOps, 4, 3))
	if gen, _, _ := v.target(0, 10); gen != 1 {
		t.Fatalf("gen %d after the update", gen)
	}
	// A refused put moves past its generation.
	v.stale(1)
	if gen, _, err := v.target(0, 10); gen != 2 || err != nil {
		t.Fatalf("gen %d %v after stale", gen, err)
	}
	v.stale(0) // older: no effect
	if v.next() != 2 {
		t.Fatal("view went back")
	}
	for i := 0; i < 4; i++ {
		v.commit(2, 10)
	}
	if v.next() != 3 || v.revisits() {
		t.Fatal("own threshold reached: must move on, to a generation not yet put to")
	}
	v.abort(2, 10) // a flushed put: gen 2 is targeted again
	if c := v.mine[2]; c.ops != 3 || c.bytes != 30 || c.full || v.next() != 2 {
		t.Fatalf("abort left %+v, next %d", c, v.next())
	}
	v.abort(9, 1)
}

// With a promised share, each of several senders walks the epochs by its
// own count, without an update from the receiver.
func TestViewShare(t *testing.T) {
	for _, kind := range []EpochKind{EpochBytes, EpochOps} {
		v := newSenderView(0x42, 1)
		e := viewEntry(2, 0, kind, 100, 3) // two senders, 50 bytes or 1 put each
		e.Share = 50
		if kind == EpochOps {
			e.Descs[0].Threshold, e.Descs[1].Threshold, e.Descs[2].Threshold, e.Share = 2, 2, 2, 1
		}
		v.update(e)
		for g := uint64(0); g < 3; g++ {
			gen, _, err := v.target(0, 50)
			if err != nil || gen != g || v.revisits() {
				t.Fatalf("%v: epoch %d: gen %d revisits %v %v", kind, g, gen, v.revisits(), err)
			}
			v.commit(gen, 50)
		}
		if gen, _, err := v.target(0, 1); !errors.Is(err, ErrNoBuffer) || gen != 3 {
			t.Fatalf("%v: beyond the descriptors: gen %d %v", kind, gen, err)
		}
		v.abort(2, 50) // flushed: its share of gen 2 is owed again
		if v.next() != 2 {
			t.Fatalf("%v: next %d after abort", kind, v.next())
		}
	}
	// Half a share stays on the generation and revisits it.
	v := newSenderView(0x42, 1)
	e := viewEntry(2, 0, EpochBytes, 100, 3)
	e.Share = 50
	v.update(e)
	v.commit(0, 25)
	if v.next() != 0 || !v.revisits() {
		t.Fatal("half a share moved on")
	}
	// A buffer whose own threshold is below the share completes at it.
	e = viewEntry(4, 0, EpochBytes, 20, 3)
	e.Share = 50
	v.update(e)
	if v.commit(0, 0); v.next() != 1 {
		t.Fatalf("threshold below the share: next %d", v.next())
	}
}

// The view's cursor always names what a walk from its floor over the
// generations it filled would: through random puts, aborts, stale
// refusals and entries moving the head, with and without a share.
func TestViewCursorMatchesWalk(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	walk := func(v *senderView) uint64 {
		g := v.floor
		for v.mine[g].full {
			g++
		}
		return g
	}
	for _, share := range []uint64{0, 25} {
		v := newSenderView(0x42, 1)
		seq, head := uint64(1), uint64(0)
		e := viewEntry(seq, head, EpochBytes, 100, 7)
		e.Share = share
		v.update(e)
		for i := 0; i < 20000; i++ {
			switch k := r.IntN(20); {
			case k < 12:
				if gen, _, err := v.target(0, 50); err == nil {
					v.commit(gen, 50)
				}
			case k < 15:
				v.abort(v.floor+uint64(r.IntN(8)), 50)
			case k < 16:
				v.stale(v.floor + uint64(r.IntN(3)))
			case k < 19:
				seq++
				head += uint64(r.IntN(3))
				e := viewEntry(seq, head, EpochBytes, 100, 7)
				e.Share = share
				v.update(e)
			default:
				v.update(viewEntry(seq, head, EpochBytes, 100, 7)) // a duplicate: ignored
			}
			if got, want := v.next(), walk(v); got != want {
				t.Fatalf("share %d, step %d: cursor %d, a walk from floor %d finds %d", share, i, got, v.floor, want)
			}
		}
	}
}

func TestViewErrors(t *testing.T) {
	v := newSenderView(0x42, 1)
	e := viewEntry(2, 0, EpochBytes, 100, 1)
	v.update(e)
	if _, _, err := v.target(60, 50); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("does not fit: %v", err)
	}
	if _, _, err := v.target(101, 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("offset beyond: %v", err)
	}
	if _, _, err := v.target(100, 0); err != nil {
		t.Fatalf("empty put at the end: %v", err)
	}
	other := e
	other.Seq, other.Incarnation = 10, 2
	if v.update(other) {
		t.Fatal("entry of another incarnation taken")
	}
	other.Incarnation, other.Mailbox = 1, 0x43
	if v.update(other) {
		t.Fatal("entry of another mailbox taken")
	}
	closed := wire.Entry{Seq: 4, Mailbox: 0x42, Incarnation: 1, State: wire.StateClosedNack, Kind: wire.EpochBytes, Head: 0}
	v.update(closed)
	if _, _, err := v.target(0, 1); !errors.Is(err, ErrMailboxClosed) {
		t.Fatal(err)
	}
	closed.Seq, closed.State = 6, wire.StateClosedSilent
	v.update(closed)
	if _, _, err := v.target(0, 1); err != errDropped {
		t.Fatal(err)
	}
	gone := closed
	gone.Seq, gone.State = 8, wire.StateGone
	var raw [wire.EntrySize]byte
	if err := wire.MarshalEntry(raw[:], &gone); err != nil {
		t.Fatal(err)
	}
	if got, err := wire.UnmarshalEntry(raw[:]); err != nil || got != gone {
		t.Fatalf("gone entry round trip: %+v %v", got, err)
	}
	v.update(gone)
	if _, _, err := v.target(0, 1); err != errGone {
		t.Fatal(err)
	}
}

// A RESOLVE's Seq names its view slot and tells apart the views that took
// the slot one after another, and never looks like a Get's.
func TestResolveSeq(t *testing.T) {
	for _, s := range []uint32{0, 1, viewSlots - 1} {
		seen := map[uint32]bool{}
		for gen := uint32(0); gen < 1<<12; gen++ {
			q := resolveSeq(s, gen)
			if q%viewSlots != s || q&wire.GetSeqBit != 0 || seen[q] {
				t.Fatalf("slot %d gen %d: seq %#x", s, gen, q)
			}
			seen[q] = true
		}
		if q := resolveSeq(s, 1<<31-1); q%viewSlots != s || q&wire.GetSeqBit != 0 {
			t.Fatalf("slot %d, a wrapped generation: seq %#x", s, q)
		}
	}
}

// BenchmarkViewPutThrough is a lone sender putting one epoch after the
// other within one entry that derives MaxThrough-1 generations: the cost
// per put of choosing its generation, which must not grow with the
// generations filled since the entry came.
func BenchmarkViewPutThrough(b *testing.B) {
	const key = 0xf0000100
	e := wire.Entry{Seq: 1, Mailbox: 0x42, Incarnation: 1, State: wire.StateOpen, Kind: wire.EpochOps, Flags: wire.EntryCounted,
		NDesc: 1, Through: wire.MaxThrough - 1}
	e.Descs[0] = wire.Desc{Addr: wire.MailboxAddr(0), RKey: key, Len: 64, Threshold: 1}
	var v *senderView
	for i := range b.N {
		if i%(wire.MaxThrough-1) == 0 {
			v = newSenderView(0x42, 1)
			v.update(e)
		}
		gen, _, err := v.target(0, 8)
		if err != nil {
			b.Fatal(err)
		}
		v.commit(gen, 8)
	}
}
