package rvma

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// fixture drives a windowState as the endpoint will: binds and unbinds
// complete when flush is called.
type fixture struct {
	t     testing.TB
	w     *windowState
	slab  *completionSlab
	rkey  uint32
	pubs  []Record
	binds int
}

func newFixture(t testing.TB, o WindowOptions) *fixture {
	t.Helper()
	w, err := newWindowState(0x11FF0011, o)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, w: w, slab: newCompletionSlab(64), rkey: 0x100}
}

func (f *fixture) post(cap uint64, po PostOptions) *buffer {
	f.t.Helper()
	b, err := f.w.post(0x10000*uint64(len(f.w.pending)+1+f.binds), cap, po, f.slab.get())
	if err != nil {
		f.t.Fatalf("post: %v", err)
	}
	return b
}

// flush carries out the pending binds and unbinds (binds first, as on the
// endpoint's loopback QP) until the outbox is empty.
func (f *fixture) flush() {
	for {
		bind, unbind, pub := f.w.takeActions()
		for _, b := range pub {
			f.pubs = append(f.pubs, b.rec)
		}
		if len(bind) == 0 && len(unbind) == 0 {
			if len(pub) == 0 {
				return
			}
			continue
		}
		for _, a := range bind {
			f.rkey++
			f.binds++
			if a.from != nil {
				f.w.unbound(a.from)
			}
			f.w.bound(a.b, wire.Desc{Addr: a.b.addr, RKey: f.rkey})
		}
		for _, b := range unbind {
			f.w.unbound(b)
		}
	}
}

func (f *fixture) arrive(gen, n uint64, want arriveResult) {
	f.t.Helper()
	if got := f.w.arrive(gen, n); got != want {
		f.t.Fatalf("arrive(gen %d, %d bytes) = %v, want %v", gen, n, got, want)
	}
}

