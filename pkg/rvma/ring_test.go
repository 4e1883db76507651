package rvma

import (
	"slices"
	"testing"
)

// countedFixture drives a counted window's state as the engine does: key
// rings are bound with fresh keys when flushed, and the module's side is
// played by publish.
type countedFixture struct {
	*fixture
	nextKey uint32
	rings   int             // ring binds so far
	regs    []regAction     // registrations so far
	ends    []endAction     // ends so far
	unbound map[*buffer]int // ring unbinds so far, by buffer
}

func newCountedFixture(t *testing.T, o WindowOptions) *countedFixture {
	t.Helper()
	f := &countedFixture{fixture: newFixture(t, o), nextKey: 0x1000, unbound: map[*buffer]int{}}
	f.w.counted = true
	return f
}

// flush binds the rings asked for (n keys each) and takes the module's
// actions, until the outbox is empty. It fails on a plain bind or on a
// ring bound for a buffer that still had unused keys.
func (f *countedFixture) flush(n int) {
	f.t.Helper()
	for {
		bind, unbind, _ := f.w.takeActions()
		regs, ends := f.w.takeModuleActions()
		f.regs, f.ends = append(f.regs, regs...), append(f.ends, ends...)
		for _, b := range unbind {
			f.unbound[b]++
			f.w.unbound(b)
		}
		if len(bind) == 0 {
			return
		}
		for _, a := range bind {
			if a.from != nil || a.b.nextKey < len(a.b.keys) {
				f.t.Fatalf("bind %+v of a buffer with keys %v, next %d", a, a.b.keys, a.b.nextKey)
			}
			keys := make([]uint32, n)
			for i := range keys {
				f.nextKey++
				keys[i] = f.nextKey
			}
			f.rings++
			f.w.ringBound(a.b, keys)
		}
	}
}

// publish completes the head's epoch as the module would.
func (f *countedFixture) publish() *buffer {
	f.t.Helper()
	b := f.w.pending[0]
	if !b.registered {
		f.t.Fatalf("head gen %d not registered", b.gen)
	}
	b.comp.publish(Record{Epoch: b.gen, Addr: b.addr, Len: b.cap, Ops: 1, Cap: b.cap})
	f.w.countedUpTo(f.w.head + 1)
	if b.state != bufDone {
		f.t.Fatalf("gen %d: state %v after its publication", b.gen, b.state)
	}
	return b
}

// lastReg is the last registration of b.
func (f *countedFixture) lastReg(b *buffer) regAction {
	f.t.Helper()
	for i := len(f.regs) - 1; i >= 0; i-- {
		if f.regs[i].b == b {
			return f.regs[i]
		}
	}
	f.t.Fatalf("buffer at %#x never registered", b.addr)
	return regAction{}
}

// A counted window's buffers are each shown with the next key of their
// ring, generation after generation, without a bind, until every key was
// used: then their ring is bound again (new keys) before they are shown.
// The module is told each generation's key, which is the one senders see.
func TestWindowCountedKeyRing(t *testing.T) {
	const n = 4
	f := newCountedFixture(t, WindowOptions{})
	b0, b1 := f.post(64, PostOptions{}), f.post(64, PostOptions{})
	f.flush(n)
	if f.rings != 2 || len(f.regs) != 2 {
		t.Fatalf("after posting: %d ring binds, %d registrations", f.rings, len(f.regs))
	}
	seen := map[uint32]bool{}
	for epoch := uint64(0); epoch < 5*n; epoch++ {
		b := f.w.pending[0]
		if b.gen != epoch || (b != b0 && b != b1) {
			t.Fatalf("epoch %d: head gen %d", epoch, b.gen)
		}
		e := f.w.entry(1)
		r := f.lastReg(b)
		if e.Head != epoch || e.NDesc != 2 || e.Descs[0].RKey != r.rkey || r.gen != epoch || r.rkey == 0 {
			t.Fatalf("epoch %d: entry %+v, registration %+v", epoch, e, r)
		}
		if seen[r.rkey] {
			t.Fatalf("epoch %d: key %#x used before", epoch, r.rkey)
		}
		seen[r.rkey] = true
		if err := f.w.release(f.publish()); err != nil {
			t.Fatal(err)
		}
		f.flush(n)
		if len(f.unbound) != 0 {
			t.Fatalf("epoch %d: rings unbound %v", epoch, f.unbound)
		}
	}
	// Each buffer took 5n/2 generations: a ring bind every n of them.
	if want := 2 * ((5*n/2 + n - 1) / n); f.rings != want {
		t.Fatalf("%d ring binds in %d epochs of two buffers, want %d", f.rings, 5*n, want)
	}
	if len(f.regs) != 2+5*n {
		t.Fatalf("%d registrations", len(f.regs))
	}
}

