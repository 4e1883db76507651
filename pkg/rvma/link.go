package rvma

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// link is the connection between two endpoints: its stripes (RC queue
// pairs made with rdma_cm) and the sender views of the peer's windows that
// this endpoint resolved over it. Puts travel only from the dialling side:
// the accepting side sends on it the answers, entries and reports its
// windows owe the dialer, and dials a link of its own to put to the peer.
// So a put flushed behind a refusal of one of the dialer's own requests
// never executed (the responder discards what follows a NAK) and is
// issued again; a put flushed after any other failure (an error on the
// responder side of the QP, a fatal event, a disconnection) may have
// executed, and fails with the link instead (stripe.fault).
type link struct {
	ep    *Endpoint
	id    uint64
	peer  netip.AddrPort // the peer's listening address
	dial  bool           // this endpoint dialled it
	ready chan struct{}  // closed when every stripe is connected (or the link failed)
	dead  chan struct{}  // closed when the link failed
	// stripeCh is closed and replaced whenever a stripe is (re)connected:
	// puts that found no live stripe wait on it.
	stripeCh chan struct{}

	// stripes are written under mu and read without it on the put path
	// (pick, ctrlStripe); the slice's length never changes.
	stripes   []atomic.Pointer[stripe]
	mu        sync.Mutex
	connected int
	err       error // why it failed
	peerViews tableRef
	views     map[Mailbox]*remoteView
	rr        atomic.Uint32
	// noticed: a notice went on the link since its last put (putStripe).
	noticed atomic.Bool

	// LATE reports (late.go). As the receiver: those waiting for the
	// control share of the send queue, and the next report number. As the
	// sender: the report numbers taken.
	lateMu    sync.Mutex
	lateQ     []wire.Ctrl // new reports; the last one may take more late puts
	lateAgain []wire.Ctrl // reports whose send failed: sent first, never merged into (already numbered, maybe delivered)
	lateNum   uint32
	lateTaken seqWindow
}

// stripe is one RC connection of a link.
type stripe struct {
	l    *link
	idx  int
	id   *verbs.CMID
	qp   *verbs.QP
	dead atomic.Bool
	// fault is what the first failed send completion polled on the stripe
	// says about the sends flushed behind it (noteFault).
	fault atomic.Int32
	// up: the QP can send (the accepting side's Accept returned). Until
	// then pick and ctrlStripe pass over the stripe: a post on a QP still
	// in INIT fails, and that failure would break a stripe that is fine.
	up atomic.Bool
	// replaces: it took the place of a failed stripe (set by addStripe).
	replaces bool
	// credits bounds the puts in flight on the send queue; control sends
	// use the rest (ctrlReserve), counted in ctrlOut.
	credits chan struct{}
	ctrlOut atomic.Int32
	mtu     atomic.Uint32 // path MTU in bytes, once queried (Get)

	// The watcher of the stripe's rdma_cm events (startWatch), which
	// close stops first: it would take the disconnection's answer.
	watchMu   sync.Mutex
	closing   bool
	stopWatch context.CancelFunc
	watched   chan struct{} // closed when the watcher returned
}

// Stripe faults: what the first failed send completion polled on a stripe
// says about the sends posted behind it, which complete flushed.
const (
	faultNone = iota
	// faultRefused: the responder refused one of this side's requests (a
	// NAK: remote access, invalid request, remote operation). A responder
	// executes nothing after a NAK, and the NAK acknowledged everything
	// before it, so every send flushed behind it never executed.
	faultRefused
	// faultInDoubt: anything else. A flush came first (the QP went to the
	// error state for a reason on the responder side, a fatal event or a
	// disconnection), or a retry limit or a local error did: a send
	// flushed behind it may have executed at the peer, its acknowledgment
	// lost with the QP.
	faultInDoubt
)

// sendFailed handles err, a failed send completion polled on st (a put, a
// control message or a READ): it notes the fault and breaks the stripe.
func (st *stripe) sendFailed(err error) {
	st.noteFault(err)
	st.broken(err)
}

// noteFault records err, a failed send completion polled on st, if it is
// the stripe's first. The engine handles completions in the order it
// polls them, under one lock, and a QP's send completions come in posting
// order, so the first one noted is the cause of every flush after it.
func (st *stripe) noteFault(err error) {
	f := int32(faultInDoubt)
	if errors.Is(err, verbs.WCRemAccessErr) || errors.Is(err, verbs.WCRemInvReqErr) || errors.Is(err, verbs.WCRemOpErr) {
		f = faultRefused
	}
	st.fault.CompareAndSwap(faultNone, f)
}

