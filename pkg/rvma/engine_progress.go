package rvma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// progress is the engine's receive progress: the one CQ every completion
// comes on, the SRQ every link's queue pairs take their receive WQEs from
// and the slab those point into, and who polls the CQ: the engine's
// progress loop (progressLoop), a goroutine that spins (Posted.Spin) or one
// that blocks on the engine (await). What is polled is handled by the
// engine (handle), which routes each completion to the links, the memory's
// binds or a window.
//
// Lock order: pollMu comes first. It is held while a batch of completions
// is handled, which takes windows' dispatch and state locks, the memory's
// mutex, the descriptor table's locks and the links'; the goroutines that
// hold any of those only ever TryLock it (pollOnce). The rest is atomic.
type progress struct {
	// One CQ for everything: receive completions of every link's QPs and
	// the bind QP's binds, so that the unbind an arrival triggers is
	// completed by the same loop without another wake-up.
	ch     *verbs.CompChannel
	cq     *verbs.CQ
	srq    *verbs.SRQ
	recvMR *verbs.MR // engineSRQDepth slots of recvSlot bytes: SENDs land here
	spin   bool      // EndpointOptions.Spin: the loop busy-polls the CQ (next)
	// pollMu is held from a poll of the CQ until its completions are
	// handled, by whichever goroutine polls (the progress loop, a spinner,
	// a waiter's progress steps), so that they are handled in CQ order.
	pollMu sync.Mutex

	// While an application goroutine spins (Posted.Spin) it runs the
	// progress step itself, and the progress loop stays parked: a second
	// thread woken on every completion would only contend with the spinner
	// for the CPU (on one CPU, for a scheduler time slice). Nothing wakes
	// the parked loop when a spin ends (the next spin usually follows
	// soon); it looks again after a nap (waitNoSpinner), unless a
	// goroutine that needs its progress blocks (waitBegin) and kicks it.
	born     time.Time
	spinners atomic.Int32
	yielder  verbs.Yielder // shared by the spinners
	lastSpin atomic.Int64  // when the last spinner ended, since born; 0: never
	waiters  atomic.Int32  // goroutines blocked on the engine's progress
	kick     chan struct{} // wakes the parked progress loop
	modKick  chan struct{} // wakes the module loop napping behind a spinner
	// parked: the progress loop is parked (waitNoSpinner). Meanwhile
	// pushSoon pushes wait for the next idle poll (engine.entryChanged).
	parked atomic.Bool

	refused atomic.Uint64 // receive WQEs completed with a remote access error
	unknown atomic.Uint64 // data for slots with no window
}

func newProgress(spin bool) progress {
	return progress{spin: spin, born: time.Now(), kick: make(chan struct{}, 1), modKick: make(chan struct{}, 1)}
}

// The engine is the progressDriver of its windows (windowDriver): the
// spinners and waiters are its progress's.

func (e *engine) spinBegin() { e.prog.spinBegin() }
func (e *engine) spinEnd()   { e.prog.spinEnd() }
func (e *engine) yield()     { e.prog.yield() }
func (e *engine) waitBegin() { e.prog.waitBegin() }
func (e *engine) waitEnd()   { e.prog.waitEnd() }

// recvWR is receive WQE i of the SRQ: slot i of the receive slab.
func (p *progress) recvWR(i uint64) verbs.RecvWR {
	return verbs.RecvWR{ID: i, SGL: []verbs.SGE{{Addr: p.recvMR.Addr() + i*recvSlot, Length: recvSlot, LKey: p.recvMR.LKey()}}}
}

// next waits for completions and returns them with pollMu held (the
// caller handles them, then unlocks); on an error pollMu is not held.
func (p *progress) next(ctx context.Context, wcs []verbs.WC) (int, error) {
	if p.spin {
		return p.cq.SpinWith(ctx, wcs, &p.pollMu)
	}
	return p.cq.WaitWith(ctx, wcs, &p.pollMu)
}

