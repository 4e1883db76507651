package rvma

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// windowDriver is what a Window needs from its endpoint: who counts its
// puts (counting), pushing changed descriptor entries to subscribers, and
// checking that posted memory is registered. The verbs engine implements
// it.
type windowDriver interface {
	addrOf(mem []byte) (uint64, error)
	// counting returns the counter of a window with these options, where
	// its completion records live, and whether the kernel module counts
	// it (docs/rvma.md, section 6): then its records are in memory the
	// module writes.
	counting(opts WindowOptions) (counter, completionSource, bool)
	// hide unbinds the read-only window a Get was served through over b,
	// if there is one, before any later bind over b.
	hide(w *Window, b *buffer)
	// windowClosed is told once, after the window's first Close, to start its
	// linger (WindowOptions.Linger).
	windowClosed(w *Window)
	// entryChanged publishes e in the descriptor table and, as push
	// says, to the senders that hold a view of it.
	entryChanged(w *Window, e wire.Entry, push pushMode)
	// subscribers is the number of senders that hold a view of the
	// window in slot.
	subscribers(slot uint32) int
	progressDriver
}

// pushMode says whether, and when, an entry change goes to the senders.
type pushMode uint8

const (
	pushNone pushMode = iota // the table only: senders need not know yet
	pushSoon                 // to the senders; while the application spins, after its answer
	pushNow                  // to the senders before the caller goes on
)

// Window is the receiver's side of a mailbox (the paper's RVMA_win): a
// threshold, a queue of posted buffers and an epoch counter. Its methods
// are safe for concurrent use.
type Window struct {
	mailbox     Mailbox
	slot        uint32
	incarnation uint32
	drv         windowDriver
	ctr         counter // who counts the window's puts (windowDriver.counting)

	dispatch sync.Mutex // held across taking and dispatching actions: the driver sees them in order
	mu       sync.Mutex
	st       *windowState
	comps    completionSource
	kid      uint32 // the module's id of a counted window
	lastSeq  uint64
	pushed   wire.Entry // the last entry pushed to senders
}

func newWindow(mb Mailbox, slot, incarnation uint32, opts WindowOptions, drv windowDriver) (*Window, error) {
	st, err := newWindowState(mb, opts)
	if err != nil {
		return nil, fmt.Errorf("window %v: %w", mb, err)
	}
	w := &Window{mailbox: mb, slot: slot, incarnation: incarnation, drv: drv, st: st}
	w.ctr, w.comps, st.counted = drv.counting(st.opts)
	return w, nil
}

// Mailbox returns the window's mailbox address.
func (w *Window) Mailbox() Mailbox { return w.mailbox }

// flush carries out the state machine's actions outside the state lock,
// in the order the state machine produced them (a buffer's bind is always
// dispatched before its unbind). The driver must not call back into the
// window synchronously.
func (w *Window) flush() {
	w.dispatch.Lock()
	defer w.dispatch.Unlock()
	subs := w.drv.subscribers(w.slot) // under dispatch: answerResolve cannot add one meanwhile
	w.mu.Lock()
	var acts countActions
	acts.bind, acts.unbind, _ = w.st.takeActions()
	hides := w.st.takeHides()
	acts.register, acts.end = w.st.takeModuleActions()
	var e wire.Entry
	changed := w.st.seq != w.lastSeq
	push := pushNone
	if changed {
		w.lastSeq = w.st.seq
		e = w.st.entry(w.incarnation)
		// Senders need an entry only when what they may target changed:
		// most state changes of an epoch (the head handed over, a buffer
		// re-posted or bound beyond the MaxDescs they see) leave it as it
		// was, and each notice costs a post on the wire. While a buffer
		// they will see is being bound, the push waits for its completion
		// (one notice per epoch instead of two).
		// Nor when the only sender filled the epochs that completed
		// since the last push by itself: it has moved on by its own
		// count (senderView.commit) and still holds the descriptors it
		// needs next (senderKeepsUp).
		// Several senders that share epochs move on only when told
		// (docs/rvma.md, section 5): a put issued before the notice
		// arrives targets the completed epoch and is refused, which costs
		// its stripe. So they are pushed every move of the head at once,
		// bind or not, before the application can answer anyone (pushNow;
		// one sender's push can wait for the answer, pushSoon), and the
		// binds that follow only when they run short of descriptors.
		// Unless the window promises each sender's share of an epoch
		// (WindowOptions.Share): then each moves on by its own count, as
		// the only sender does. An epoch ended by IncEpoch or Close is
		// pushed at once too, bind or not, to one sender as well: no
		// sender can count it, and one that puts again before it knows
		// targets the ended epoch and is refused.
		pushed := w.pushed
		differs := !sameForSenders(e, pushed)
		moved := subs > 1 && e.Share == 0 && e.Head != pushed.Head
		due := differs && (moved || w.st.mustPush || !senderKeepsUp(pushed, e))
		if due && (moved || w.st.mustPush || !w.st.settling()) {
			push = pushSoon
			if subs > 1 || w.st.mustPush {
				push = pushNow
			}
			w.pushed = e
			w.st.mustPush = false
		}
	}
	w.mu.Unlock()
	for _, b := range hides { // before a recycled buffer's bind for its next epoch
		w.drv.hide(w, b)
	}
	if !acts.empty() {
		w.ctr.carryOut(w, acts)
	}
	if changed {
		w.drv.entryChanged(w, e, push)
	}
}