// errInDoubt is the error of puts flushed on st after a fault other than
// a refusal: they may have been placed, so they are not issued again. It
// wraps ErrPeerGone.
func (st *stripe) errInDoubt(n int, cause error) error {
	return errPeer(st.l.peer, fmt.Errorf("%d put(s) flushed on stripe %d after a failure other than a refused request, so they may have been placed and are not issued again: %w", n, st.idx, cause))
}

const (
	stripeSendWR = 256
	ctrlReserve  = 64
)

func newLink(ep *Endpoint, peer netip.AddrPort, id uint64, n int, dial bool) *link {
	return &link{ep: ep, id: id, peer: peer, dial: dial, ready: make(chan struct{}), dead: make(chan struct{}),
		stripeCh: make(chan struct{}), stripes: make([]atomic.Pointer[stripe], n), views: map[Mailbox]*remoteView{}}
}

// qpAttr is the attribute set of every stripe's QP: receives from the
// engine's SRQ, completions on its CQ.
func (ep *Endpoint) qpAttr() *verbs.QPInitAttr {
	return &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: ep.e.prog.cq, RecvCQ: ep.e.prog.cq, SRQ: ep.e.prog.srq,
		Cap: verbs.QPCap{MaxSendWR: stripeSendWR, MaxSendSGE: 1, MaxInlineData: wire.EntrySize}}
}

// newStripe creates a stripe's QP on id. Where the module counts, the QP
// is named to it (kmod.Mailboxes.NameQP), so that the module never needs
// memory to let in a put's later packets; whoever closes id after this
// succeeded calls forgetQP first.
func (ep *Endpoint) newStripe(l *link, idx int, id *verbs.CMID) (*stripe, error) {
	qp, err := id.NewQP(ep.e.pd, ep.qpAttr())
	if err != nil {
		return nil, err
	}
	if qp.Cap().MaxInlineData < wire.EntrySize {
		return nil, fmt.Errorf("QP inline data %d < %d: %w", qp.Cap().MaxInlineData, wire.EntrySize, verbs.ErrNotSupported)
	}
	if m := ep.e.mod; m != nil {
		if err := m.mb.NameQP(qp.QPN()); err != nil {
			return nil, fmt.Errorf("naming QP %#x to the kernel module: %w", qp.QPN(), err)
		}
	}
	st := &stripe{l: l, idx: idx, id: id, qp: qp, credits: make(chan struct{}, stripeSendWR-ctrlReserve)}
	return st, nil
}

// forgetQP undoes newStripe's naming of st's QP, before its id is closed
// (the device reuses the QP's number). Its error is dropped: the only
// one possible is the module's file closed, which forgot every name.
func (ep *Endpoint) forgetQP(st *stripe) {
	if m := ep.e.mod; m != nil {
		m.mb.ForgetQP(st.qp.QPN())
	}
}

// link returns the usable link to dst, dialling it if there is none, and
// waits until it is connected. Errors wrap ErrClosed, ErrPeerGone (the
// dial failed: unreachable, refused, timed out) or ctx's error.
func (ep *Endpoint) link(ctx context.Context, dst netip.AddrPort) (*link, error) {
	ep.mu.Lock()
	if err := ep.downLocked(); err != nil {
		ep.mu.Unlock()
		return nil, err
	}
	l := ep.links[dst]
	if l == nil {
		var b [8]byte
		rand.Read(b[:])
		l = newLink(ep, dst, binary.LittleEndian.Uint64(b[:]), ep.opts.Stripes, true)
		ep.links[dst] = l
		ep.spawnLocked(func() { ep.dialLink(l) })
	}
	ep.mu.Unlock()
	select {
	case <-l.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("connecting to %v: %w", dst, ctx.Err())
	}
	select {
	case <-l.dead:
		return nil, l.failure()
	default:
	}
	return l, nil
}

func (l *link) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// errDialTimeout is the cause of a dial's context once
// EndpointOptions.DialTimeout has passed. It wraps os.ErrDeadlineExceeded,
// not context.DeadlineExceeded: the timeout is the endpoint's, and a
// caller testing its own context's end must not mistake it for that.
var errDialTimeout = fmt.Errorf("dial timed out (EndpointOptions.DialTimeout): %w", os.ErrDeadlineExceeded)

// dialContext returns the context a dial runs under: the endpoint's,
// bounded by EndpointOptions.DialTimeout.
func (ep *Endpoint) dialContext() (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ep.ctx, ep.opts.DialTimeout, errDialTimeout)
}

