package rvma

import (
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// The public constants repeat the wire's values: each expression below
// overflows, and fails to compile, if they differ.
const (
	_ = uint(ShownBuffers-wire.MaxDescs) + uint(wire.MaxDescs-ShownBuffers)
	_ = uint8(EpochBytes) - uint8(wire.EpochBytes) + (uint8(wire.EpochBytes) - uint8(EpochBytes))
	_ = uint8(EpochOps) - uint8(wire.EpochOps) + (uint8(wire.EpochOps) - uint8(EpochOps))
)

type bufState uint8

const (
	bufQueued     bufState = iota // posted; accepts puts once bound
	bufCompleting                 // ended (threshold, IncEpoch, Close); waiting for the unbind
	bufReady                      // unbound; waiting for earlier epochs to be handed over
	bufDone                       // handed over to the application
)

func (s bufState) String() string {
	return [...]string{"queued", "completing", "ready", "done"}[s]
}

// buffer is one posted buffer, across re-posts.
type buffer struct {
	addr, cap uint64
	oneTime   bool
	userTh    uint64 // PostOptions.Threshold

	gen       uint64
	threshold uint64
	state     bufState
	bound     bool
	binding   bool // a bind is scheduled or in flight
	desc      wire.Desc
	bytes     uint64
	ops       uint64
	flags     Flags
	rec       Record
	released  bool
	inKept    bool

	// registered: in a counted window (windowState.counted), the module
	// knows the buffer's generation.
	registered bool

	comp     *Completion
	armedSeq uint64        // comp's sequence when the buffer was (re-)posted
	done     chan struct{} // closed when the current (or, once released, the next) epoch is handed over
	waiting  bool          // released; done already belongs to the re-post to come
	retired  bool          // released and never to be re-posted (one-time, or the window closed)
}

// arriveResult is what the window made of an arrival.
type arriveResult uint8

const (
	arriveCounted arriveResult = iota // counted into its epoch
	arriveLate                        // counted into an epoch whose threshold was already reached (overshoot)
	arriveStale                       // the epoch was already handed over: not counted
	arriveClosed                      // the window is closed: not counted
	arriveUnknown                     // no such generation posted: not counted
)

func (r arriveResult) String() string {
	return [...]string{"counted", "late", "stale", "closed", "unknown"}[r]
}

// windowState is the receiver's state machine for one window. It does no
// I/O: the engine feeds it events (posts, binds, arrivals, unbinds,
// releases) and carries out the actions it leaves in its outbox (bind these
// buffers, unbind those, wake the waiters of those published). It is not
// safe for concurrent use; the engine serialises calls with a lock.
//
// Invariants: pending holds the buffers of generations head, head+1, ... in
// order; only pending[0] can be handed over, so epochs are handed over in
// order even when a later generation reaches its threshold first.
type windowState struct {
	mailbox Mailbox
	opts    WindowOptions
	state   wire.EntryState
	nextGen uint64
	head    uint64
	pending []*buffer
	kept    []*buffer // the last Keep handed over, oldest first
	held    map[*buffer]struct{}
	waiting map[*buffer]struct{} // released, waiting to leave the rewind ring to be re-posted
	seq     uint64               // entry sequence
	stats   WindowStats
	// mustPush: an epoch ended other than by senders' bytes reaching the
	// threshold (IncEpoch, close) since the entry was last pushed.
	mustPush bool
	// failed: the endpoint failed (fail); the window is closed too.
	failed bool
	// counted: the kernel module counts the window's puts and publishes
	// its records (docs/rvma.md, section 6); the state machine learns of
	// completions from it (counted) instead of counting arrivals.
	counted bool
	// mbkey: a counted window's mailbox key (kmod.CreateMailboxWindow):
	// senders write to it at an address naming the generation, the
	// module translates, and no memory window is bound.
	mbkey uint32

	toBind              []bindAction
	toUnbind, published []*buffer
	// Counted windows: buffers to register with the module (in generation
	// order, before their binds) and buffers to end there.
	toRegister []regAction
	toEnd      []endAction
	// toHide: kept buffers that stopped being readable by Get (they left
	// the rewind ring, or a one-time buffer was released): whatever
	// read-only window exposes one must be unbound before it is re-posted.
	toHide []*buffer
}

// bindAction asks the counter (the library) to bind a memory window over
// b (never in a counted window). When from is set, the window is the one
// bound over from, which has stopped accepting puts:
// the one bind both invalidates from's key and exposes b, and its
// completion reports both (unbound(from), then bound(b)).
type bindAction struct {
	b, from *buffer
}

func newWindowState(mb Mailbox, opts WindowOptions) (*windowState, error) {
	o, err := opts.normalize()
	if err != nil {
		return nil, err
	}
	return &windowState{mailbox: mb, opts: o, state: wire.StateOpen, held: map[*buffer]struct{}{},
		waiting: map[*buffer]struct{}{}, seq: 2}, nil
}

func (w *windowState) closed() bool { return w.state != wire.StateOpen }

// post queues a new buffer of capacity cap at address addr. Errors:
// ErrClosed, ErrInvalid (zero capacity, too many posted), ErrTooLarge (a
// byte threshold beyond the buffer).
func (w *windowState) post(addr, cap uint64, po PostOptions, comp *Completion) (*buffer, error) {
	if w.failed {
		return nil, fmt.Errorf("post to window %v: %w", w.mailbox, ErrFailed)
	}
	if w.closed() {
		return nil, fmt.Errorf("post to window %v: %w", w.mailbox, ErrClosed)
	}
	if cap == 0 || cap > 1<<32-1 {
		return nil, invalidf("buffer of %d bytes (1 to 4 GiB-1)", cap)
	}
	b := &buffer{addr: addr, cap: cap, oneTime: po.OneTime, userTh: po.Threshold, comp: comp}
	if _, err := w.threshold(b); err != nil {
		return nil, err
	}
	if len(w.pending) >= w.opts.MaxPosted {
		return nil, invalidf("window %v already has %d buffers posted", w.mailbox, len(w.pending))
	}
	w.enqueue(b)
	return b, nil
}

func (w *windowState) threshold(b *buffer) (uint64, error) {
	th := b.userTh
	if th == 0 {
		th = w.opts.Threshold
	}
	if w.opts.Kind == EpochBytes {
		if th == 0 {
			th = b.cap
		}
		if th > b.cap {
			return 0, fmt.Errorf("threshold of %d bytes for a buffer of %d: %w", th, b.cap, ErrTooLarge)
		}
	}
	return th, nil
}

func (w *windowState) enqueue(b *buffer) {
	b.threshold, _ = w.threshold(b)
	b.gen = w.nextGen
	w.nextGen++
	b.state, b.bound, b.binding, b.desc, b.registered = bufQueued, false, false, wire.Desc{}, false
	b.bytes, b.ops, b.flags, b.rec, b.released = 0, 0, 0, Record{}, false
	if b.oneTime {
		b.flags = FlagOneTime
	}
	if b.comp != nil {
		b.armedSeq = b.comp.Seq()
	}
	if !b.waiting {
		b.done = make(chan struct{})
	}
	b.waiting = false
	delete(w.waiting, b)
	w.pending = append(w.pending, b)
	if w.counted {
		w.showCounted()
	} else {
		w.topUp(nil)
	}
}

// settling reports whether a buffer senders are about to be shown is still
// being bound: the entry changes again when its bind completes (on rxe,
// within the bind call), so pushing it now would cost a second notice.
func (w *windowState) settling() bool {
	if w.closed() {
		return false
	}
	seen := 0
	for _, b := range w.pending {
		if b.state != bufQueued {
			continue
		}
		if seen++; seen > wire.MaxDescs {
			return false
		}
		if b.binding {
			return true
		}
	}
	return false
}

// topUp schedules binds for the buffers senders are shown (the first
// MaxDescs queued ones) that are neither bound nor being bound. Buffers
// further back are bound only when they move up, so a window with more
// buffers posted than senders see needs one bind per epoch, not two: from
// (a buffer that just stopped accepting puts, or nil) lends its memory
// window to the first buffer that needs one. It reports whether from's
// window was lent.
func (w *windowState) topUp(from *buffer) (lent bool) {
	if from != nil && !from.bound {
		from = nil // nothing to lend (its bind is still in flight, or it never had one)
	}
	seen := 0
	for _, b := range w.pending {
		if b.state != bufQueued {
			continue
		}
		if seen++; seen > wire.MaxDescs {
			break
		}
		if b.bound || b.binding {
			continue
		}
		b.binding = true
		w.toBind = append(w.toBind, bindAction{b: b, from: from})
		if from != nil {
			from.bound, from, lent = false, nil, true
		}
	}
	return lent
}

// lookup returns the pending buffer of generation gen.
func (w *windowState) lookup(gen uint64) *buffer {
	if gen < w.head || gen-w.head >= uint64(len(w.pending)) {
		return nil
	}
	return w.pending[gen-w.head]
}

// bound records that b's memory window is bound: senders may now target it.
func (w *windowState) bound(b *buffer, d wire.Desc) {
	if b.state != bufQueued || b.bound {
		return // ended before its bind completed: the unbind follows
	}
	d.Len, d.Threshold = uint32(b.cap), b.threshold
	b.bound, b.binding, b.desc = true, false, d
	w.changed()
}

// arrive counts a put of n bytes for generation gen.
func (w *windowState) arrive(gen, n uint64) arriveResult {
	if w.closed() {
		w.stats.Stale++
		return arriveClosed
	}
	if gen < w.head {
		w.stats.Stale++
		return arriveStale
	}
	b := w.lookup(gen)
	if b == nil {
		return arriveUnknown
	}
	b.bytes += n
	b.ops++
	w.stats.Puts++
	w.stats.Bytes += n
	if b.state != bufQueued {
		b.flags |= FlagLate
		w.stats.Late++
		return arriveLate
	}
	if w.reached(b) {
		w.end(b, 0)
	}
	return arriveCounted
}

func (w *windowState) reached(b *buffer) bool {
	if w.opts.Kind == EpochOps {
		return b.ops >= b.threshold
	}
	return b.bytes >= b.threshold
}

// end stops a queued buffer from accepting puts: it is unbound (or, with
// GuardNone, ready at once).
func (w *windowState) end(b *buffer, f Flags) {
	if b.state != bufQueued {
		return
	}
	b.flags |= f
	if f != 0 {
		w.mustPush = true // senders cannot count an epoch ended early
	}
	if w.counted {
		w.endCounted(b, f)
		w.changed()
		return
	}
	if w.opts.Guard == GuardNone {
		// Handed over at once; its window goes to the next buffer that
		// needs one (late writes fail from then on), or stays bound.
		b.state = bufReady
		w.topUp(b)
		w.handOver()
	} else {
		b.state = bufCompleting
		if !w.topUp(b) {
			w.toUnbind = append(w.toUnbind, b)
		}
	}
	w.changed()
}

// unbound records that b's memory window no longer accepts writes.
func (w *windowState) unbound(b *buffer) {
	if b.state != bufCompleting {
		return
	}
	b.bound = false
	b.state = bufReady
	w.handOver()
}

// handOver publishes every ready buffer at the head of the queue.
func (w *windowState) handOver() {
	for len(w.pending) > 0 && w.pending[0].state == bufReady {
		b := w.pending[0]
		w.pending[0] = nil
		w.pending = w.pending[1:]
		w.head++
		b.state = bufDone
		b.rec = Record{Epoch: b.gen, Addr: b.addr, Len: b.bytes, Ops: b.ops, Cap: b.cap, Flags: b.flags}
		if b.comp != nil && !b.registered {
			// The module published the record of a registered buffer.
			b.comp.publish(b.rec)
		}
		close(b.done)
		if b.flags&FlagClosed == 0 {
			w.stats.EpochsCompleted++
		}
		w.held[b] = struct{}{}
		w.published = append(w.published, b)
		if w.opts.Keep > 0 {
			b.inKept = true
			w.kept = append(w.kept, b)
			if len(w.kept) > w.opts.Keep {
				old := w.kept[0]
				w.kept[0] = nil
				w.kept = w.kept[1:]
				old.inKept = false
				w.toHide = append(w.toHide, old)
				w.recycle(old)
			}
		}
		w.changed()
	}
}

// recycle re-posts a buffer the application released once it has left the
// rewind ring, unless it is one-time or the window is closed.
func (w *windowState) recycle(b *buffer) {
	if b.state != bufDone || !b.released || b.inKept {
		return
	}
	if b.oneTime || w.closed() {
		return
	}
	w.enqueue(b)
	w.changed()
}

// incEpoch ends the head now (the paper's RVMA_Win_inc_epoch) and returns
// its generation. Errors: ErrClosed, ErrNoBuffer (nothing posted).
func (w *windowState) incEpoch() (*buffer, error) {
	if w.failed {
		return nil, fmt.Errorf("IncEpoch on window %v: %w", w.mailbox, ErrFailed)
	}
	if w.closed() {
		return nil, fmt.Errorf("IncEpoch on window %v: %w", w.mailbox, ErrClosed)
	}
	if len(w.pending) == 0 {
		return nil, fmt.Errorf("IncEpoch on window %v: %w", w.mailbox, ErrNoBuffer)
	}
	b := w.pending[0]
	w.end(b, FlagPartial)
	return b, nil
}

// retireWaiting ends the waits on released buffers that wait to be
// re-posted: the window closed, they have no next epoch.
func (w *windowState) retireWaiting() {
	for b := range w.waiting {
		b.retired = true
		close(b.done)
		delete(w.waiting, b)
	}
}

// fail hands every pending buffer over at once with FlagClosed and
// FlagFailed, without waiting for binds or unbinds that will never
// complete (the endpoint failed, and its links are down, so nothing
// arrives any more), and closes the window; actions not yet dispatched
// are dropped.
func (w *windowState) fail() {
	if w.failed {
		return
	}
	w.failed = true
	if !w.closed() {
		w.state = wire.StateClosedNack
	}
	w.retireWaiting()
	w.toBind, w.toUnbind, w.toHide = nil, nil, nil
	for _, b := range w.pending {
		if b.state == bufQueued || b.state == bufCompleting {
			b.flags |= FlagClosed | FlagFailed
			if w.counted && b.registered {
				// The module owns its record: it publishes it once ended.
				if b.state == bufQueued {
					w.toEnd = append(w.toEnd, endAction{b: b, gen: b.gen, flags: FlagClosed})
				}
				b.state = bufCompleting
				continue
			}
			b.state = bufReady
		}
	}
	w.handOver()
	w.changed()
}

// close ends every pending buffer (flag closed) and switches the window to
// the closed state of its CloseMode. It reports false if already closed.
func (w *windowState) close() bool {
	if w.closed() {
		return false
	}
	w.state = wire.StateClosedNack
	if w.opts.CloseMode == CloseSilent {
		w.state = wire.StateClosedSilent
	}
	w.retireWaiting()
	for _, b := range w.pending {
		b.flags |= FlagClosed
		if w.counted {
			if b.state == bufQueued {
				w.endCounted(b, FlagClosed)
			}
			continue
		}
		if b.state == bufQueued {
			if w.opts.Guard == GuardNone {
				b.state = bufReady
			} else {
				b.state = bufCompleting
				w.toUnbind = append(w.toUnbind, b)
			}
		}
	}
	w.handOver()
	w.changed()
	return true
}

// buffers returns every buffer the window knows: posted, kept for rewind,
// held by the application or waiting to be re-posted.
func (w *windowState) buffers() []*buffer {
	seen := make(map[*buffer]bool)
	var all []*buffer
	add := func(b *buffer) {
		if !seen[b] {
			seen[b] = true
			all = append(all, b)
		}
	}
	for _, b := range w.pending {
		add(b)
	}
	for _, b := range w.kept {
		add(b)
	}
	for b := range w.held {
		add(b)
	}
	for b := range w.waiting {
		add(b)
	}
	return all
}

// release gives a handed-over buffer back to the window. Errors: ErrInvalid
// when b was not handed over or was already released.
func (w *windowState) release(b *buffer) error {
	if b == nil || b.state != bufDone || b.released {
		return invalidf("release of a buffer not held by the application")
	}
	b.released = true
	delete(w.held, b)
	if b.oneTime {
		b.retired = true // the application's for good: no longer readable by Get
		if b.inKept {
			w.toHide = append(w.toHide, b)
		}
		return nil
	}
	if w.closed() {
		// No next epoch: a Wait on it returns at once, as one that was
		// waiting when the window closed (retireWaiting).
		b.retired = true
		return nil
	}
	// Waiters now wait for the next epoch of this buffer.
	b.done = make(chan struct{})
	b.waiting = true
	w.waiting[b] = struct{}{}
	w.recycle(b)
	return nil
}

// rewind returns the records of up to n of the last Keep epochs, newest
// first.
func (w *windowState) rewind(n int) []Record {
	if n > len(w.kept) {
		n = len(w.kept)
	}
	out := make([]Record, 0, n)
	for i := len(w.kept) - 1; i >= 0 && len(out) < n; i-- {
		out = append(out, w.kept[i].rec)
	}
	return out
}

// keptBuffer returns the kept buffer of epoch (LastEpoch: the newest) for Get.
// Errors: ErrNoBuffer when the epoch has not been handed over yet (or
// none has), ErrStale when it is no longer kept (it left the rewind ring,
// or it was a one-time buffer the application released).
func (w *windowState) keptBuffer(epoch uint64) (*buffer, error) {
	if epoch == LastEpoch {
		if len(w.kept) == 0 {
			if w.head == 0 {
				return nil, fmt.Errorf("window %v has completed no epoch: %w", w.mailbox, ErrNoBuffer)
			}
			return nil, fmt.Errorf("window %v keeps no epoch (Keep %d): %w", w.mailbox, w.opts.Keep, ErrStale)
		}
		epoch = w.kept[len(w.kept)-1].rec.Epoch
	}
	if epoch >= w.head {
		return nil, fmt.Errorf("epoch %d of window %v has not completed: %w", epoch, w.mailbox, ErrNoBuffer)
	}
	for _, b := range w.kept {
		if b.rec.Epoch == epoch {
			if b.oneTime && b.released {
				break
			}
			return b, nil
		}
	}
	return nil, fmt.Errorf("epoch %d of window %v is no longer kept: %w", epoch, w.mailbox, ErrStale)
}

// knock counts n puts a sender reported (Window.knock).
func (w *windowState) knock(r wire.KnockReason, n uint64) {
	switch r {
	case wire.KnockNack:
		w.stats.Nacks += n
	case wire.KnockDrop:
		w.stats.Drops += n
	case wire.KnockStale:
		w.stats.Stale += n
	}
}

func (w *windowState) changed() { w.seq += 2 }

// Stats returns the window's counters.
func (w *windowState) Stats() WindowStats {
	s := w.stats
	s.Posted = len(w.pending)
	s.Held = len(w.held)
	return s
}

// entry builds the descriptor entry senders see: Head is the first
// generation still accepting puts, followed by up to MaxDescs bound
// buffers that accept puts.
func (w *windowState) entry(incarnation uint32) wire.Entry {
	e := wire.Entry{Seq: w.seq, Mailbox: uint64(w.mailbox), Incarnation: incarnation, State: w.state, Kind: wire.EpochKind(w.opts.Kind), Share: w.opts.Share}
	if w.counted {
		e.Flags = wire.EntryCounted
	}
	i := 0
	for i < len(w.pending) && w.pending[i].state != bufQueued {
		i++
	}
	e.Head = w.head + uint64(i)
	if w.closed() {
		return e
	}
	for ; i < len(w.pending) && e.NDesc < wire.MaxDescs; i++ {
		b := w.pending[i]
		if b.state != bufQueued || !b.bound {
			break
		}
		e.Descs[e.NDesc] = b.desc
		e.NDesc++
	}
	if !w.counted || e.NDesc < wire.MaxDescs {
		return e
	}
	// The queued buffers after the descriptors, as long as they look like
	// the last one, go as Through: senders derive their descriptors.
	last := e.Descs[wire.MaxDescs-1]
	for ; i < len(w.pending) && w.pending[i].gen-e.Head < wire.MaxThrough; i++ {
		b := w.pending[i]
		if b.state != bufQueued || !b.registered || uint32(b.cap) != last.Len || b.threshold != last.Threshold {
			break
		}
		e.Through = b.gen
	}
	return e
}

// takeActions returns and clears the outbox.
func (w *windowState) takeActions() (bind []bindAction, unbind, published []*buffer) {
	bind, unbind, published = w.toBind, w.toUnbind, w.published
	w.toBind, w.toUnbind, w.published = nil, nil, nil
	return
}

// takeHides returns and clears the buffers to hide from Get.
func (w *windowState) takeHides() []*buffer {
	h := w.toHide
	w.toHide = nil
	return h
}