// progressLoop is the engine's one loop: it sleeps on the CQ (or spins, with
// EndpointOptions.Spin), handles receive and bind completions alike, and while
// binds are outstanding keeps polling for a short while instead of going
// back to sleep (on rxe a bind completes within the ibv_bind_mw call, so
// the unbind an arrival caused is usually there at once).
func (e *engine) progressLoop(ctx context.Context) {
	defer e.wg.Done()
	wcs := make([]verbs.WC, 64)
	for {
		if !e.prog.waitNoSpinner(ctx) {
			return
		}
		e.flushPushes()
		n, err := e.prog.next(ctx, wcs)
		if err != nil {
			return
		}
		for n > 0 {
			e.handle(wcs[:n])
			n = 0
			if !e.mem.bindsPending() || e.prog.spinning() {
				break
			}
			for deadline := time.Now().Add(bindSpin); n == 0 && time.Now().Before(deadline); {
				if n, err = e.prog.cq.Poll(wcs); err != nil {
					e.prog.pollMu.Unlock()
					return
				}
			}
		}
		e.prog.pollMu.Unlock()
	}
}

// spinBegin and spinEnd bracket a goroutine's Posted.Spin. Neither wakes
// anyone: the spinner runs the progress step itself.
func (p *progress) spinBegin() { p.spinners.Add(1) }

func (p *progress) spinEnd() {
	p.lastSpin.Store(max(int64(time.Since(p.born)), 1))
	p.spinners.Add(-1)
}

func (p *progress) spinning() bool { return p.spinners.Load() > 0 }

func (p *progress) yield() { p.yielder.Maybe() }