// dialErr is err, the failure of a dial under ctx (dialContext), as the
// puts waiting on the link see it: errDialTimeout when the dial timed
// out, ErrClosed when the endpoint is closing, instead of the context's
// errors, which would read as the caller's own context ending.
func dialErr(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if context.Cause(ctx) == errDialTimeout {
		return fmt.Errorf("%w (%v)", errDialTimeout, err)
	}
	return fmt.Errorf("endpoint closing: %w (%v)", ErrClosed, err)
}

// dialLink connects every stripe of l in turn.
func (ep *Endpoint) dialLink(l *link) {
	ctx, cancel := ep.dialContext()
	defer cancel()
	for i := range l.stripes {
		if err := ep.dialStripe(ctx, l, i); err != nil {
			l.fail(errPeer(l.peer, fmt.Errorf("dial stripe %d: %w", i, dialErr(ctx, err))), false)
			return
		}
	}
	close(l.ready)
}

// resolveAttempt bounds one rdma_resolve_addr. The kernel can miss the
// neighbour update that should finish a resolution (when the ARP reply
// lands before the request is queued) and then waits for the whole
// timeout: seen in the lab as a 10 s dial failure. Short attempts on fresh
// identifiers find the neighbour resolved by the first one.
const resolveAttempt = time.Second

// resolveAddr returns a new identifier with dst's address resolved.
func (ep *Endpoint) resolveAddr(ctx context.Context, dst netip.AddrPort) (*verbs.CMID, error) {
	for {
		id, err := verbs.NewCMID(verbs.PSTCP)
		if err != nil {
			return nil, err
		}
		actx, cancel := context.WithTimeout(ctx, resolveAttempt)
		err = id.ResolveAddr(actx, netip.AddrPortFrom(ep.addr.Addr(), 0), dst)
		cancel()
		if err == nil {
			return id, nil
		}
		id.Close()
		if ctx.Err() != nil {
			return nil, err
		}
		var ce *verbs.CMEventError
		if !errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &ce) {
			return nil, err
		}
	}
}

func (ep *Endpoint) dialStripe(ctx context.Context, l *link, i int) (err error) {
	id, err := ep.resolveAddr(ctx, l.peer)
	if err != nil {
		return err
	}
	var st *stripe
	defer func() {
		if err != nil {
			if st != nil {
				ep.forgetQP(st)
			}
			id.Close()
		}
	}()
	if err = id.ResolveRoute(ctx); err != nil {
		return err
	}
	dev, err := id.Context()
	if err != nil {
		return err
	}
	if dev.CPtr() != ep.e.dev.CPtr() {
		return invalidf("%v is reached through device %s, not the endpoint's %s", l.peer, dev.Name(), ep.e.dev.Name())
	}
	if st, err = ep.newStripe(l, i, id); err != nil {
		return err
	}
	h, err := hello{Stripe: uint8(i), Stripes: uint8(len(l.stripes)), LinkID: l.id, Listen: ep.addr,
		Views: tableRef{Addr: ep.viewMR.Addr(), RKey: ep.viewMR.RKey(), Slots: viewSlots}}.marshal()
	if err != nil {
		return err
	}
	// The peer may send a control message on the stripe (a LATE report,
	// on a replacement) as soon as its Accept returns, which can be before
	// Connect returns here and addStripe records it: ctrl finds the link
	// through dialing meanwhile. Only ctrl: an error on a stripe not yet
	// installed must not make broken dial a second replacement.
	qpn := st.qp.QPN()
	ep.mu.Lock()
	ep.dialing[qpn] = l
	ep.mu.Unlock()
	defer func() {
		ep.mu.Lock()
		delete(ep.dialing, qpn)
		ep.mu.Unlock()
	}()
	d := uint8(ep.e.rdDepth)
	if err = id.Connect(ctx, &verbs.ConnParam{PrivateData: h, ResponderResources: d, InitiatorDepth: d}); err != nil {
		return err
	}
	w, err := parseWelcome(id.AcceptData())
	if err != nil {
		id.Disconnect(ctx)
		return err
	}
	st.up.Store(true) // Connect returned: the QP is ready to send
	if !ep.addStripe(l, st, w.Views) {
		return fmt.Errorf("link to %v: %w", l.peer, ErrClosed)
	}
	ep.startWatch(st)
	return nil
}

// addStripe records a stripe of l, replacing the one with its index. It
// reports false when the link failed meanwhile. A stripe not yet up is
// only known to the receiving path until stripeUp.
func (ep *Endpoint) addStripe(l *link, st *stripe, views tableRef) bool {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if ep.closed || l.err != nil {
		return false
	}
	old := l.stripes[st.idx].Load()
	if old != nil {
		ep.retireStripe(old)
	} else {
		l.connected++
	}
	st.replaces = old != nil
	l.stripes[st.idx].Store(st)
	l.peerViews = views
	ep.byQPN[st.qp.QPN()] = st
	if st.up.Load() {
		ep.stripeUpLocked(st)
	}
	return true
}

