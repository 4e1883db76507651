package rvma

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// This file simulates the protocol of docs/rvma.md end to end, with no
// RDMA: a fake NIC with type 1 memory windows checked per packet (as rxe
// does), RC stripes that keep order within themselves and none across
// them, unbinds and pushed entries that complete at random moments, and
// senders that choose epochs with senderView. It checks the guarantees the
// lab tests will check on real traffic: every epoch is handed over exactly
// once and in order with its true counts, no byte changes in a buffer
// after it was handed over, and no put is lost (each is counted exactly
// once or refused as stale and retried).

type simPacket struct {
	put  *simPut
	off  uint64 // offset in the buffer
	data []byte
	last bool
}

type simPut struct {
	sender *simSender
	gen    uint64
	desc   Desc
	off    uint64
	data   []byte
	failed bool
	seq    int // issue order
}

type simSender struct {
	id    int
	view  *senderView
	todo  []simWork // puts not yet issued (or to re-issue)
	done  int
	stale int
}

type simWork struct {
	off  uint64
	data []byte
}

type simMW struct {
	mem   []byte
	valid bool
}

type sim struct {
	t       *testing.T
	rng     *rand.Rand
	w       *windowState
	mws     map[uint32]*simMW
	mem     map[*buffer][]byte
	nextKey uint32
	stripes [][]simPacket
	unbinds []*buffer
	notices []struct {
		s *simSender
		e Entry
	}
	senders  []*simSender
	lastSeq  uint64
	snaps    map[uint64][]byte // epoch -> the buffer as handed over
	bufOf    map[uint64][]byte // epoch -> the buffer's memory
	recs     []Record
	mtu      int
	placedBy map[*simPut]bool
	issued   int
	arrivals []int // issue numbers in arrival (completion) order
}

func newSim(t *testing.T, seed uint64, o WindowOptions, stripes int) *sim {
	w, err := newWindowState(0x42, o)
	if err != nil {
		t.Fatal(err)
	}
	return &sim{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b9)), w: w, mws: map[uint32]*simMW{},
		mem: map[*buffer][]byte{}, nextKey: 0x100, stripes: make([][]simPacket, stripes),
		snaps: map[uint64][]byte{}, bufOf: map[uint64][]byte{}, mtu: 64, placedBy: map[*simPut]bool{}}
}

func (s *sim) post(n int, cap uint64) {
	for i := 0; i < n; i++ {
		b, err := s.w.post(uint64(0x100000*(len(s.mem)+1)), cap, PostOptions{}, nil)
		if err != nil {
			s.t.Fatal(err)
		}
		s.mem[b] = make([]byte, cap)
	}
	s.actions()
}

// actions carries out the window's outbox: binds at once, unbinds later,
// hand-overs recorded, and the entry pushed to every sender when it changed.
func (s *sim) actions() {
	for {
		bind, unbind, pub := s.w.takeActions()
		if len(bind)+len(unbind)+len(pub) == 0 {
			break
		}
		for _, b := range bind {
			s.nextKey++
			s.mws[s.nextKey] = &simMW{mem: s.mem[b], valid: true}
			s.w.bound(b, Desc{Addr: b.addr, RKey: s.nextKey})
		}
		s.unbinds = append(s.unbinds, unbind...)
		for _, b := range pub {
			s.recs = append(s.recs, b.rec)
			s.snaps[b.rec.Epoch] = bytes.Clone(s.mem[b])
			s.bufOf[b.rec.Epoch] = s.mem[b]
		}
	}
	if s.w.seq != s.lastSeq {
		s.lastSeq = s.w.seq
		e := s.w.entry(1)
		for _, snd := range s.senders {
			s.notices = append(s.notices, struct {
				s *simSender
				e Entry
			}{snd, e})
		}
	}
}

// issue lets a sender issue its next put if its view allows.
func (s *sim) issue(snd *simSender) bool {
	if len(snd.todo) == 0 {
		return false
	}
	wk := snd.todo[0]
	gen, d, err := snd.view.target(wk.off, uint64(len(wk.data)))
	if errors.Is(err, ErrNoBuffer) {
		return false // wait for a notice
	}
	if err != nil {
		s.t.Fatalf("sender %d: %v", snd.id, err)
	}
	snd.todo = snd.todo[1:]
	snd.view.commit(gen, uint64(len(wk.data)))
	p := &simPut{sender: snd, gen: gen, desc: d, off: wk.off, data: wk.data, seq: s.issued}
	s.issued++
	st := s.rng.IntN(len(s.stripes))
	for o := 0; o < len(wk.data); o += s.mtu {
		end := min(o+s.mtu, len(wk.data))
		s.stripes[st] = append(s.stripes[st], simPacket{put: p, off: wk.off + uint64(o), data: wk.data[o:end], last: end == len(wk.data)})
	}
	return true
}