// waitBegin and waitEnd bracket a goroutine blocked on something only the
// engine's progress produces (a put's completion, an epoch, a view): while
// one waits, a parked progress loop resumes at once, or, if an application
// goroutine spins and so makes progress itself, naps no longer than
// spinGrace.
func (p *progress) waitBegin() {
	p.waiters.Add(1)
	if p.parked.Load() {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	select {
	case p.modKick <- struct{}{}:
	default:
	}
}

func (p *progress) waitEnd() { p.waiters.Add(-1) }

// spinGrace is how long the progress loop stays parked after the last
// Posted.Spin ended: an application that spins usually spins again soon
// (after posting its answer), and a loop woken in between only contends
// with it for the CPU. Completions that arrive meanwhile wait for the
// next Spin or for the end of the grace.
const spinGrace = 2 * time.Millisecond

// maxNap bounds the parked loop's naps: while spinning goes on (spins that
// follow each other, or one long spin) each nap doubles from spinGrace up
// to maxNap, so a ping-pong of spins costs the loop a wake-up every maxNap
// instead of one per spin. It is also the longest a completion nobody
// waits for (a peer's RESOLVE, an arrival on a window nobody spins on)
// stays unhandled after the last spin ended.
const maxNap = 16 * time.Millisecond

// waitNoSpinner parks the progress loop while a goroutine spins and until
// spinGrace after the last spin ended; false when ctx ended. It returns at
// once when a goroutine blocks on the engine (waitBegin) and nobody spins.
func (p *progress) waitNoSpinner(ctx context.Context) bool {
	p.parked.Store(true)
	defer p.parked.Store(false)
	return p.napWhileSpinning(ctx, p.kick)
}

// napWhileSpinning returns once nobody has spun for spinGrace, or a
// goroutine blocks on the engine (waitBegin sends on kick) and nobody
// spins; false when ctx ended.
func (p *progress) napWhileSpinning(ctx context.Context, kick <-chan struct{}) bool {
	nap := spinGrace
	for {
		if p.spinners.Load() == 0 {
			last := p.lastSpin.Load()
			idle := time.Since(p.born) - time.Duration(last)
			if last == 0 || idle >= spinGrace || p.waiters.Load() > 0 {
				return ctx.Err() == nil
			}
		} else if p.waiters.Load() > 0 {
			nap = spinGrace
		}
		t := time.NewTimer(nap)
		select {
		case <-t.C:
		case <-kick:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return false
		}
		nap = min(2*nap, maxNap)
	}
}

// pollOnce runs one non-blocking progress step on the caller's goroutine
// (Posted.Spin, await): the same handling as the progress loop. It does
// nothing and reports false while another goroutine polls and handles
// (pollMu): completions are handled in the order they were polled, since
// a put's success must be seen before the failure that breaks its stripe
// after it (the stripe's replacement re-issues the puts still recorded on
// it, which must be only those that never executed).
func (e *engine) pollOnce() bool {
	if !e.prog.pollMu.TryLock() {
		return false
	}
	var wcs [16]verbs.WC
	n, err := e.prog.cq.Poll(wcs[:])
	if err != nil || n == 0 {
		e.prog.pollMu.Unlock()
		e.flushPushes()
		return false
	}
	e.handle(wcs[:n])
	e.prog.pollMu.Unlock()
	return true
}

// handle processes a batch of completions and replenishes the SRQ.
//
// The batch's bind and unbind completions are taken last, after one more
// poll of the CQ: an unbind's completion hands a buffer over, and a put
// placed before the unbind took effect may have its completion behind the
// unbind's (rxe posts it once the responder is done with the packet, on
// whichever vCPU runs it). Counted first, it is late into its epoch, as it
// should be, rather than stale after the handover. That narrows the race;
// it cannot close it (docs/rvma.md, section 4).
func (e *engine) handle(wcs []verbs.WC) {
	bindQPN := e.mem.bindQP.QPN()
	var refill [64]verbs.RecvWR
	n := 0
	var bindBuf [16]verbs.WC
	binds := bindBuf[:0]
	take := func(wcs []verbs.WC) {
		for _, wc := range wcs {
			switch {
			case wc.QPN == bindQPN:
				binds = append(binds, wc)
			case wc.ID&sendTag != 0:
				if e.links != nil {
					e.links.sendDone(wc)
				}
			default:
				// Everything else consumed a receive WQE (the opcode of an
				// error completion is not reliable, so do not test it).
				e.recvDone(wc)
				if n == len(refill) {
					e.refill(refill[:n])
					n = 0
				}
				refill[n] = e.prog.recvWR(wc.ID % engineSRQDepth)
				n++
			}
		}
	}
	take(wcs)
	if len(binds) > 0 {
		var more [16]verbs.WC
		if m, err := e.prog.cq.Poll(more[:]); err == nil {
			take(more[:m])
		}
	}
	e.refill(refill[:n])
	var movedBuf [4]*Window
	moved := movedBuf[:0] // windows whose binds completed: flushed once, after the batch
	for _, wc := range binds {
		moved = appendOnce(moved, e.mem.bindDone(wc))
	}
	for _, w := range moved {
		w.flush()
	}
}

func (e *engine) refill(wrs []verbs.RecvWR) {
	if len(wrs) == 0 {
		return
	}
	if err := e.prog.srq.PostRecv(wrs...); err != nil {
		e.fail(fmt.Errorf("rvma: replenishing the SRQ: %w", err))
	}
}

// bindSpin is how long the progress loop polls for outstanding binds
// before sleeping again.
const bindSpin = 200 * time.Microsecond

func (e *engine) recvDone(wc verbs.WC) {
	if err := wc.Err(); err != nil {
		if errors.Is(err, verbs.WCRemAccessErr) {
			e.prog.refused.Add(1)
		}
		if e.links != nil {
			e.links.recvFailed(wc)
		}
		return
	}
	if !wc.HasImm() {
		e.prog.unknown.Add(1)
		return
	}
	imm := wire.ParseImm(wc.Imm)
	if wc.Opcode == verbs.WCRecv {
		if e.links == nil || imm.Kind != wire.KindCtrl || wc.ByteLen > recvSlot {
			e.prog.unknown.Add(1)
			return
		}
		off := (wc.ID % engineSRQDepth) * recvSlot
		e.links.ctrl(wc, imm, e.prog.recvMR.Bytes()[off:off+uint64(wc.ByteLen)])
		return
	}
	if wc.Opcode != verbs.WCRecvRDMAWithImm {
		e.prog.unknown.Add(1)
		return
	}
	if imm.Kind == wire.KindNotice {
		if e.links != nil {
			e.links.notice(wc, imm.Slot)
		}
		return
	}
	if e.trace != nil && imm.Kind == wire.KindData {
		e.trace(imm, wc.ByteLen)
	}
	_, inc, w, ok := e.table.Slot(imm.Slot)
	if !ok || w == nil {
		e.prog.unknown.Add(1)
		return
	}
	switch imm.Kind {
	case wire.KindData:
		switch r, gen := w.arrive(imm.Gen, uint64(wc.ByteLen)); r {
		case arriveLate, arriveStale:
			// Landed, but after its epoch's threshold: tell the sender.
			if e.links != nil {
				e.links.late(wc, imm.Slot, gen, r == arriveStale)
			}
		case arriveUnknown:
			e.prog.unknown.Add(1)
		}
	case wire.KindCtrl:
		r, kinc := wire.ParseKnock(imm.Gen)
		if kinc != uint8(inc) {
			e.prog.unknown.Add(1) // for a freed window whose slot was reused
			return
		}
		w.knock(r, 1)
	}
}