// stripeUp marks an accepted stripe ready to send once its Accept
// returned: puts and notices waiting for a live stripe go on, and if it
// replaced a stripe, the entries its peer mirrors are pushed again. It
// reports false if the stripe is no longer its link's (replaced again, or
// the link failed).
func (ep *Endpoint) stripeUp(st *stripe) bool {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	l := st.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if ep.closed || l.err != nil || l.stripes[st.idx].Load() != st {
		return false
	}
	st.up.Store(true)
	ep.stripeUpLocked(st)
	return true
}

// stripeUpLocked wakes what waits for a live stripe of st's link and, for
// a replacement, re-pushes the entries the peer mirrors (the notices in
// flight on the old stripe were lost with it). The caller holds ep.mu and
// the link's mu.
func (ep *Endpoint) stripeUpLocked(st *stripe) {
	l := st.l
	close(l.stripeCh)
	l.stripeCh = make(chan struct{})
	if st.replaces {
		ep.spawnLocked(func() { ep.repush(l) })
	}
}

// maxRetired bounds the replaced stripes whose control messages are still
// taken (Endpoint.retired).
const maxRetired = 256

type retiredQP struct {
	qpn uint32
	st  *stripe
}

// retireStripe takes a replaced stripe out of service: Gets reading on it
// read again elsewhere; its QP is moved to the error state, so that every
// put still recorded on it completes, executed or flushed (sendDone
// issues the flushed ones again if the stripe failed by a refusal, and
// fails the link otherwise: stripe.fault), and once they did, or after
// retireDrain, it is disconnected and destroyed. The caller holds ep.mu
// and l.mu.
//
// A stripe is not always retired after its failure was polled: a post
// that failed on a QP already in error, or a replacement the peer dialled,
// can come while the completions of puts posted before it still wait in
// the CQ. Such a put may have been placed already, and issuing it again
// would place it twice.
func (ep *Endpoint) retireStripe(old *stripe) {
	old.dead.Store(true)
	qpn := old.qp.QPN()
	delete(ep.byQPN, qpn)
	if len(ep.retiredOrder) == maxRetired {
		if r := ep.retiredOrder[0]; ep.retired[r.qpn] == r.st {
			delete(ep.retired, r.qpn)
		}
		ep.retiredOrder = ep.retiredOrder[1:]
	}
	ep.retired[qpn] = old
	ep.retiredOrder = append(ep.retiredOrder, retiredQP{qpn, old})
	for _, g := range ep.gets {
		if g.st == old {
			// One outcome per READ in flight: the Get counts them.
			for range g.inflight {
				g.finish(verbs.WCWRFlushErr)
			}
			g.st, g.inflight = nil, 0
		}
	}
	ep.spawnLocked(func() {
		old.qp.ToError() // a QP already in error stays so
		ep.drainStripe(old)
		old.close()
	})
}

// retireDrain bounds how long a retired stripe's puts are waited for.
const retireDrain = time.Second

// drainStripe waits until no put is recorded on old (its QP is in the
// error state, so each one completes), at most retireDrain while the
// endpoint lives. What is left then is taken back and issued again, as a
// flushed put, if old failed by a refusal; otherwise it may have been
// placed, and it fails with the link.
func (ep *Endpoint) drainStripe(old *stripe) {
	ep.e.waitBegin() // the completions come from the engine's progress
	defer ep.e.waitEnd()
	for deadline := time.Now().Add(retireDrain); time.Now().Before(deadline) && ep.ctx.Err() == nil; {
		if !ep.recordedOn(old) {
			return
		}
		ep.e.pollOnce()
		time.Sleep(100 * time.Microsecond)
	}
	var again []*PutOp
	ep.mu.Lock()
	for id, op := range ep.puts {
		if op.st == old {
			delete(ep.puts, id)
			op.flushes++ // never completed: handled like a flushed put (sendDone)
			again = append(again, op)
		}
	}
	ep.mu.Unlock()
	if len(again) > 0 && old.fault.Load() != faultRefused {
		err := old.errInDoubt(len(again), fmt.Errorf("no completion within %v of the stripe's retirement", retireDrain))
		old.l.fail(err, false)
		for _, op := range again {
			op.finishInDoubt(err)
		}
		return
	}
	for _, op := range again {
		op.view.mu.Lock()
		if op.view.sv != nil {
			op.view.sv.abort(op.gen, uint64(op.n))
		}
		op.view.mu.Unlock()
		go ep.run(op)
	}
}