// sameForSenders reports whether two entries differ only in their
// sequence number.
func sameForSenders(a, b wire.Entry) bool {
	a.Seq, b.Seq = 0, 0
	return a == b
}

// senderKeepsUp reports whether a sender holding entry p, whose own puts
// alone completed every epoch from p.Head up to e.Head, can go on without
// being shown e: the window is open in both, and p still describes the new
// head and the generation after it exactly as e does (a sender left with
// one descriptor is pushed the entry, so it never waits for one).
func senderKeepsUp(p, e wire.Entry) bool {
	if p.Seq == 0 || p.Mailbox != e.Mailbox || p.Incarnation != e.Incarnation ||
		p.State != wire.StateOpen || e.State != wire.StateOpen || p.Kind != e.Kind || e.Head < p.Head {
		return false
	}
	end := p.End()
	if e.Head+1 >= end {
		return false
	}
	for g := e.Head; g < end; g++ {
		pd, _ := p.Desc(g)
		if ed, ok := e.Desc(g); !ok || ed != pd {
			return false
		}
	}
	return true
}

// noteBound is the driver's report that b's memory window was bound;
// the driver flushes the window after it.
func (w *Window) noteBound(b *buffer, d wire.Desc) {
	w.mu.Lock()
	w.st.bound(b, d)
	w.mu.Unlock()
}

// noteUnbound is the driver's report that b's memory window no longer
// accepts writes; the driver flushes the window after it.
func (w *Window) noteUnbound(b *buffer) {
	w.mu.Lock()
	w.st.unbound(b)
	w.mu.Unlock()
}

// unbound is noteUnbound with the flush.
func (w *Window) unbound(b *buffer) {
	w.noteUnbound(b)
	w.flush()
}

// arrive counts a put of n bytes whose immediate named generation bits
// genLow, and returns what it made of it and the generation (the epoch).
func (w *Window) arrive(genLow uint16, n uint64) (arriveResult, uint64) {
	w.mu.Lock()
	gen := wire.ExpandGen(w.st.head, genLow)
	r := w.st.arrive(gen, n)
	w.mu.Unlock()
	w.flush()
	return r, gen
}

// syncCounted takes the epochs the module published for a counted window
// and carries out what follows (the next buffers registered and shown,
// waiters woken, the entry pushed); it does nothing where the library
// counts. Every call that reads the window's epochs calls it first, so
// that what Spin saw in a record is seen there too, without waiting for
// the endpoint's module loop.
func (w *Window) syncCounted() { w.ctr.sync(w) }

// takePublished is syncCounted on a counted window, with done the
// module's count of the window's published epochs.
//
// The module writes a record before it raises the window's done counter,
// and on another CPU Spin can see the record in between: so a head buffer
// whose record is published counts as done even if the counter lags.
func (w *Window) takePublished(done uint64) {
	w.mu.Lock()
	if w.st.headPublished() {
		done = max(done, w.st.head+1)
	}
	if done <= w.st.head {
		w.mu.Unlock()
		return
	}
	w.st.countedUpTo(done)
	w.mu.Unlock()
	w.flush()
}