// deliver processes the head packet of a stripe as the responder would.
func (s *sim) deliver(st int) {
	pk := s.stripes[st][0]
	s.stripes[st] = s.stripes[st][1:]
	p := pk.put
	mw := s.mws[p.desc.RKey]
	if mw == nil || !mw.valid {
		// Remote access error: the put fails, the stripe's queue pair goes
		// to error and what was queued behind it is flushed, never placed.
		p.failed = true
		p.sender.stale++
		p.sender.view.stale(p.gen)
		p.sender.todo = append(p.sender.todo, simWork{p.off, p.data})
		flushed := map[*simPut]bool{p: true}
		for _, q := range s.stripes[st] {
			if !flushed[q.put] {
				flushed[q.put] = true
				q.put.failed = true
				q.put.sender.view.abort(q.put.gen, uint64(len(q.put.data)))
				q.put.sender.todo = append(q.put.sender.todo, simWork{q.put.off, q.put.data})
			}
		}
		s.stripes[st] = nil
		return
	}
	copy(mw.mem[pk.off:], pk.data)
	if pk.last {
		s.placedBy[p] = true
		s.arrivals = append(s.arrivals, p.seq)
		p.sender.done++
		r := s.w.arrive(ExpandGen(s.w.head, GenLow(p.gen)), uint64(len(p.data)))
		if r != arriveCounted && r != arriveLate {
			s.t.Fatalf("a placed put was %v", r)
		}
		s.actions()
	}
}

// run executes random events until every sender is done.
func (s *sim) run(total int) {
	for steps := 0; ; steps++ {
		if steps > 1_000_000 {
			for _, snd := range s.senders {
				s.t.Logf("sender %d: next %d todo %d done %d entry head %d ndesc %d seq %d", snd.id, snd.view.next(), len(snd.todo), snd.done, snd.view.entry.Head, snd.view.entry.NDesc, snd.view.entry.Seq)
			}
			s.t.Logf("window head %d pending %d seq %d notices %d unbinds %d", s.w.head, len(s.w.pending), s.w.seq, len(s.notices), len(s.unbinds))
			s.t.Fatal("simulation does not terminate")
		}
		done := 0
		for _, snd := range s.senders {
			done += snd.done
		}
		if done == total {
			break
		}
		var evs []func()
		for _, snd := range s.senders {
			snd := snd
			if len(snd.todo) > 0 {
				evs = append(evs, func() { s.issue(snd) })
			}
		}
		for i := range s.stripes {
			i := i
			if len(s.stripes[i]) > 0 {
				evs = append(evs, func() { s.deliver(i) })
			}
		}
		if len(s.unbinds) > 0 {
			evs = append(evs, func() {
				i := s.rng.IntN(len(s.unbinds))
				b := s.unbinds[i]
				s.unbinds = append(s.unbinds[:i], s.unbinds[i+1:]...)
				s.mws[b.desc.RKey].valid = false
				s.w.unbound(b)
				s.actions()
			})
		}
		if len(s.notices) > 0 {
			evs = append(evs, func() {
				i := s.rng.IntN(len(s.notices)) // notices overtake each other too
				n := s.notices[i]
				s.notices = append(s.notices[:i], s.notices[i+1:]...)
				n.s.view.update(n.e)
			})
		}
		if len(evs) == 0 {
			s.t.Fatalf("deadlock: %d of %d puts done", done, total)
		}
		evs[s.rng.IntN(len(evs))]()
	}
	// Let the last unbinds complete so the last epochs are handed over.
	for len(s.unbinds) > 0 {
		b := s.unbinds[0]
		s.unbinds = s.unbinds[1:]
		s.mws[b.desc.RKey].valid = false
		s.w.unbound(b)
		s.actions()
	}
}

// checkImmutable verifies that no buffer changed after its hand-over.
func (s *sim) checkImmutable() {
	for e, snap := range s.snaps {
		if !bytes.Equal(snap, s.bufOf[e]) {
			s.t.Fatalf("epoch %d changed after it was handed over", e)
		}
	}
	for i, r := range s.recs {
		if r.Epoch != uint64(i) {
			s.t.Fatalf("hand-over %d is epoch %d: out of order", i, r.Epoch)
		}
	}
}

func pattern(tag, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(tag*31 + i)
	}
	return b
}