// recordedOn reports whether a put in flight is recorded on st.
func (ep *Endpoint) recordedOn(st *stripe) bool {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	for _, op := range ep.puts {
		if op.st == st {
			return true
		}
	}
	return false
}

// close stops the stripe's watcher, disconnects the stripe (waiting a
// little for the peer's answer) and destroys it.
func (st *stripe) close() {
	st.watchMu.Lock()
	st.closing = true
	stop, watched := st.stopWatch, st.watched
	st.watchMu.Unlock()
	if stop != nil {
		stop()
		<-watched
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	st.id.Disconnect(ctx)
	cancel()
	st.l.ep.forgetQP(st)
	st.id.Close()
}

// spawnLocked runs f on a goroutine that Close waits for. The caller holds
// ep.mu, where Close sets closed, so no goroutine starts after Close began
// waiting; once closed it runs nothing and reports false.
func (ep *Endpoint) spawnLocked(f func()) bool {
	if ep.closed {
		return false
	}
	ep.wg.Add(1)
	go func() {
		defer ep.wg.Done()
		f()
	}()
	return true
}

// startWatch starts watching a connected stripe's rdma_cm events (not
// before: Accept and Connect read the same event channel).
func (ep *Endpoint) startWatch(st *stripe) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	st.watchMu.Lock()
	defer st.watchMu.Unlock()
	if st.closing {
		return
	}
	ctx, stop := context.WithCancel(ep.ctx)
	watched := make(chan struct{})
	if ep.spawnLocked(func() {
		err := ep.watch(ctx, st)
		close(watched) // before failing the link: its teardown waits for it
		if err != nil {
			st.l.fail(err, false)
		}
	}) {
		st.stopWatch, st.watched = stop, watched
	} else {
		stop()
	}
}

// acceptLoop takes connection requests until the endpoint closes.
func (ep *Endpoint) acceptLoop() {
	defer ep.wg.Done()
	for {
		id, ev, err := ep.listener.GetRequest(ep.ctx)
		if err != nil {
			if ep.ctx.Err() != nil || errors.Is(err, verbs.ErrClosed) {
				return
			}
			continue // an unexpected event on the listener; keep listening
		}
		ep.wg.Add(1)
		go func() {
			defer ep.wg.Done()
			ep.accept(id, ev)
		}()
	}
}

// accept answers one stripe's connection request.
func (ep *Endpoint) accept(id *verbs.CMID, ev verbs.CMEvent) {
	h, err := parseHello(ev.PrivateData)
	if err != nil {
		ep.rejected.Add(1)
		id.Reject(nil)
		id.Close()
		return
	}
	ep.mu.Lock()
	l := ep.accepted[h.LinkID]
	if l == nil && ep.downLocked() == nil {
		l = newLink(ep, h.Listen, h.LinkID, int(h.Stripes), false)
		ep.accepted[h.LinkID] = l
	}
	// A stripe index already connected is a replacement: the dialer
	// re-dials a stripe it saw fail (this side may not have noticed yet).
	ok := ep.downLocked() == nil && l != nil && len(l.stripes) == int(h.Stripes) && l.peer == h.Listen
	ep.mu.Unlock()
	if !ok {
		ep.rejected.Add(1)
		id.Reject(nil)
		id.Close()
		return
	}
	// The stripe is known before the connection is established: the
	// dialer may send on it as soon as its Connect returns, which can be
	// before Accept returns here.
	st, err := ep.newStripe(l, int(h.Stripe), id)
	if err == nil && !ep.addStripe(l, st, h.Views) {
		err = fmt.Errorf("link to %v: %w", h.Listen, ErrClosed)
		ep.forgetQP(st)
		st = nil // not the link's: closed below
	}
	if d := ep.acceptDelay.Load(); err == nil && d > 0 {
		time.Sleep(time.Duration(d))
	}
	if err == nil {
		var w []byte
		w, err = welcome{Views: tableRef{Addr: ep.viewMR.Addr(), RKey: ep.viewMR.RKey(), Slots: viewSlots},
			Descs: tableRef{Addr: ep.e.desc.mr.Addr(), RKey: ep.e.desc.mr.RKey(), Slots: engineSlots}}.marshal()
		if err == nil {
			ctx, cancel := context.WithTimeout(ep.ctx, ep.opts.DialTimeout)
			// The READ depth in each direction: what the dialer asked
			// for, at most what this device supports.
			d := uint8(ep.e.rdDepth)
			err = id.Accept(ctx, &verbs.ConnParam{PrivateData: w,
				ResponderResources: min(d, max(ev.InitiatorDepth, 1)), InitiatorDepth: min(d, max(ev.ResponderResources, 1))})
			cancel()
		}
	}
	if err != nil && st != nil && st.dead.Load() {
		// Replaced meanwhile: the dialer connected this stripe, saw it
		// fail (a put refused on it) and dialled the next, whose
		// acceptance retired this one and closed it under Accept, which
		// was still waiting for the connection to be established. The
		// link goes on with the newer stripe.
		return
	}
	if err != nil {
		ep.rejected.Add(1)
		if st == nil {
			id.Close()
		}
		l.fail(errPeer(h.Listen, fmt.Errorf("accept stripe %d: %w", h.Stripe, err)), false)
		return
	}
	if !ep.stripeUp(st) {
		return // replaced meanwhile (retired and closed as above), or the link failed
	}
	ep.startWatch(st)
	l.flushLate() // reports held while the stripe was not ready to send
	ep.mu.Lock()
	l.mu.Lock()
	complete := l.connected == len(l.stripes)
	l.mu.Unlock()
	first := false
	if complete {
		select {
		case <-l.ready:
		default:
			first = true
		}
	}
	ep.mu.Unlock()
	if first {
		close(l.ready)
	}
}