func TestWindowBytesThreshold(t *testing.T) {
	f := newFixture(t, WindowOptions{Kind: EpochBytes})
	b0 := f.post(100, PostOptions{})
	b1 := f.post(200, PostOptions{Threshold: 150})
	f.flush()
	e := f.w.entry(7)
	if e.Head != 0 || e.NDesc != 2 || e.Descs[0].Len != 100 || e.Descs[0].Threshold != 100 || e.Descs[1].Threshold != 150 {
		t.Fatalf("entry %+v", e)
	}
	if e.Incarnation != 7 || e.State != wire.StateOpen || e.Kind != wire.EpochBytes {
		t.Fatalf("entry header %+v", e)
	}
	f.arrive(0, 60, arriveCounted)
	if b0.state != bufQueued {
		t.Fatal("completed early")
	}
	f.arrive(0, 40, arriveCounted)
	if b0.state != bufCompleting {
		t.Fatalf("state %v after the threshold, want completing (waiting for the unbind)", b0.state)
	}
	if _, ok := b0.comp.Load(); ok {
		t.Fatal("published before the unbind completed")
	}
	if e2 := f.w.entry(7); e2.Head != 1 || e2.NDesc != 1 || e2.Descs[0] != b1.desc || e2.Seq <= e.Seq {
		t.Fatalf("entry while gen 0 completes: %+v", e2)
	}
	f.flush()
	rec, ok := b0.comp.Load()
	if !ok || rec != (Record{Epoch: 0, Addr: b0.addr, Len: 100, Ops: 2, Cap: 100}) {
		t.Fatalf("record %+v %v", rec, ok)
	}
	select {
	case <-b0.done:
	default:
		t.Fatal("done not closed")
	}
	if f.w.head != 1 {
		t.Fatalf("epoch %d", f.w.head)
	}
	f.arrive(0, 1, arriveStale)
	f.arrive(5, 1, arriveUnknown)
	f.arrive(1, 150, arriveCounted)
	f.flush()
	if len(f.pubs) != 2 || f.pubs[1].Len != 150 || f.pubs[1].Cap != 200 {
		t.Fatalf("published %+v", f.pubs)
	}
	s := f.w.Stats()
	if s.EpochsCompleted != 2 || s.Puts != 3 || s.Bytes != 250 || s.Stale != 1 || s.Held != 2 || s.Posted != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestWindowOpsThreshold(t *testing.T) {
	f := newFixture(t, WindowOptions{Kind: EpochOps, Threshold: 3})
	f.post(64, PostOptions{})
	f.flush()
	f.arrive(0, 1, arriveCounted)
	f.arrive(0, 0, arriveCounted) // a zero-length put is still an op
	f.arrive(0, 63, arriveCounted)
	f.flush()
	if len(f.pubs) != 1 || f.pubs[0].Ops != 3 || f.pubs[0].Len != 64 {
		t.Fatalf("published %+v", f.pubs)
	}
}

// A later epoch that reaches its threshold first is unbound at once but
// handed over only after the earlier one.
func TestWindowInOrderHandOver(t *testing.T) {
	f := newFixture(t, WindowOptions{})
	b0 := f.post(10, PostOptions{})
	b1 := f.post(10, PostOptions{})
	f.flush()
	f.arrive(1, 10, arriveCounted)
	f.flush()
	if b1.state != bufReady || len(f.pubs) != 0 {
		t.Fatalf("gen 1 %v, published %v", b1.state, f.pubs)
	}
	if e := f.w.entry(0); e.Head != 0 || e.NDesc != 1 {
		t.Fatalf("entry %+v: gen 0 accepts, gen 1 does not", e)
	}
	f.arrive(1, 1, arriveLate) // overshoot into gen 1: counted, flagged
	f.arrive(0, 10, arriveCounted)
	f.flush()
	if len(f.pubs) != 2 || f.pubs[0].Epoch != 0 || f.pubs[1].Epoch != 1 || f.pubs[1].Flags != FlagLate || f.pubs[1].Len != 11 {
		t.Fatalf("published %+v", f.pubs)
	}
	if b0.state != bufDone || f.w.Stats().Late != 1 {
		t.Fatal("state")
	}
}

func TestWindowGuardNone(t *testing.T) {
	f := newFixture(t, WindowOptions{Guard: GuardNone})
	f.post(10, PostOptions{})
	f.flush()
	f.arrive(0, 10, arriveCounted)
	_, unbind, pub := f.w.takeActions()
	if len(unbind) != 0 || len(pub) != 1 {
		t.Fatalf("unbind %d published %d: GuardNone publishes at once", len(unbind), len(pub))
	}
	f.arrive(0, 3, arriveStale)
	if f.w.Stats().Stale != 1 {
		t.Fatal("late write not counted")
	}
}

func TestWindowIncEpoch(t *testing.T) {
	f := newFixture(t, WindowOptions{})
	if _, err := f.w.incEpoch(); !errors.Is(err, ErrNoBuffer) {
		t.Fatalf("IncEpoch with nothing posted: %v", err)
	}
	b := f.post(1000, PostOptions{})
	f.post(1000, PostOptions{})
	f.flush()
	f.arrive(0, 123, arriveCounted)
	got, err := f.w.incEpoch()
	if err != nil || got != b {
		t.Fatal(err)
	}
	f.arrive(0, 7, arriveLate) // lands before the unbind completes: included
	f.flush()
	if len(f.pubs) != 1 || f.pubs[0].Len != 130 || f.pubs[0].Flags != FlagPartial|FlagLate {
		t.Fatalf("published %+v", f.pubs)
	}
	if f.w.head != 1 || f.w.Stats().EpochsCompleted != 1 {
		t.Fatal("epoch not incremented")
	}
	// IncEpoch on a head already completing returns it without a second unbind.
	f.arrive(1, 1000, arriveCounted)
	b1, err := f.w.incEpoch()
	if err != nil || b1.gen != 1 {
		t.Fatal(err)
	}
	_, unbind, _ := f.w.takeActions()
	if len(unbind) != 1 {
		t.Fatalf("%d unbinds", len(unbind))
	}
	f.w.unbound(unbind[0])
	f.flush()
	if f.pubs[1].Flags != 0 {
		t.Fatalf("flags %v: the threshold ended it, not IncEpoch", f.pubs[1].Flags)
	}
}

func TestWindowRewindAndRecycle(t *testing.T) {
	f := newFixture(t, WindowOptions{Keep: 2})
	bufs := []*buffer{f.post(8, PostOptions{}), f.post(8, PostOptions{}), f.post(8, PostOptions{OneTime: true})}
	f.flush()
	for g := uint64(0); g < 3; g++ {
		f.arrive(g, 8, arriveCounted)
	}
	f.flush()
	if r := f.w.rewind(5); len(r) != 2 || r[0].Epoch != 2 || r[1].Epoch != 1 || r[0].Flags != FlagOneTime {
		t.Fatalf("rewind %+v", r)
	}
	// Gen 0 left the ring but is held: not re-posted.
	if f.w.Stats().Posted != 0 || f.w.Stats().Held != 3 {
		t.Fatalf("stats %+v", f.w.Stats())
	}
	if err := f.w.release(bufs[0]); err != nil {
		t.Fatal(err)
	}
	if err := f.w.release(bufs[0]); err == nil {
		t.Fatal("double release accepted")
	}
	f.flush()
	if bufs[0].gen != 3 || bufs[0].state != bufQueued || !bufs[0].bound {
		t.Fatalf("released buffer out of the ring not re-posted: gen %d %v", bufs[0].gen, bufs[0].state)
	}
	// Gen 1 is released but still in the ring: kept intact.
	if err := f.w.release(bufs[1]); err != nil {
		t.Fatal(err)
	}
	f.flush()
	if bufs[1].state != bufDone {
		t.Fatal("a buffer in the rewind ring was re-posted")
	}
	seqBefore := bufs[0].comp.Seq()
	f.arrive(3, 8, arriveCounted) // pushes gen 1 out of the ring: re-posted as gen 4
	f.flush()
	if bufs[1].gen != 4 || bufs[1].state != bufQueued {
		t.Fatalf("gen %d %v", bufs[1].gen, bufs[1].state)
	}
	if rec, _ := bufs[0].comp.Load(); rec.Epoch != 3 || bufs[0].comp.Seq() != seqBefore+2 {
		t.Fatalf("re-used completion: %+v", rec)
	}
	// The one-time buffer leaves the ring and is never re-posted.
	if err := f.w.release(bufs[2]); err != nil {
		t.Fatal(err)
	}
	f.arrive(4, 8, arriveCounted)
	f.flush()
	if bufs[2].state != bufDone || bufs[2].inKept {
		t.Fatalf("one-time buffer %v kept %v", bufs[2].state, bufs[2].inKept)
	}
	if r := f.w.rewind(2); r[0].Epoch != 4 || r[1].Epoch != 3 {
		t.Fatalf("rewind %+v", r)
	}
}

func TestWindowClose(t *testing.T) {
	for _, mode := range []CloseMode{CloseNack, CloseSilent} {
		f := newFixture(t, WindowOptions{CloseMode: mode})
		f.post(10, PostOptions{})
		f.post(10, PostOptions{})
		f.flush()
		f.arrive(0, 4, arriveCounted)
		f.post(10, PostOptions{}) // bind still pending when Close comes
		if !f.w.close() || f.w.close() {
			t.Fatal("close not idempotent")
		}
		f.flush()
		if len(f.pubs) != 3 {
			t.Fatalf("%d records after close", len(f.pubs))
		}
		for i, r := range f.pubs {
			if r.Flags&FlagClosed == 0 || r.Epoch != uint64(i) {
				t.Fatalf("record %d: %+v", i, r)
			}
		}
		if f.pubs[0].Len != 4 {
			t.Fatalf("partial length %d", f.pubs[0].Len)
		}
		if _, err := f.w.post(0x1, 10, PostOptions{}, nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("post after close: %v", err)
		}
		if _, err := f.w.incEpoch(); !errors.Is(err, ErrClosed) {
			t.Fatalf("IncEpoch after close: %v", err)
		}
		f.arrive(1, 1, arriveClosed)
		want := wire.StateClosedNack
		if mode == CloseSilent {
			want = wire.StateClosedSilent
		}
		if e := f.w.entry(0); e.State != want || e.NDesc != 0 {
			t.Fatalf("entry %+v", e)
		}
		f.w.knock(wire.KnockNack, 1)
		f.w.knock(wire.KnockDrop, 1)
		f.w.knock(wire.KnockDrop, 1)
		if s := f.w.Stats(); s.Nacks != 1 || s.Drops != 2 || s.EpochsCompleted != 0 || s.Posted != 0 {
			t.Fatalf("stats %+v", s)
		}
		// Released buffers of a closed window are not re-posted.
		for b := range f.w.held {
			if err := f.w.release(b); err != nil {
				t.Fatal(err)
			}
			if b.state != bufDone {
				t.Fatal("buffer re-posted to a closed window")
			}
			if !b.retired || len(f.w.waiting) != 0 {
				t.Fatal("a buffer released after close waits for an epoch that never comes")
			}
			select {
			case <-b.done:
			default:
				t.Fatal("a wait on a buffer released after close would block")
			}
		}
		if bind, _, _ := f.w.takeActions(); len(bind) != 0 {
			t.Fatal("bind after close")
		}
	}
}

func TestWindowPostErrors(t *testing.T) {
	if _, err := newWindowState(1, WindowOptions{Kind: EpochOps}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ops window without threshold: %v", err)
	}
	if _, err := newWindowState(1, WindowOptions{Kind: 9}); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if _, err := newWindowState(1, WindowOptions{Keep: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if _, err := newWindowState(1, WindowOptions{Threshold: 10, Share: 11}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("share above the threshold: %v", err)
	}
	if w, err := newWindowState(1, WindowOptions{Threshold: 10, Share: 5}); err != nil || w.entry(1).Share != 5 {
		t.Fatalf("share of half the threshold: %v", err)
	}
	w, _ := newWindowState(1, WindowOptions{Threshold: 100, MaxPosted: 2})
	if _, err := w.post(1, 50, PostOptions{}, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("threshold beyond the buffer: %v", err)
	}
	if _, err := w.post(1, 0, PostOptions{}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if _, err := w.post(1, 50, PostOptions{Threshold: 50}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := w.post(1, 100, PostOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := w.post(1, 100, PostOptions{}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("beyond MaxPosted: %v", err)
	}
	if err := w.release(w.pending[0]); !errors.Is(err, ErrInvalid) {
		t.Fatalf("release of a pending buffer: %v", err)
	}
}

// Arrivals for many epochs, from several senders, in random order: every
// epoch is handed over exactly once, in order, with the right counts.
func TestWindowRandomOrder(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		kind := EpochBytes
		if seed%2 == 1 {
			kind = EpochOps
		}
		const epochs, puts = 12, 5
		o := WindowOptions{Kind: kind, Keep: 3} // bytes: the buffer length
		if kind == EpochOps {
			o.Threshold = puts
		}
		f := newFixture(t, o)
		type arrival struct{ gen, n uint64 }
		var arr []arrival
		for g := uint64(0); g < epochs; g++ {
			f.post(puts*10, PostOptions{})
			for p := 0; p < puts; p++ {
				arr = append(arr, arrival{g, 10})
			}
		}
		f.flush()
		rng.Shuffle(len(arr), func(i, j int) { arr[i], arr[j] = arr[j], arr[i] })
		for _, a := range arr {
			if r := f.w.arrive(a.gen, a.n); r != arriveCounted {
				t.Fatalf("seed %d: %v", seed, r)
			}
			if rng.IntN(3) == 0 {
				f.flush() // unbinds complete at random moments
			}
		}
		f.flush()
		if len(f.pubs) != epochs {
			t.Fatalf("seed %d: %d epochs handed over", seed, len(f.pubs))
		}
		for i, r := range f.pubs {
			if r.Epoch != uint64(i) || r.Len != puts*10 || r.Ops != puts || r.Flags != 0 {
				t.Fatalf("seed %d: record %d %+v", seed, i, r)
			}
		}
	}
}

// With more buffers posted than senders see, only the first MaxDescs are
// bound; at each epoch's end the completed buffer's window is lent to the
// buffer that moves up, so an epoch costs one bind and no unbind, and a
// released buffer at the tail needs none until it moves up.
func TestWindowLendsWindows(t *testing.T) {
	f := newFixture(t, WindowOptions{Threshold: 10})
	var bs []*buffer
	for i := 0; i < wire.MaxDescs+2; i++ {
		bs = append(bs, f.post(10, PostOptions{}))
	}
	bind, unbind, _ := f.w.takeActions()
	if len(bind) != wire.MaxDescs || len(unbind) != 0 {
		t.Fatalf("posting %d buffers: %d binds, %d unbinds; want %d, 0", len(bs), len(bind), len(unbind), wire.MaxDescs)
	}
	for _, a := range bind {
		f.rkey++
		f.w.bound(a.b, wire.Desc{Addr: a.b.addr, RKey: f.rkey})
	}
	for gen := uint64(0); gen < 12; gen++ {
		f.arrive(gen, 10, arriveCounted)
		bind, unbind, _ := f.w.takeActions()
		if len(bind) != 1 || len(unbind) != 0 || bind[0].from == nil || bind[0].from.gen != gen {
			t.Fatalf("epoch %d: binds %+v, unbinds %d; want one bind lent from the completed buffer", gen, bind, len(unbind))
		}
		f.rkey++
		f.w.unbound(bind[0].from)
		f.w.bound(bind[0].b, wire.Desc{Addr: bind[0].b.addr, RKey: f.rkey})
		if e := f.w.entry(1); e.Head != gen+1 || e.NDesc != wire.MaxDescs {
			t.Fatalf("epoch %d: entry %+v", gen, e)
		}
		done := bs[gen%uint64(len(bs))]
		if done.state != bufDone || done.rec.Epoch != gen {
			t.Fatalf("epoch %d not handed over: state %v record %+v", gen, done.state, done.rec)
		}
		if err := f.w.release(done); err != nil {
			t.Fatal(err)
		}
		if bind, unbind, _ := f.w.takeActions(); len(bind) != 0 || len(unbind) != 0 {
			t.Fatalf("release after epoch %d: %d binds, %d unbinds; want none (the buffer is at the tail)", gen, len(bind), len(unbind))
		}
	}
	// Close unbinds what is bound and what is being bound; the buffers at
	// the tail were never bound.
	f.w.close()
	f.flush()
	for _, b := range bs {
		if b.state != bufDone {
			t.Fatalf("after close: buffer of epoch %d in state %v", b.gen, b.state)
		}
	}
}

func TestSenderKeepsUp(t *testing.T) {
	d := func(k uint32) wire.Desc { return wire.Desc{Addr: uint64(k) << 12, RKey: k, Len: 64, Threshold: 64} }
	p := wire.Entry{Seq: 10, Mailbox: 7, Incarnation: 1, State: wire.StateOpen, Kind: wire.EpochBytes, NDesc: 3, Head: 5,
		Descs: [wire.MaxDescs]wire.Desc{d(5), d(6), d(7)}}
	next := func(head uint64, descs ...wire.Desc) wire.Entry {
		e := p
		e.Seq, e.Head, e.NDesc = p.Seq+2, head, uint16(len(descs))
		e.Descs = [wire.MaxDescs]wire.Desc{}
		copy(e.Descs[:], descs)
		return e
	}
	for _, c := range []struct {
		name string
		e    wire.Entry
		want bool
	}{
		{"one epoch on, two descriptors left", next(6, d(6), d(7), d(8)), true},
		{"two epochs on, one descriptor left", next(7, d(7), d(8), d(9)), false},
		{"head unchanged, a descriptor re-keyed", next(5, d(5), d(60), d(7)), false},
		{"one epoch on, the next descriptor re-keyed", next(6, d(6), d(70), d(8)), false},
		{"one epoch on, the next one not bound yet", next(6, d(6)), false},
		{"closed", func() wire.Entry { e := next(6, d(6), d(7), d(8)); e.State = wire.StateClosedNack; return e }(), false},
		{"another incarnation", func() wire.Entry { e := next(6, d(6), d(7), d(8)); e.Incarnation++; return e }(), false},
	} {
		if got := senderKeepsUp(p, c.e); got != c.want {
			t.Errorf("%s: senderKeepsUp = %v, want %v", c.name, got, c.want)
		}
	}
	if senderKeepsUp(wire.Entry{}, next(6, d(6), d(7), d(8))) {
		t.Error("nothing pushed yet: the entry must be pushed")
	}

	// A counted window's entry with Through: the sender keeps up until it
	// is down to the last generation derived.
	md := func(g uint64) wire.Desc {
		return wire.Desc{Addr: wire.MailboxAddr(g), RKey: 0xf0000100, Len: 64, Threshold: 64}
	}
	mbox := func(seq, head, through uint64) wire.Entry {
		e := wire.Entry{Seq: seq, Mailbox: 7, Incarnation: 1, State: wire.StateOpen, Kind: wire.EpochBytes, Flags: wire.EntryCounted,
			NDesc: wire.MaxDescs, Head: head, Through: through}
		for i := range wire.MaxDescs {
			e.Descs[i] = md(head + uint64(i))
		}
		return e
	}
	mp := mbox(20, 5, 30)
	for _, c := range []struct {
		head, through uint64
		want          bool
	}{
		{20, 40, true},  // past the pushed descriptors, within its Through
		{29, 40, true},  // two derived generations left
		{30, 40, false}, // the last one
		{20, 25, false}, // the receiver describes fewer now (cannot happen: they were registered)
	} {
		if got := senderKeepsUp(mp, mbox(22, c.head, c.through)); got != c.want {
			t.Errorf("through %d, head %d, now through %d: senderKeepsUp = %v, want %v", mp.Through, c.head, c.through, got, c.want)
		}
	}
	f := newFixture(t, WindowOptions{Threshold: 10})
	f.post(10, PostOptions{})
	if _, err := f.w.incEpoch(); err != nil || !f.w.mustPush {
		t.Fatalf("IncEpoch: err %v, mustPush %v; want the next entry pushed", err, f.w.mustPush)
	}
}

// Get serves only kept epochs, and every buffer that stops being kept is
// hidden (its read-only window unbound) in the same flush that re-posts
// it, before its bind.
func TestWindowKeptForGet(t *testing.T) {
	f := newFixture(t, WindowOptions{Keep: 2})
	if _, err := f.w.keptBuffer(LastEpoch); !errors.Is(err, ErrNoBuffer) {
		t.Fatalf("no epoch yet: %v", err)
	}
	bufs := []*buffer{f.post(8, PostOptions{}), f.post(8, PostOptions{}), f.post(8, PostOptions{OneTime: true})}
	f.flush()
	if _, err := f.w.keptBuffer(0); !errors.Is(err, ErrNoBuffer) {
		t.Fatalf("epoch 0 before it completed: %v", err)
	}
	for g := uint64(0); g < 3; g++ {
		f.arrive(g, 8, arriveCounted)
	}
	f.flush()
	if b, err := f.w.keptBuffer(LastEpoch); err != nil || b != bufs[2] {
		t.Fatalf("last: %v %v", b, err)
	}
	if b, err := f.w.keptBuffer(1); err != nil || b != bufs[1] {
		t.Fatalf("epoch 1: %v %v", b, err)
	}
	if _, err := f.w.keptBuffer(0); !errors.Is(err, ErrStale) {
		t.Fatalf("epoch 0 out of the ring: %v", err)
	}
	if _, err := f.w.keptBuffer(3); !errors.Is(err, ErrNoBuffer) {
		t.Fatalf("epoch 3: %v", err)
	}
	if h := f.w.takeHides(); len(h) != 1 || h[0] != bufs[0] {
		t.Fatalf("hides %v", h)
	}
	// A released one-time buffer is the application's: hidden at once.
	if err := f.w.release(bufs[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.w.keptBuffer(2); !errors.Is(err, ErrStale) {
		t.Fatalf("released one-time epoch: %v", err)
	}
	if h := f.w.takeHides(); len(h) != 1 || h[0] != bufs[2] {
		t.Fatalf("hides %v", h)
	}
	f2 := newFixture(t, WindowOptions{})
	f2.post(8, PostOptions{})
	f2.flush()
	f2.arrive(0, 8, arriveCounted)
	f2.flush()
	if _, err := f2.w.keptBuffer(LastEpoch); !errors.Is(err, ErrStale) {
		t.Fatalf("Keep 0: %v", err)
	}
}

// TestWindowFail: when the endpoint fails, a window hands over a buffer
// whose unbind will never complete and every buffer still posted, with
// the bytes that arrived and FlagFailed, drops the actions not yet
// dispatched, and refuses posts and IncEpoch with ErrFailed.
func TestWindowFail(t *testing.T) {
	f := newFixture(t, WindowOptions{Kind: EpochBytes})
	b0 := f.post(100, PostOptions{})
	b1 := f.post(100, PostOptions{})
	f.flush()
	f.arrive(0, 100, arriveCounted) // b0 completes: its unbind is asked for
	f.arrive(1, 30, arriveCounted)
	if b0.state != bufCompleting {
		t.Fatalf("b0 state %v before the failure", b0.state)
	}
	b2 := f.post(100, PostOptions{}) // its bind is asked for, never done
	f.w.fail()
	f.w.fail() // idempotent
	if bind, unbind, _ := f.w.takeActions(); len(bind)+len(unbind) != 0 {
		t.Fatalf("actions left after fail: %d binds, %d unbinds", len(bind), len(unbind))
	}
	for i, c := range []struct {
		b   *buffer
		len uint64
	}{{b0, 100}, {b1, 30}, {b2, 0}} {
		if c.b.state != bufDone || c.b.rec.Len != c.len || c.b.rec.Flags&(FlagFailed|FlagClosed) != FlagFailed|FlagClosed || c.b.rec.Epoch != uint64(i) {
			t.Errorf("buffer %d: state %v, record %+v", i, c.b.state, c.b.rec)
		}
		select {
		case <-c.b.done:
		default:
			t.Errorf("buffer %d: done not closed", i)
		}
	}
	if _, err := f.w.post(0x900000, 100, PostOptions{}, f.slab.get()); !errors.Is(err, ErrFailed) {
		t.Errorf("post after fail: %v", err)
	}
	if _, err := f.w.incEpoch(); !errors.Is(err, ErrFailed) {
		t.Errorf("IncEpoch after fail: %v", err)
	}
	if e := f.w.entry(1); e.State != wire.StateClosedNack {
		t.Errorf("entry after fail: %+v", e)
	}
}

func TestAppendOnce(t *testing.T) {
	ws := make([]*Window, 7)
	for i := range ws {
		ws[i] = &Window{}
	}
	got := appendOnce(nil, nil)
	for _, w := range append(ws, ws[0], ws[5]) {
		got = appendOnce(got, w)
	}
	if len(got) != len(ws) {
		t.Fatalf("%d windows, want %d", len(got), len(ws))
	}
	for i, w := range got {
		if w != ws[i] {
			t.Fatalf("window %d out of order", i)
		}
	}
}

// On a counted window the module writes a buffer's record before it raises
// the window's done counter; a head buffer whose record is out counts as
// published (what Spin saw on another CPU), one holding an older record of
// its completion slot does not.
func TestWindowHeadPublished(t *testing.T) {
	f := newFixture(t, WindowOptions{})
	f.w.counted = true
	b := f.post(64, PostOptions{})
	if f.w.headPublished() {
		t.Fatal("published before registration")
	}
	b.registered = true
	if f.w.headPublished() {
		t.Fatal("published before its record")
	}
	// An older publication in the slot (another buffer used it), even of
	// the same epoch number, is not this buffer's.
	b.comp.publish(Record{Epoch: b.gen + 1, Len: 1})
	if f.w.headPublished() {
		t.Fatal("published by a record of another epoch")
	}
	b.armedSeq = b.comp.publish(Record{Epoch: b.gen, Len: 2})
	if f.w.headPublished() {
		t.Fatal("published by a record older than the buffer's arming")
	}
	b.comp.publish(Record{Epoch: b.gen, Len: 64, Ops: 2, Cap: 64})
	if !f.w.headPublished() {
		t.Fatal("its record is out, but not published")
	}
	f.w.countedUpTo(f.w.head + 1)
	if b.state != bufDone || b.rec.Len != 64 || b.rec.Ops != 2 || f.w.head != 1 {
		t.Fatalf("after countedUpTo: state %v, record %+v, head %d", b.state, b.rec, f.w.head)
	}
	if f.w.headPublished() {
		t.Fatal("no buffer is pending, yet the head is published")
	}
}
