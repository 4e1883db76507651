package rvma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// PutOp is a put in progress (PutAsync). Its methods are safe for
// concurrent use.
type PutOp struct {
	ep  *Endpoint
	ctx context.Context
	dst netip.AddrPort
	mb  Mailbox
	off uint64
	n   int
	sge [1]verbs.SGE // the put's scatter list (sgl)
	cp  regCopy      // the registered copy of a source outside endpoint memory (cp.mem nil: none)

	// set while the put is in flight (under ep.mu)
	st       *stripe
	view     *remoteView
	gen      uint64
	refusals int // stale refusals so far (maxAttempts)
	flushes  int // flushes and re-issues from retired stripes (maxFlushes)

	once sync.Once
	done chan struct{}
	err  error
}

// sgl is the put's scatter list: its one entry, or none for an empty put.
func (op *PutOp) sgl() []verbs.SGE {
	if op.n == 0 {
		return nil
	}
	return op.sge[:]
}

// Done is closed when the put completed or failed.
func (op *PutOp) Done() <-chan struct{} { return op.done }

// Err returns the put's outcome once Done is closed (nil before, and on
// success): a *PutError.
func (op *PutOp) Err() error {
	select {
	case <-op.done:
		return op.err
	default:
		return nil
	}
}

// Wait waits for the put to complete and returns its outcome (a
// *PutError) or, if ctx ends first (or had ended before the call), ctx's
// error; the put itself goes on.
func (op *PutOp) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := await(ctx, op.ep.e, op.done); err != nil {
		return err
	}
	return op.err
}

// finish ends the put: its work request completed, or was never posted,
// or can no longer execute.
func (op *PutOp) finish(err error) { op.end(err, false) }

// finishInDoubt ends a put whose work request may still execute (its
// stripe failed or retired without completing it, and is torn down
// later): the registered copy of its source is deregistered, so that the
// request fails if it runs, and a bounce chunk holding the copy is never
// lent again, since another put's bytes there would be sent instead.
func (op *PutOp) finishInDoubt(err error) { op.end(err, true) }

func (op *PutOp) end(err error, inDoubt bool) {
	op.once.Do(func() {
		if err != nil {
			op.ep.mu.Lock()
			epoch, chosen := op.gen, op.st != nil // set together when the put was handed to the NIC
			op.ep.mu.Unlock()
			op.err = &PutError{Dest: op.dst.String(), Mailbox: op.mb, Offset: op.off, Len: op.n,
				Epoch: epoch, HasEpoch: chosen, Err: sentinelOr(ErrDevice, err)}
		}
		op.ep.e.dropCopy(op.cp, inDoubt)
		close(op.done)
	})
}

// Put writes src at offset off into the buffer behind mailbox mb of the
// endpoint listening on dst and waits until the NIC placed it (the
// paper's RVMA_Put). See PutAsync for what can go wrong.
func (ep *Endpoint) Put(ctx context.Context, dst netip.AddrPort, mb Mailbox, off uint64, src []byte) error {
	return ep.PutAsync(ctx, dst, mb, off, src).Wait(context.WithoutCancel(ctx))
}