// watch waits for the stripe's rdma_cm events until ctx ends or the
// stripe goes away. A disconnection of a stripe still in service returns
// the error that fails the link.
func (ep *Endpoint) watch(ctx context.Context, st *stripe) error {
	for {
		ev, err := st.id.WaitEvent(ctx)
		if err != nil {
			return nil // stopped or closed: the stripe, its link or the endpoint is going away
		}
		switch ev.Type {
		case verbs.CMDisconnected, verbs.CMDeviceRemoval, verbs.CMTimewaitExit:
			// A replaced stripe going away is expected; the current one
			// going away means the peer is leaving.
			// A stripe already known broken is being replaced (the
			// dialer's redial decides the link's fate).
			l := st.l
			l.mu.Lock()
			current := l.stripes[st.idx].Load() == st
			l.mu.Unlock()
			if current && !st.dead.Load() {
				return errPeer(l.peer, fmt.Errorf("stripe %d: %v", st.idx, ev.Type))
			}
			return nil
		}
	}
}

// pick returns the next live stripe, round-robin, or nil if none is left.
func (l *link) pick() *stripe {
	n := uint32(len(l.stripes))
	start := l.rr.Add(1)
	for i := uint32(0); i < n; i++ {
		st := l.stripes[(start+i)%n].Load()
		if st != nil && st.up.Load() && !st.dead.Load() {
			return st
		}
	}
	return nil
}

// putStripe returns the stripe of the next put: the one notices travel
// on when a notice went since the last put, so that at the peer the
// notice comes first (notice.go); otherwise the next live one.
func (l *link) putStripe() *stripe {
	if l.noticed.Swap(false) && len(l.stripes) > 1 {
		if st := l.ctrlStripe(); st != nil {
			return st
		}
	}
	return l.pick()
}

// ctrlStripe is the stripe control messages and notices travel on: the
// first live one, so that they stay in order while it lives.
func (l *link) ctrlStripe() *stripe {
	for i := range l.stripes {
		if st := l.stripes[i].Load(); st != nil && st.up.Load() && !st.dead.Load() {
			return st
		}
	}
	return nil
}

// broken marks a stripe whose QP went to the error state (an RC error is
// fatal to the QP on both sides). The dialling side connects a
// replacement with the same index; if that fails, the link fails. The
// accepting side waits for the replacement, or for the disconnection,
// at most replaceWait: a dialer that saw no error (the failure was local
// to this side) or could not dial again would otherwise leave the link
// without that stripe for good, and what waits for it would hang.
func (st *stripe) broken(cause error) {
	if st.dead.Swap(true) {
		return
	}
	l, ep := st.l, st.l.ep
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if !l.dial {
		ep.spawnLocked(func() { st.awaitReplacement(cause) })
		return
	}
	ep.spawnLocked(func() {
		ctx, cancel := ep.dialContext()
		defer cancel()
		if err := ep.dialStripe(ctx, l, st.idx); err != nil {
			l.fail(errPeer(l.peer, fmt.Errorf("stripe %d failed (%v) and could not be replaced: %w", st.idx, cause, dialErr(ctx, err))), false)
		}
	})
}