// knock counts n puts a sender reported: refused by its library after
// Close (NACK, drop), or by the receiver's module as stale.
func (w *Window) knock(r wire.KnockReason, n uint64) {
	w.mu.Lock()
	w.st.knock(r, n)
	w.mu.Unlock()
}

// Epoch returns the number of epochs handed over so far, which is the
// epoch the head buffer will hold (the paper's RVMA_Win_get_epoch).
func (w *Window) Epoch() uint64 {
	w.syncCounted()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st.head
}

// IncEpoch hands the head buffer over now, whatever its count (the paper's
// RVMA_Win_inc_epoch): the record carries the bytes and puts actually
// placed and FlagPartial. It waits until the buffer no longer accepts
// writes and its record is published. Errors wrap ErrClosed, ErrNoBuffer
// (nothing posted) or ctx's error: when ctx had ended before the call
// nothing happened; when it ends while IncEpoch waits, the epoch still
// completes.
func (w *Window) IncEpoch(ctx context.Context) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("IncEpoch on window %v: %w", w.mailbox, err)
	}
	w.mu.Lock()
	b, err := w.st.incEpoch()
	var done chan struct{}
	if b != nil {
		done = b.done
	}
	w.mu.Unlock()
	if err != nil {
		return Record{}, err
	}
	w.flush()
	if err := await(ctx, w.drv, done); err != nil {
		return Record{}, fmt.Errorf("IncEpoch on window %v: %w", w.mailbox, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return b.rec, nil
}

// Rewind returns the records of up to n of the most recent epochs whose
// buffers the window still keeps intact (WindowOptions.Keep), newest
// first.
func (w *Window) Rewind(n int) []Record {
	w.syncCounted()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st.rewind(n)
}

// Close ends the window: every buffer not yet handed over is handed over
// with FlagClosed once it no longer takes writes, later puts fail with
// ErrMailboxClosed at their senders (or are dropped silently with
// CloseSilent) and are counted. The mailbox stays reserved for
// WindowOptions.Linger (so that late senders learn it closed rather than
// that it never existed); then, or when InitWindow takes the mailbox
// again, puts to it resolve anew. Close is idempotent and does not wait
// for the buffers to be closed (an unbind, where the library counts);
// Posted.Wait does.
func (w *Window) Close() error {
	w.mu.Lock()
	first := w.st.close()
	w.mu.Unlock()
	w.flush()
	if first {
		w.drv.windowClosed(w)
	}
	return nil
}

// fail hands the window's pending buffers over with FlagFailed: the
// endpoint failed (Endpoint.failed).
func (w *Window) fail() {
	w.mu.Lock()
	w.st.fail()
	w.mu.Unlock()
	w.flush()
}

// Stats returns the window's counters.
func (w *Window) Stats() WindowStats {
	w.syncCounted()
	w.mu.Lock()
	s := w.st.Stats()
	w.mu.Unlock()
	s.RefusedPackets = w.ctr.refusedPackets(w)
	return s
}

// WindowStats are a window's counters (Window.Stats).
type WindowStats struct {
	Puts            uint64 // puts counted into epochs
	Bytes           uint64 // bytes counted into epochs
	EpochsCompleted uint64 // epochs handed over (by threshold or IncEpoch; not by Close)
	Posted          int    // buffers posted and not yet handed over
	Held            int    // buffers handed over and not yet released
	Late            uint64 // puts that arrived after their epoch's threshold, before hand-over (included)
	Stale           uint64 // puts that arrived after their epoch was handed over (GuardNone only) or closed; in a window the module counts, puts it refused as stale, as their senders report them
	Nacks           uint64 // puts refused with a NACK after Close
	Drops           uint64 // puts dropped silently after Close
	// RefusedPackets counts, in a window the kernel module counts, the
	// write packets the module refused: for a buffer it had closed, or
	// straddling a buffer's edge (puts the NIC refused for a dead key
	// before the module saw them are not among them; Stale counts both as
	// their senders report them). 0 in a window the library counts.
	RefusedPackets uint64
}