// PutAsync starts a put of src at offset off into the buffer behind
// mailbox mb of the endpoint listening on dst and returns at once; the
// put completes when the NIC placed the bytes. src may be reused when
// PutAsync returns if it is not endpoint memory (Alloc), which is sent
// without a copy and must stay unchanged until the put is done. Other
// memory is copied: up to 4 KiB into registered chunks the endpoint keeps
// for this (at most 4 MiB of them, registered as needed), larger sources,
// or any while every chunk is lent, into a registration of their own,
// which costs far more than the copy (EndpointStats.CopyRegistrations
// counts them). Large or frequent puts should come from Alloc memory.
//
// The put dials the peer and resolves the mailbox on first use, and if
// the window has no buffer posted it waits for one until ctx ends. It
// chooses its epoch when it is handed to the NIC: the window's current
// epoch as this endpoint sees it then (the epoch after those the
// receiver said completed and those this endpoint's own puts filled). Puts
// from this endpoint to one mailbox are handed to the NIC one at a time,
// and calls that do not overlap (one returned before the next began, as
// on one goroutine) in the order of the calls, so they fill epochs in
// that order; of overlapping calls from several goroutines, whichever
// reaches the mailbox's view first goes first. A put refused as stale
// and re-issued chooses again: a later epoch. A ctx that has ended fails
// the put before it does anything; ctx bounds the waits above, not the
// put's flight once it is on the wire.
//
// Its error (a *PutError) wraps ErrNoMailbox (no window with that
// address), ErrMailboxClosed (the window was closed; the receiver counts
// the NACK), ErrTooLarge (off+len beyond the target buffer; nothing sent),
// ErrNoBuffer (ctx ended while no buffer was posted), ErrStale (the epoch
// completed before the put landed and EndpointOptions.NoRetryStale is set;
// nothing of the put reached a buffer already handed over), ErrPeerGone
// (the link failed, or could not be dialled within
// EndpointOptions.DialTimeout; a put that was on the wire then may have
// been placed, and is not issued again: the receiver's count tells),
// ErrClosed (this endpoint closed), ErrFailed (this endpoint failed),
// ErrInvalid (a put above 2 GiB, or an empty one to a window the kernel
// module counts), ErrDevice (a copy of src could not be registered, or
// the send could not be posted) or ctx's error. A put to a window closed
// with CloseSilent succeeds without writing anything. A put already on the
// wire when the window closes is refused like a stale one: ErrStale with
// NoRetryStale, otherwise ErrMailboxClosed once its retry sees the close.
// A put that lands after its epoch's threshold but before hand-over
// succeeds (its bytes are in the epoch); the receiver reports it
// afterwards (EndpointOptions.OnLate).
func (ep *Endpoint) PutAsync(ctx context.Context, dst netip.AddrPort, mb Mailbox, off uint64, src []byte) *PutOp {
	op := &PutOp{ep: ep, ctx: ctx, dst: dst, mb: mb, off: off, n: len(src), done: make(chan struct{})}
	if err := ctx.Err(); err != nil {
		op.finish(err)
		return op
	}
	if err := ep.use(); err != nil {
		op.finish(err)
		return op
	}
	if uint64(len(src)) > 1<<31 {
		op.finish(invalidf("a put of %d bytes", len(src)))
		return op
	}
	if len(src) > 0 {
		if mr := ep.e.mem.arenaOf(heapAddr(src), uint64(len(src))); mr != nil {
			op.sge[0] = verbs.SGE{Addr: heapAddr(src), Length: uint32(len(src)), LKey: mr.LKey()}
		} else {
			cp, err := ep.e.newCopy(len(src))
			if err != nil {
				op.finish(err)
				return op
			}
			copy(cp.mem, src)
			op.cp = cp
			op.sge[0] = cp.sge
		}
	}
	// Puts from one caller to one mailbox target epochs in the order they
	// were issued: once one has to wait (dial, resolve, no buffer, full
	// send queue), later ones queue behind it.
	k := putKey{op.dst, op.mb}
	ep.mu.Lock()
	if q, busy := ep.queues[k]; busy {
		ep.queues[k] = append(q, op)
		ep.mu.Unlock()
		return op
	}
	l := ep.links[op.dst]
	ep.mu.Unlock()
	if ep.tryFast(op, l) {
		return op
	}
	ep.mu.Lock()
	q, busy := ep.queues[k]
	ep.queues[k] = append(q, op)
	ep.mu.Unlock()
	if !busy {
		go ep.drain(k)
	}
	return op
}

// putKey identifies the puts that must keep their order.
type putKey struct {
	dst netip.AddrPort
	mb  Mailbox
}

// drain issues the queued puts of k one after the other.
func (ep *Endpoint) drain(k putKey) {
	for {
		ep.mu.Lock()
		q := ep.queues[k]
		if len(q) == 0 {
			delete(ep.queues, k)
			ep.mu.Unlock()
			return
		}
		op := q[0]
		ep.mu.Unlock()
		ep.run(op)
		ep.mu.Lock()
		ep.queues[k] = ep.queues[k][1:]
		ep.mu.Unlock()
	}
}

// tryFast posts op at once on l, the link to its destination if there
// is one, if the link and view are ready, a buffer is known and the send
// queue has room; otherwise run does the waiting.
func (ep *Endpoint) tryFast(op *PutOp, l *link) bool {
	if l == nil {
		return false
	}
	select {
	case <-l.ready:
	default:
		return false
	}
	l.mu.Lock()
	v := l.views[op.mb]
	l.mu.Unlock()
	if v == nil {
		return false
	}
	select {
	case <-v.resolved:
	default:
		return false
	}
	done, _, err := ep.post(op, l, v, false)
	if err != nil {
		op.finish(err)
		return true
	}
	return done
}

// run drives a put through dialling, resolving and waiting for a buffer.
func (ep *Endpoint) run(op *PutOp) {
	for {
		l, err := ep.link(op.ctx, op.dst)
		if err != nil {
			op.finish(err)
			return
		}
		v, err := ep.resolve(op.ctx, l, op.mb)
		if err != nil {
			op.finish(err)
			return
		}
		done, wait, err := ep.post(op, l, v, true)
		if err != nil {
			op.finish(err)
			return
		}
		if done {
			return
		}
		ep.e.waitBegin()
		var end error
		select {
		case <-wait:
		case <-l.dead:
			// The next round dials again, or fails with the link's error.
			if err := l.failure(); errors.Is(err, ErrClosed) {
				end = err
			}
		case <-op.ctx.Done():
			end = fmt.Errorf("%w: %w", ErrNoBuffer, op.ctx.Err())
		}
		ep.e.waitEnd()
		if end != nil {
			op.finish(end)
			return
		}
	}
}