// replaceWait is how long the accepting side of a link waits for the
// dialer to replace a failed stripe before it fails the link: twice what
// the dialer may take to dial (EndpointOptions.DialTimeout).
func (ep *Endpoint) replaceWait() time.Duration { return 2 * ep.opts.DialTimeout }

// awaitReplacement fails st's link unless the dialer replaces st within
// replaceWait (the accepting side of broken).
func (st *stripe) awaitReplacement(cause error) {
	l, ep := st.l, st.l.ep
	d := ep.replaceWait()
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		replaced := l.replaced()
		if l.stripes[st.idx].Load() != st {
			return
		}
		select {
		case <-replaced:
		case <-l.dead:
			return
		case <-ep.ctx.Done():
			return
		case <-t.C:
			if l.stripes[st.idx].Load() == st {
				l.fail(errPeer(l.peer, fmt.Errorf("stripe %d failed (%v) and the peer did not replace it within %v", st.idx, cause, d)), false)
			}
			return
		}
	}
}

// fail tears the link down: every put pending on it fails with err (which
// wraps ErrPeerGone or ErrClosed), puts waiting on it wake up, the
// endpoint forgets it (the next put to the peer dials again) and its
// stripes are disconnected and destroyed. Idempotent.
func (l *link) fail(err error, wait bool) {
	ep := l.ep
	ep.mu.Lock()
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		ep.mu.Unlock()
		return
	}
	l.err = err
	stripes := make([]*stripe, len(l.stripes))
	for i := range l.stripes {
		stripes[i] = l.stripes[i].Load()
	}
	views := l.views
	l.views = map[Mailbox]*remoteView{}
	l.mu.Unlock()
	if !ep.closed || !errors.Is(err, ErrClosed) {
		ep.linkFailures.Add(1)
	}
	if ep.links[l.peer] == l {
		delete(ep.links, l.peer)
	}
	if ep.accepted[l.id] == l {
		delete(ep.accepted, l.id)
	}
	var ops []*PutOp
	for id, op := range ep.puts {
		if op.st != nil && op.st.l == l {
			delete(ep.puts, id)
			ops = append(ops, op)
		}
	}
	for _, st := range stripes {
		if st != nil {
			st.dead.Store(true)
			delete(ep.byQPN, st.qp.QPN())
		}
	}
	for qpn, rs := range ep.retired {
		if rs.l == l {
			delete(ep.retired, qpn) // its order entry goes when it comes first
		}
	}
	for slot, subs := range ep.subs {
		kept := subs[:0]
		for _, s := range subs {
			if s.l != l {
				kept = append(kept, s)
			}
		}
		ep.subs[slot] = kept
	}
	for slot, owed := range ep.owed {
		ep.owed[slot] = slices.DeleteFunc(owed, func(s subscriber) bool { return s.l == l })
	}
	if ep.reroutedLocked(l) {
		ep.spawnLocked(ep.e.flushPushes)
	}
	for _, v := range views {
		ep.freeView(v)
	}
	teardown := func() {
		for _, st := range stripes {
			if st != nil {
				st.close()
			}
		}
	}
	// In the background unless the caller waits or Close is under way
	// (Close must not return before the stripes are gone).
	async := !wait && ep.spawnLocked(teardown)
	ep.mu.Unlock()
	ep.dropLate(l)

	close(l.dead)
	select {
	case <-l.ready:
	default:
		close(l.ready)
	}
	for _, v := range views {
		v.wake()
	}
	for _, op := range ops {
		op.finishInDoubt(err)
	}
	if !async {
		teardown()
	}
}

// ctrlTag marks control sends and notices among link send IDs.
const ctrlTag = 1 << 62

// sendCtrl posts a control message (SEND WITH IMMEDIATE, inline) on the
// link's control stripe.
func (l *link) sendCtrl(m wire.Ctrl) error { return l.sendCtrlID(m, 0) }

// sendCtrlID is sendCtrl with id (below ctrlTag) in the work request's ID,
// which the send's completion brings back to sendDone.
func (l *link) sendCtrlID(m wire.Ctrl, id uint64) error {
	b, err := wire.AppendCtrl(nil, m)
	if err != nil {
		return wireErr(err)
	}
	if l.ep.loseCtrl != nil && l.ep.loseCtrl(m) {
		return nil
	}
	imm, _ := wire.Imm{Kind: wire.KindCtrl}.Encode()
	return l.postCtrl(verbs.SendWR{ID: id, Op: verbs.OpSendImm, Imm: imm}, b)
}

// errNoStripe is wrapped by postCtrl when every stripe of a link that has
// not failed is being replaced.
var errNoStripe = errors.New("no live stripe")

