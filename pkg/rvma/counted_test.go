package rvma

import (
	"fmt"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// testMailboxKey is the mailbox key the counted fixtures' windows have.
const testMailboxKey = 0xf0000100

// countedFixture drives a counted window's state as the engine does: the
// module's side is played by publish, and the window never asks for a
// bind or an unbind.
type countedFixture struct {
	*fixture
	regs []regAction // registrations so far
	ends []endAction // ends so far
}

func newCountedFixture(t testing.TB, o WindowOptions) *countedFixture {
	t.Helper()
	f := &countedFixture{fixture: newFixture(t, o)}
	f.w.counted, f.w.mbkey = true, testMailboxKey
	return f
}

// flush takes the module's actions; it fails on any bind or unbind.
func (f *countedFixture) flush() {
	f.t.Helper()
	bind, unbind, _ := f.w.takeActions()
	if len(bind) != 0 || len(unbind) != 0 {
		f.t.Fatalf("a counted window asked for binds %+v and unbinds %d", bind, len(unbind))
	}
	regs, ends := f.w.takeModuleActions()
	f.regs, f.ends = append(f.regs, regs...), append(f.ends, ends...)
}

// publish completes the head's epoch as the module would: its record
// carries the flags it was ended with.
func (f *countedFixture) publish() *buffer {
	f.t.Helper()
	b := f.w.pending[0]
	if !b.registered {
		f.t.Fatalf("head gen %d not registered", b.gen)
	}
	var fl Flags
	for _, a := range f.ends {
		if a.gen == b.gen {
			fl |= a.flags
		}
	}
	b.comp.publish(Record{Epoch: b.gen, Addr: b.addr, Len: b.cap, Ops: 1, Cap: b.cap, Flags: fl})
	f.w.countedUpTo(f.w.head + 1)
	if b.state != bufDone {
		f.t.Fatalf("gen %d: state %v after its publication", b.gen, b.state)
	}
	return b
}

// ended reports whether generation gen was ended in the module with flags
// f among its own.
func (f *countedFixture) ended(gen uint64, fl Flags) bool {
	for _, a := range f.ends {
		if a.gen == gen && a.flags&fl == fl {
			return true
		}
	}
	return false
}

// A counted window shows each generation as the mailbox key at the
// generation's address, never the buffer's address or a key of its own,
// and registers each generation with the module as it is shown, in order.
func TestWindowCountedMailboxDescs(t *testing.T) {
	f := newCountedFixture(t, WindowOptions{})
	b0, b1 := f.post(64, PostOptions{}), f.post(128, PostOptions{Threshold: 32})
	f.flush()
	if len(f.regs) != 2 {
		t.Fatalf("after posting: %d registrations", len(f.regs))
	}
	for epoch := uint64(0); epoch < 20; epoch++ {
		b := f.w.pending[0]
		if b.gen != epoch || (b != b0 && b != b1) {
			t.Fatalf("epoch %d: head gen %d", epoch, b.gen)
		}
		e := f.w.entry(1)
		if e.Head != epoch || e.NDesc != 2 {
			t.Fatalf("epoch %d: entry %+v", epoch, e)
		}
		for g := epoch; g < epoch+2; g++ {
			d, ok := e.Desc(g)
			pb := f.w.lookup(g)
			want := wire.Desc{Addr: wire.MailboxAddr(g), RKey: testMailboxKey, Len: uint32(pb.cap), Threshold: pb.threshold}
			if !ok || d != want {
				t.Fatalf("epoch %d: generation %d shown as %+v, want %+v", epoch, g, d, want)
			}
			if d.Addr == pb.addr {
				t.Fatalf("generation %d shown at the buffer's address", g)
			}
		}
		if r := f.regs[len(f.regs)-1]; r.gen != epoch+1 || r.b != f.w.lookup(epoch+1) {
			t.Fatalf("epoch %d: last registration %+v", epoch, r)
		}
		if err := f.w.release(f.publish()); err != nil {
			t.Fatal(err)
		}
		f.flush()
	}
	if len(f.regs) != 22 {
		t.Fatalf("%d registrations for 22 generations", len(f.regs))
	}
	for i, r := range f.regs {
		if r.gen != uint64(i) || r.threshold != r.b.threshold {
			t.Fatalf("registration %d: %+v", i, r)
		}
	}
}

// Every queued buffer is registered when posted. The entry describes the
// first MaxDescs and, through Entry.Through, every queued buffer after them
// of the last one's length and threshold: a sender derives their
// descriptors, exactly those the window registered.
func TestWindowCountedThrough(t *testing.T) {
	f := newCountedFixture(t, WindowOptions{})
	var bs []*buffer
	for range wire.MaxDescs + 4 {
		bs = append(bs, f.post(64, PostOptions{}))
	}
	odd := f.post(128, PostOptions{}) // another length: not derived
	f.flush()
	if len(f.regs) != len(bs)+1 {
		t.Fatalf("%d registrations for %d buffers", len(f.regs), len(bs)+1)
	}
	e := f.w.entry(1)
	if e.NDesc != wire.MaxDescs || e.Head != 0 || e.Through != uint64(len(bs)-1) {
		t.Fatalf("entry head %d, %d descriptors, through %d", e.Head, e.NDesc, e.Through)
	}
	for _, b := range bs {
		if d, ok := e.Desc(b.gen); !ok || d != b.desc {
			t.Fatalf("generation %d: %+v, registered as %+v", b.gen, d, b.desc)
		}
	}
	if _, ok := e.Desc(odd.gen); ok {
		t.Fatal("a buffer of another length derived")
	}
	b := make([]byte, wire.EntrySize)
	if err := wire.MarshalEntry(b, &e); err != nil {
		t.Fatalf("the window's entry does not marshal: %v", err)
	}

	// The head completes and is re-posted behind the odd buffer: the
	// derived run still ends before it.
	if err := f.w.release(f.publish()); err != nil {
		t.Fatal(err)
	}
	f.flush()
	if e := f.w.entry(1); e.Head != 1 || e.Through != uint64(len(bs)-1) {
		t.Fatalf("after one epoch: head %d, through %d", e.Head, e.Through)
	}

	// Fewer than MaxDescs queued: no Through; nor in a window the library
	// counts.
	g := newCountedFixture(t, WindowOptions{})
	g.post(64, PostOptions{})
	g.flush()
	if e := g.w.entry(1); e.NDesc != 1 || e.Through != 0 {
		t.Fatalf("one buffer: %+v", e)
	}
	lib := newFixture(t, WindowOptions{})
	for range wire.MaxDescs + 2 {
		lib.post(64, PostOptions{})
	}
	lib.flush()
	if e := lib.w.entry(1); e.NDesc != wire.MaxDescs || e.Through != 0 {
		t.Fatalf("library-counted window: %d descriptors, through %d", e.NDesc, e.Through)
	}
}

// IncEpoch ends the registered head in the module (partial). Close ends
// every pending buffer there, so that the module publishes every
// generation in order. Releasing buffers of a closed window retires them
// and asks for no unbind.
func TestWindowCountedEnds(t *testing.T) {
	f := newCountedFixture(t, WindowOptions{})
	b0 := f.post(64, PostOptions{})
	f.flush()
	if _, err := f.w.incEpoch(); err != nil {
		t.Fatal(err)
	}
	f.flush()
	if len(f.regs) != 1 || !f.ended(0, FlagPartial) {
		t.Fatalf("IncEpoch: registrations %+v, ends %+v", f.regs, f.ends)
	}
	if err := f.w.release(f.publish()); err != nil {
		t.Fatal(err)
	}
	f.flush()
	if r := f.regs[len(f.regs)-1]; r.b != b0 || r.gen != 1 {
		t.Fatalf("re-posted: registration %+v", r)
	}

	one := f.post(64, PostOptions{OneTime: true})
	var more []*buffer
	for range wire.MaxDescs {
		more = append(more, f.post(64, PostOptions{}))
	}
	f.flush()
	if !f.w.close() {
		t.Fatal("close")
	}
	f.flush()
	last := more[wire.MaxDescs-1].gen
	for g := uint64(1); g <= last; g++ {
		if !f.ended(g, FlagClosed) {
			t.Fatalf("generation %d not ended closed: ends %+v", g, f.ends)
		}
	}
	if n := len(f.regs); n != int(last)+1 {
		t.Fatalf("%d registrations for %d generations", n, last+1)
	}
	for _, want := range append([]*buffer{b0, one}, more...) {
		b := f.publish()
		if b != want || b.rec.Flags&FlagClosed == 0 {
			t.Fatalf("handed over gen %d (%+v), want gen %d", b.gen, b.rec, want.gen)
		}
		if err := f.w.release(b); err != nil {
			t.Fatal(err)
		}
		f.flush()
		if !b.retired {
			t.Fatalf("gen %d of a closed window not retired once released", b.gen)
		}
	}
}

// BenchmarkWindowCountedEpoch is a counted window's work per epoch with n
// buffers posted: the entry, the head's publication, its release and
// re-post, and the module's actions.
func BenchmarkWindowCountedEpoch(b *testing.B) {
	for _, n := range []int{32, 1024} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			f := newCountedFixture(b, WindowOptions{})
			f.slab = newCompletionSlab(n)
			for range n {
				f.post(64, PostOptions{})
			}
			f.flush()
			for range b.N {
				_ = f.w.entry(1)
				if err := f.w.release(f.publish()); err != nil {
					b.Fatal(err)
				}
				f.regs = f.regs[:0]
				f.flush()
			}
		})
	}
}