// Only the first MaxDescs queued buffers are registered and shown (each
// needs a ring); the next one is when the head completes.
func TestWindowCountedShowsMaxDescs(t *testing.T) {
	f := newCountedFixture(t, WindowOptions{})
	var bs []*buffer
	for range MaxDescs + 2 {
		bs = append(bs, f.post(64, PostOptions{}))
	}
	f.flush(2)
	if f.rings != MaxDescs || len(f.regs) != MaxDescs || bs[MaxDescs].registered {
		t.Fatalf("%d ring binds, %d registrations for %d buffers", f.rings, len(f.regs), len(bs))
	}
	f.publish()
	f.flush(2)
	if f.rings != MaxDescs+1 || !bs[MaxDescs].registered || bs[MaxDescs+1].registered {
		t.Fatalf("after one epoch: %d ring binds, %d registrations", f.rings, len(f.regs))
	}
	if e := f.w.entry(1); e.NDesc != MaxDescs || e.Head != 1 {
		t.Fatalf("entry %+v", e)
	}
}

// A buffer ended before its ring was bound (IncEpoch, Close) is
// registered keyed to no key and ended at once; its ring, bound later, is
// kept for its next generation, or unbound if the window closed. A
// one-time buffer's ring is unbound when the application releases it, and
// so is every ring of a closed window once its buffer is released.
func TestWindowCountedEndsAndRetires(t *testing.T) {
	f := newCountedFixture(t, WindowOptions{})
	b0 := f.post(64, PostOptions{})
	bind, _, _ := f.w.takeActions()
	if len(bind) != 1 || bind[0].b != b0 || !b0.binding {
		t.Fatalf("binds %+v", bind)
	}
	if _, err := f.w.incEpoch(); err != nil {
		t.Fatal(err)
	}
	regs, ends := f.w.takeModuleActions()
	if len(regs) != 1 || regs[0].b != b0 || regs[0].rkey != 0 || len(ends) != 1 || ends[0].flags != FlagPartial {
		t.Fatalf("IncEpoch before the ring: registrations %+v, ends %+v", regs, ends)
	}
	f.w.ringBound(b0, []uint32{7, 8})
	if b, _, _ := f.w.takeActions(); len(b) != 0 {
		t.Fatalf("binds %+v", b)
	}
	if err := f.w.release(f.publish()); err != nil {
		t.Fatal(err)
	}
	f.flush(2)
	if r := f.lastReg(b0); r.gen != 1 || r.rkey != 7 || f.rings != 0 {
		t.Fatalf("re-posted: registration %+v, %d more ring binds", r, f.rings)
	}

	one := f.post(64, PostOptions{OneTime: true})
	f.flush(1)
	f.publish() // b0
	if err := f.w.release(b0); err != nil {
		t.Fatal(err)
	}
	f.flush(2)
	got := f.publish()
	if got != one {
		t.Fatalf("handed over gen %d, not the one-time buffer", got.gen)
	}
	f.flush(2)
	if f.unbound[one] != 0 {
		t.Fatal("a one-time buffer's ring unbound while the application holds it")
	}
	if err := f.w.release(one); err != nil {
		t.Fatal(err)
	}
	f.flush(2)
	if f.unbound[one] != 1 || f.unbound[b0] != 0 {
		t.Fatalf("after releasing the one-time buffer: unbinds %v", f.unbound)
	}

	// Close: b0 (pending) is ended, handed over, released: its ring goes.
	if !f.w.close() {
		t.Fatal("close")
	}
	f.flush(2)
	b := f.publish()
	if b != b0 {
		t.Fatalf("closed epoch: %+v", b.rec)
	}
	if err := f.w.release(b0); err != nil {
		t.Fatal(err)
	}
	f.flush(2)
	if f.unbound[b0] != 1 {
		t.Fatalf("after close and release: unbinds %v", f.unbound)
	}
	if !slices.ContainsFunc(f.ends, func(a endAction) bool { return a.b == b0 && a.flags&FlagClosed != 0 }) {
		t.Fatalf("ends %+v", f.ends)
	}
}