// sendCtrlWait sends m like sendCtrl, but while every stripe is being
// replaced, or the control share of the send queue is full, it waits and
// tries again, until ctx ends or the link fails.
func (l *link) sendCtrlWait(ctx context.Context, m wire.Ctrl) error {
	for {
		err := l.sendCtrl(m)
		if err == nil || !errors.Is(err, errNoStripe) && !errors.Is(err, verbs.ErrQueueFull) {
			return err
		}
		// Retry after a millisecond too: the queue drains, or a stripe
		// came up before stripeCh was read.
		if _, err := l.pause(ctx, l.replaced(), nil, time.Millisecond); err != nil {
			return fmt.Errorf("sending %v: %w", m.Type, err)
		}
	}
}

// replaced returns the channel closed when a stripe of l is next
// (re)connected.
func (l *link) replaced() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stripeCh
}

// pause waits until done is closed (it reports true), replaced is closed,
// or d passes. Errors are ctx's error or the link's failure.
func (l *link) pause(ctx context.Context, replaced, done <-chan struct{}, d time.Duration) (bool, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true, nil
	case <-replaced:
	case <-t.C:
	case <-l.dead:
		return false, l.failure()
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return false, nil
}

// exchange sends m on l and waits until answered is closed. A stripe
// that fails loses the control messages in flight on it, m or its answer,
// so m is sent again whenever a stripe of l is replaced, and after a
// timeout that doubles from 50 ms to a second (the two ends of a link
// replace a stripe at different moments: the answer can be lost on the
// peer's old stripe after this end already replaced it). With first
// false the first send is skipped (another goroutine made it). The
// receiver must treat a repeated m as one, and the caller must drop a
// repeated answer. Errors wrap ctx's error or the link's failure.
func (l *link) exchange(ctx context.Context, m wire.Ctrl, answered <-chan struct{}, first bool) error {
	for rto := 50 * time.Millisecond; ; rto = min(2*rto, time.Second) {
		replaced := l.replaced()
		if first {
			if err := l.sendCtrlWait(ctx, m); err != nil {
				return err
			}
		}
		first = true
		done, err := l.pause(ctx, replaced, answered, rto)
		if err != nil {
			return fmt.Errorf("waiting for the answer to %v: %w", m.Type, err)
		}
		if done {
			return nil
		}
	}
}

// awaitStripe returns a live stripe of l, waiting while every one is being
// replaced, until ctx ends or the link fails.
func (l *link) awaitStripe(ctx context.Context) (*stripe, error) {
	for {
		if st := l.pick(); st != nil {
			return st, nil
		}
		wait := l.replaced()
		if st := l.pick(); st != nil {
			return st, nil
		}
		select {
		case <-wait:
		case <-l.dead:
			return nil, l.failure()
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for a live stripe: %w", ctx.Err())
		}
	}
}

// knock posts a zero-length WRITE WITH IMMEDIATE that makes the receiver
// count a put refused against its closed window slot, if the slot still
// holds that incarnation of the window.
func (l *link) knock(slot, incarnation uint32, r wire.KnockReason) error {
	imm, err := wire.Imm{Kind: wire.KindCtrl, Slot: slot, Gen: wire.KnockGen(r, incarnation)}.Encode()
	if err != nil {
		return wireErr(err)
	}
	return l.postCtrl(verbs.SendWR{Op: verbs.OpWriteImm, Imm: imm}, nil)
}

// postCtrl posts wr, with data inline, on the control stripe, signaled so
// that the send queue drains; it fails rather than block when the
// control share of the queue is used up.
func (l *link) postCtrl(wr verbs.SendWR, data []byte) error {
	st := l.ctrlStripe()
	if st == nil {
		return errPeer(l.peer, errNoStripe)
	}
	if st.ctrlOut.Add(1) > ctrlReserve {
		st.ctrlOut.Add(-1)
		return fmt.Errorf("link to %v: %w", l.peer, verbs.ErrQueueFull)
	}
	ep := l.ep
	wr.ID |= sendTag | ctrlTag
	wr.Flags |= verbs.SendSignaled | verbs.SendInline
	ep.ctrlMu.Lock()
	if len(data) > 0 {
		copy(ep.ctrlMR.Bytes(), data)
		wr.SGL = []verbs.SGE{{Addr: ep.ctrlMR.Addr(), Length: uint32(len(data)), LKey: ep.ctrlMR.LKey()}}
	}
	err := st.qp.PostSend(wr)
	ep.ctrlMu.Unlock()
	if err != nil {
		st.ctrlOut.Add(-1)
		return fmt.Errorf("link to %v: %w", l.peer, err)
	}
	return nil
}