// post issues op on l to v's target epoch. It returns done when the put
// was posted or finished (a silent drop), or a channel to wait on before
// trying again (no buffer yet, or the send queue is full and block is
// false), or an error that ends the put.
func (ep *Endpoint) post(op *PutOp, l *link, v *remoteView, block bool) (done bool, wait <-chan struct{}, err error) {
	done, wait, err = ep.postOnce(op, l, v, block)
	if errors.Is(err, errAwaitBuffer) && (ep.reread(v) || ep.e.pollOnce()) {
		// The entry the put needs may be in the view slot already, or its
		// notice among the completions waiting (as above).
		done, wait, err = ep.postOnce(op, l, v, block)
	}
	if errors.Is(err, errAwaitBuffer) {
		ep.bufferWaits.Add(1)
		err = nil
	}
	return done, wait, err
}

// errAwaitBuffer is postOnce's report that the view has no buffer for the
// put's epoch: wait is then the view's next change.
var errAwaitBuffer = errors.New("rvma: no buffer in the view yet")

// postOnce is one attempt of post.
func (ep *Endpoint) postOnce(op *PutOp, l *link, v *remoteView, block bool) (done bool, wait <-chan struct{}, err error) {
	st := l.putStripe()
	if st == nil { // every stripe is being replaced
		wait = l.replaced()
		if l.pick() != nil {
			return false, closedChan, nil
		}
		return false, wait, nil
	}
	if block {
		ep.e.waitBegin()
		var err error
		select {
		case st.credits <- struct{}{}:
		case <-l.dead:
			err = l.failure()
		case <-op.ctx.Done():
			err = fmt.Errorf("waiting for room in the send queue: %w", op.ctx.Err())
		}
		ep.e.waitEnd()
		if err != nil {
			return false, nil, err
		}
	} else {
		select {
		case st.credits <- struct{}{}:
		default:
			return false, nil, nil
		}
	}
	v.mu.Lock()
	if v.sv == nil { // a NACKed view about to be dropped
		err := v.err
		v.mu.Unlock()
		<-st.credits
		return false, nil, err
	}
	// A put back at an epoch this sender already put to without filling
	// it may be behind the entry that says other senders completed it.
	// That entry is in the view slot as soon as the NIC placed it, before
	// its notice's completion is handled (a goroutine spinning on a
	// counted window's record sees its peers' puts without polling the
	// CQ, and another goroutine may hold the notice's completion, polled
	// but not yet handled): read it from there, or the put goes to the
	// completed epoch and is refused, at the cost of its stripe.
	if v.sv.revisits() {
		ep.refreshView(v)
	}
	gen, d, err := v.sv.target(op.off, uint64(op.n))
	switch {
	case errors.Is(err, ErrNoBuffer):
		wait = v.changed
		v.mu.Unlock()
		<-st.credits
		return false, wait, errAwaitBuffer
	case errors.Is(err, errGone):
		// The receiver freed the mailbox: the next round resolves it
		// again and finds its new window, or ErrNoMailbox.
		v.mu.Unlock()
		<-st.credits
		ep.dropView(l, v)
		return false, closedChan, nil
	case errors.Is(err, errDropped), errors.Is(err, ErrMailboxClosed):
		slot, inc := v.slot, v.sv.incarnation
		v.mu.Unlock()
		<-st.credits
		r := wire.KnockNack
		if errors.Is(err, errDropped) {
			r, err = wire.KnockDrop, nil
		}
		l.knock(slot, inc, r) // counted at the receiver; a lost knock loses only the count
		if err != nil {
			return false, nil, err
		}
		op.finish(nil)
		return true, nil, nil
	case err != nil:
		v.mu.Unlock()
		<-st.credits
		return false, nil, err
	}
	counted := v.sv.entry.Flags&wire.EntryCounted != 0
	if counted && op.n == 0 {
		v.mu.Unlock()
		<-st.credits
		return false, nil, invalidf("a zero-length put to mailbox %v, whose receiver's kernel module counts the bytes it places: a zero-length WRITE places none", op.mb)
	}
	v.sv.commit(gen, uint64(op.n))
	slot := v.slot
	v.mu.Unlock()

	// A counted window's receiver counts the WRITE as it is placed; other
	// windows count the immediate's receive completion.
	wop, imm := verbs.OpWrite, uint32(0)
	if !counted {
		wop = verbs.OpWriteImm
		imm, _ = wire.Imm{Kind: wire.KindData, Slot: slot, Gen: wire.GenLow(gen)}.Encode()
	}
	ep.mu.Lock()
	ep.nextID++
	id := ep.nextID &^ (sendTag | ctrlTag | readTag)
	op.st, op.view, op.gen = st, v, gen
	ep.puts[id] = op
	ep.mu.Unlock()
	err = st.qp.PostSend(verbs.SendWR{ID: sendTag | id, Op: wop, Flags: verbs.SendSignaled,
		SGL: op.sgl(), Imm: imm, RemoteAddr: d.Addr + op.off, RKey: d.RKey})
	if err != nil {
		ep.mu.Lock()
		delete(ep.puts, id)
		ep.mu.Unlock()
		<-st.credits
		v.mu.Lock()
		v.sv.abort(gen, uint64(op.n))
		v.mu.Unlock()
		// A stripe that failed (its QP in the error state), or that was
		// retired, or whose link failed, and was closed under this post
		// by the failure's handling on another goroutine: the link's
		// failure, not the caller's.
		closedUnder := errors.Is(err, verbs.ErrClosed) && (st.dead.Load() || l.failure() != nil)
		if errors.Is(err, verbs.ErrWrongState) || closedUnder {
			st.broken(err)
			return false, nil, errPeer(l.peer, err)
		}
		return false, nil, err
	}
	return true, nil, nil
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// maxAttempts bounds how often one put is executed and refused as stale
// (a flush behind another put's refusal does not count); maxFlushes bounds
// how often it is flushed, or re-issued from a retired stripe.
const (
	maxAttempts = 8
	maxFlushes  = 64
)

// sendDone handles the completion of a link send (engine callback).
func (ep *Endpoint) sendDone(wc verbs.WC) {
	id := wc.ID &^ sendTag
	if id&readTag != 0 {
		ep.readDone(wc)
		return
	}
	if id&ctrlTag != 0 {
		ep.mu.Lock()
		st, old := ep.byQPN[wc.QPN], ep.retired[wc.QPN]
		ep.mu.Unlock()
		err := wc.Err()
		if st != nil {
			st.ctrlOut.Add(-1)
			if err != nil {
				st.sendFailed(err)
			}
		} else if old != nil && err != nil {
			old.noteFault(err) // its puts' flushes may follow
		}
		if lid := id &^ ctrlTag; lid != 0 {
			ep.lateSent(lid, err == nil) // its stripe may be retired already
		}
		if st != nil {
			st.l.flushLate()
		}
		return
	}
	ep.mu.Lock()
	op := ep.puts[id]
	delete(ep.puts, id)
	ep.mu.Unlock()
	if op == nil {
		return // its link failed first
	}
	st, v, gen := op.st, op.view, op.gen
	<-st.credits
	err := wc.Err()
	if err == nil {
		op.finish(nil)
		return
	}
	st.sendFailed(err)
	switch {
	case errors.Is(err, verbs.WCRemAccessErr):
		// The window's key changed under the put: its epoch completed.
		ep.stalePuts.Add(1)
		v.mu.Lock()
		v.sv.stale(gen)
		counted, slot, inc := v.sv.entry.Flags&wire.EntryCounted != 0, v.slot, v.sv.incarnation
		v.mu.Unlock()
		if counted {
			// Nothing reached the receiver's library: tell it, through
			// the queue that outlives this refusal's broken stripe.
			st.l.reportLate(wire.Ctrl{Type: wire.CtrlRefused, Slot: slot, Incarnation: inc, Count: 1, Len: uint32(op.n)})
		}
		op.refusals++
		if ep.opts.NoRetryStale || op.refusals >= maxAttempts {
			op.finish(fmt.Errorf("%w: %w", ErrStale, err))
			return
		}
	case errors.Is(err, verbs.WCWRFlushErr) && st.fault.Load() != faultRefused:
		// Flushed after something other than a refusal: the put may
		// have been placed, and issuing it again could place it twice.
		// It fails with the link, which drops the views and their counts
		// (the next put resolves the mailbox anew).
		err := st.errInDoubt(1, err)
		st.l.fail(err, false)
		op.finish(err)
		return
	case errors.Is(err, verbs.WCWRFlushErr):
		// Never executed: flushed behind a refusal of one of this
		// endpoint's own requests on its stripe (only the dialling side
		// puts on a link; see link). That says nothing about this put, so
		// it is not a refusal; flushes have their own, larger bound.
		v.mu.Lock()
		v.sv.abort(gen, uint64(op.n))
		v.mu.Unlock()
		op.flushes++
		if op.flushes > maxFlushes {
			op.finish(errPeer(op.dst, fmt.Errorf("flushed %d times behind other puts' failures: %w", op.flushes, err)))
			return
		}
	default:
		st.l.fail(errPeer(op.dst, err), false)
		op.finish(errPeer(op.dst, err))
		return
	}
	go ep.run(op)
}
