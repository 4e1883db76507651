package rvma

import (
	"fmt"
	"slices"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Key rings of counted windows (docs/rvma.md, section 6).
//
// A buffer of a window the kernel module counts keeps ringKeys memory
// windows bound over it, and each of its generations is shown to senders
// with the next of their keys. The module lets into the buffer only the
// write messages sent with the current generation's key (kmod's keyed
// posts), so the keys of earlier generations, still bound, are refused
// there like writes into a closed gate, and a completed buffer needs no
// bind before it is posted again. Only once every key of the ring was
// used is the ring bound again (new keys: a type 1 bind changes its
// window's key), as one chain of binds. The binds that re-keyed each
// epoch before (one per epoch, each waking rxe's completer from the
// poster's system call) thus happen once in ringKeys epochs.
//
// A stale sender's key comes back only once each of the ring's windows
// has been bound again 256 times (an rxe key's variable byte): 256 times
// ringKeys generations of that buffer later.

// ringKeys is the number of memory windows, hence of generations between
// binds, of a re-posted buffer's key ring; a one-time buffer has one.
const ringKeys = 8

// keyRing is the memory windows bound over one buffer of a counted window
// and their keys, by slot. engine.mu guards it.
type keyRing struct {
	mws  []*verbs.MW
	keys []uint32
	left int // binds or unbinds of the ring still in flight
}

// bindRing binds b's key ring (again), taking its memory windows from the
// free ones or allocating them the first time; noteRingBound reports the
// keys once every bind completed.
func (e *engine) bindRing(w *Window, b *buffer) {
	mr := e.arenaOf(b.addr, b.cap)
	n := ringKeys
	if b.oneTime {
		n = 1
	}
	e.mu.Lock()
	r := e.rings[b]
	if r == nil {
		r = &keyRing{}
		e.rings[b] = r
	}
	for len(r.mws) < n && len(e.mws[mr]) > 0 {
		free := e.mws[mr]
		r.mws = append(r.mws, free[len(free)-1])
		e.mws[mr] = free[:len(free)-1]
	}
	need := n - len(r.mws)
	e.mu.Unlock()
	fresh := make([]*verbs.MW, 0, need)
	for range need {
		mw, err := e.pd.AllocMW(verbs.MWType1)
		if err != nil {
			e.fail(fmt.Errorf("rvma: memory window for window %v: %w", w.mailbox, err))
			return
		}
		fresh = append(fresh, mw)
	}
	e.mu.Lock()
	r.mws = append(r.mws, fresh...)
	r.keys = make([]uint32, len(r.mws))
	e.submitRing(bindOp{w: w, b: b, ring: r}, mr, b.cap)
}

// unbindRing unbinds b's key ring, if it has one (retire: the window is
// not told when it completes), and reports whether it had. The ring is
// forgotten at once; its memory windows go back to the free ones as their
// unbinds complete.
func (e *engine) unbindRing(w *Window, b *buffer, retire bool) bool {
	mr := e.arenaOf(b.addr, b.cap)
	e.mu.Lock()
	r := e.rings[b]
	delete(e.rings, b)
	if r == nil || len(r.mws) == 0 {
		e.mu.Unlock()
		return false
	}
	e.submitRing(bindOp{w: w, b: b, unbind: true, retire: retire, ring: r}, mr, 0)
	return true
}

// submitRing submits op once for each memory window of op.ring: a bind
// over length bytes of op.b, or with length 0 an unbind. It is called
// with e.mu held and releases it.
func (e *engine) submitRing(op bindOp, mr *verbs.MR, length uint64) {
	r := op.ring
	r.left = len(r.mws)
	mws := slices.Clone(r.mws)
	first := e.nextID + 1
	e.nextID += uint64(len(mws))
	e.mu.Unlock()
	for i, mw := range mws {
		op.slot, op.key = i, make(chan uint32, 1)
		e.submit(first+uint64(i), op, mw, mr, length)
	}
}

// ringDone takes the completion of one bind or unbind of a key ring: the
// last one of a bind reports the ring's keys, the last one of an unbind
// (unless retired) that the keys are dead.
func (e *engine) ringDone(op bindOp) {
	r := op.ring
	if op.unbind {
		mr := e.arenaOf(op.b.addr, op.b.cap)
		e.mu.Lock()
		e.mws[mr] = append(e.mws[mr], r.mws[op.slot])
		r.left--
		last := r.left == 0
		e.mu.Unlock()
		if last && !op.retire {
			op.w.noteUnbound(op.b)
		}
		return
	}
	key := <-op.key
	e.mu.Lock()
	r.keys[op.slot] = key
	r.left--
	var keys []uint32
	if r.left == 0 {
		keys = slices.Clone(r.keys)
	}
	e.mu.Unlock()
	if keys != nil {
		op.w.noteRingBound(op.b, keys)
	}
}