// One sender streams through many epochs over 4 stripes: packets and puts
// arrive in any order, yet every epoch completes in order with exactly its
// bytes, and the sender never targets a completed epoch.
func TestSimStreamStriped(t *testing.T) {
	inversions := 0
	for seed := uint64(1); seed <= 40; seed++ {
		const epochs, perEpoch, chunk = 10, 4, 200
		for _, kind := range []EpochKind{EpochBytes, EpochOps} {
			o := WindowOptions{Kind: kind}
			if kind == EpochOps {
				o.Threshold = perEpoch
			}
			s := newSim(t, seed, o, 4)
			snd := &simSender{id: 0, view: newSenderView(0x42, 1)}
			s.senders = []*simSender{snd}
			s.post(3, perEpoch*chunk)
			// The receiver re-posts as epochs complete (not modelled as
			// recycling: fresh buffers), keeping 3 ahead.
			for e := 0; e < epochs; e++ {
				order := s.rng.Perm(perEpoch) // puts of an epoch in random order
				if seed%3 == 0 {
					for i := range order {
						order[i] = perEpoch - 1 - i // reverse
					}
				}
				for _, p := range order {
					snd.todo = append(snd.todo, simWork{uint64(p * chunk), pattern(e*perEpoch+p, chunk)})
				}
			}
			s.actions()
			posted := 3
			for steps := 0; snd.done < epochs*perEpoch; steps++ {
				if posted < epochs && int(s.w.head)+3 > posted {
					s.post(1, perEpoch*chunk)
					posted++
				}
				s.run(snd.done + 1)
			}
			s.run(epochs * perEpoch)
			s.checkImmutable()
			for i := 1; i < len(s.arrivals); i++ {
				if s.arrivals[i] < s.arrivals[i-1] {
					inversions++
				}
			}
			if len(s.recs) != epochs || snd.stale != 0 {
				t.Fatalf("seed %d %v: %d epochs, %d stale", seed, kind, len(s.recs), snd.stale)
			}
			for e, r := range s.recs {
				if r.Len != perEpoch*chunk || r.Ops != perEpoch || r.Flags != 0 {
					t.Fatalf("seed %d %v: record %+v", seed, kind, r)
				}
				want := make([]byte, 0, perEpoch*chunk)
				for p := 0; p < perEpoch; p++ {
					want = append(want, pattern(e*perEpoch+p, chunk)...)
				}
				if !bytes.Equal(s.snaps[uint64(e)], want) {
					t.Fatalf("seed %d %v: epoch %d has the wrong bytes", seed, kind, e)
				}
			}
		}
	}
	if inversions == 0 {
		t.Fatal("puts always completed in issue order: the stripes did not reorder anything")
	}
	t.Logf("%d puts completed before one issued earlier", inversions)
}

// Two senders race into one-put epochs: the first put of an epoch
// completes it, the other either lands before the unbind (counted as late,
// included) or is refused by the "NIC" and retried into a later epoch.
// Nothing is lost, nothing is counted twice, and no handed-over buffer
// changes.
func TestSimOvershootAndStale(t *testing.T) {
	staleSeen, lateSeen := 0, 0
	for seed := uint64(1); seed <= 60; seed++ {
		const n, chunk = 12, 150
		s := newSim(t, seed, WindowOptions{Kind: EpochBytes, Threshold: chunk}, 3)
		for i := 0; i < 2; i++ {
			snd := &simSender{id: i, view: newSenderView(0x42, 1)}
			for p := 0; p < n; p++ {
				snd.todo = append(snd.todo, simWork{uint64(i * chunk), pattern(i*1000+p, chunk)})
			}
			s.senders = append(s.senders, snd)
		}
		s.post(4*n, 2*chunk)
		s.run(2 * n)
		s.checkImmutable()
		var bytesCounted uint64
		for _, r := range s.recs {
			bytesCounted += r.Len
			if r.Len < chunk {
				t.Fatalf("seed %d: epoch %d handed over with %d bytes", seed, r.Epoch, r.Len)
			}
			if r.Flags&FlagLate != 0 {
				lateSeen++
			}
		}
		if bytesCounted != 2*n*chunk {
			t.Fatalf("seed %d: %d bytes counted, %d put", seed, bytesCounted, 2*n*chunk)
		}
		for _, snd := range s.senders {
			staleSeen += snd.stale
		}
		st := s.w.Stats()
		if st.Puts != 2*n || st.Stale != 0 {
			t.Fatalf("seed %d: stats %+v", seed, st)
		}
	}
	if staleSeen == 0 || lateSeen == 0 {
		t.Fatalf("the simulation never exercised a refused put (%d) or a late one (%d)", staleSeen, lateSeen)
	}
	t.Logf("%d refused and retried, %d late epochs", staleSeen, lateSeen)
}

func (s *sim) String() string { return fmt.Sprintf("head %d", s.w.head) }
