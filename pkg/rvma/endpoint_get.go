package rvma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Get reads bytes of a completed epoch whose buffer the receiving window
// still keeps (WindowOptions.Keep, the rewind ring): the sender asks for
// the epoch (GET), the receiver binds a read-only type 1 memory window
// over the bytes placed in that buffer and answers with it (GETREPLY), and
// the sender reads them with RDMA READs. The receiver unbinds that
// window before the buffer leaves the ring and can be posted again, so a
// get returns the epoch's bytes or fails with ErrStale, never a mixture of
// two epochs. docs/rvma.md, section 9.

// GetResult says what a Get read.
type GetResult struct {
	Epoch uint64 // the epoch read (the newest kept one for LastEpoch)
	Len   uint64 // the epoch's length: the bytes placed into its buffer
	N     int    // the bytes read into the destination
}

// Get reads min(len(into), Len-off) bytes at offset off of epoch epoch
// (LastEpoch: the newest one kept) of the window behind mailbox mb at the
// endpoint listening on dst, where Len is the bytes the epoch placed into
// its buffer (the record's Len), and reports what it read. It dials and
// resolves like a put. Only epochs the receiving window still keeps for
// rewind can be read: their buffers do not change until they leave the
// ring. into may be endpoint memory (Alloc), which the NIC writes
// directly, or any other slice, read through a registered copy (for up to
// 4 KiB one the endpoint keeps, see PutAsync).
//
// ctx bounds dialling, resolving, the receiver's answer and waiting for
// room in the send queue; once the READ is posted Get waits for its
// completion, which the link's retry timeout bounds. Errors wrap
// ErrNoBuffer (the epoch has not completed, or none has), ErrStale (the
// epoch is no longer kept, or left the ring while it was read), ErrTooLarge
// (off beyond the epoch's length), ErrNoMailbox, ErrPeerGone, ErrClosed,
// ErrInvalid or ctx's error. After an error the contents of into are
// undefined.
func (ep *Endpoint) Get(ctx context.Context, dst netip.AddrPort, mb Mailbox, epoch, off uint64, into []byte) (GetResult, error) {
	var res GetResult
	err := ctx.Err() // an ended ctx fails Get before it does anything
	if err == nil {
		res, err = ep.get(ctx, dst, mb, epoch, off, into)
	}
	if err != nil {
		e := "last"
		if epoch != LastEpoch {
			e = fmt.Sprint(epoch)
		}
		return res, fmt.Errorf("rvma: get of %d bytes at offset %d of epoch %s of %v on %v: %w", len(into), off, e, mb, dst, sentinelOr(ErrDevice, err))
	}
	return res, nil
}

// getOp is a Get waiting for its answer and then for its READ.
type getOp struct {
	seq uint32
	l   *link
	// answered is closed when answer holds the GETREPLY or NACK of the
	// GET in flight (both under ep.mu).
	answered chan struct{}
	answer   wire.Ctrl
	done     chan error // the outcome of each READ posted, one value each
	st       *stripe    // the stripe of the READs in flight (under ep.mu)
	inflight int        // READs posted on st whose outcome is not yet sent (under ep.mu)
	// abandoned: read returned with READs in flight (the link died), which
	// may still write into its destination.
	abandoned bool
}

// readDepth is how many single-packet READs a Get keeps in flight, and
// the RDMA READ depth a link's stripes ask for in both directions
// (clamped to what the device supports, engine.rdDepth).
const readDepth = 64

// readTag marks the work request IDs of a Get's READ among link sends; the
// low 32 bits are the get's Seq.
const readTag = 1 << 61

func (ep *Endpoint) get(ctx context.Context, dst netip.AddrPort, mb Mailbox, epoch, off uint64, into []byte) (GetResult, error) {
	if err := ep.use(); err != nil {
		return GetResult{}, err
	}
	if uint64(len(into)) > 1<<31 {
		return GetResult{}, invalidf("a get of %d bytes", len(into))
	}
	op := &getOp{done: make(chan error, readDepth+1)}
	defer func() {
		ep.mu.Lock()
		delete(ep.gets, op.seq)
		ep.mu.Unlock()
	}()

	var m wire.Ctrl
	for attempt := 0; ; attempt++ {
		l, err := ep.link(ctx, dst)
		if err != nil {
			return GetResult{}, err
		}
		v, err := ep.resolve(ctx, l, mb)
		if err != nil {
			return GetResult{}, err
		}
		v.mu.Lock()
		slot, sv, verr := v.slot, v.sv, v.err
		var inc uint32
		if sv != nil {
			inc = sv.incarnation
		}
		v.mu.Unlock()
		if sv == nil {
			return GetResult{}, verr
		}
		// Each attempt has its own Seq: a late answer to an earlier one
		// is then not taken for this one's.
		ep.mu.Lock()
		delete(ep.gets, op.seq)
		ep.getSeq++
		op.seq = wire.GetSeqBit | ep.getSeq&(wire.GetSeqBit-1)
		ep.gets[op.seq] = op
		op.l = l
		op.answered = make(chan struct{})
		ep.mu.Unlock()
		ep.e.waitBegin()
		err = l.exchange(ctx, wire.Ctrl{Type: wire.CtrlGet, Seq: op.seq, Slot: slot, Incarnation: inc, Epoch: epoch}, op.answered, true)
		ep.e.waitEnd()
		if err != nil {
			return GetResult{}, err
		}
		ep.mu.Lock()
		m = op.answer
		ep.mu.Unlock()
		if m.Type == wire.CtrlGetReply {
			break
		}
		err = nackErr(m.Reason)
		if !errors.Is(err, ErrNoMailbox) || attempt > 0 {
			return GetResult{}, err
		}
		// The window this view named was freed: resolve the mailbox
		// again, once (it may have been opened anew).
		ep.dropView(l, v)
	}
	res := GetResult{Epoch: m.Epoch, Len: uint64(m.Len)}
	if off > res.Len {
		return res, fmt.Errorf("offset %d beyond the epoch's %d bytes: %w", off, res.Len, ErrTooLarge)
	}
	n := min(uint64(len(into)), res.Len-off)
	if n == 0 {
		return res, nil
	}
	sge := verbs.SGE{Addr: heapAddr(into), Length: uint32(n)}
	var cp regCopy
	if mr := ep.e.mem.arenaOf(sge.Addr, n); mr != nil {
		sge.LKey = mr.LKey()
	} else {
		var err error
		if cp, err = ep.e.newCopy(int(n)); err != nil {
			return res, err
		}
		defer func() { ep.e.dropCopy(cp, op.abandoned) }()
		sge = cp.sge
	}
	for attempt := 1; ; attempt++ {
		err := ep.read(ctx, op, sge, m.Addr+off, m.RKey)
		switch {
		case err == nil:
			copy(into, cp.mem)
			res.N = int(n)
			return res, nil
		case errors.Is(err, verbs.WCRemAccessErr):
			return res, fmt.Errorf("%w: the epoch's buffer left the rewind ring while it was read: %w", ErrStale, err)
		case (errors.Is(err, verbs.WCWRFlushErr) || errors.Is(err, verbs.ErrWrongState)) && attempt < maxAttempts:
			// Flushed behind another failure on its stripe, or posted on
			// a stripe that had just failed: read again on a live one.
		case errors.Is(err, verbs.WCWRFlushErr), errors.Is(err, verbs.ErrWrongState):
			return res, errPeer(dst, err)
		default:
			return res, err
		}
	}
}

// read reads sge.Length bytes at addr/rkey into sge on a live stripe of
// op's link and waits for the READs to complete (an error is the status
// of the first READ that failed), or for the link to fail.
//
// Each READ is one path MTU, a single response packet whose key rxe checks
// as it serves it: a READ of several packets whose memory window is
// unbound between two of them never completed on rxe (Linux 6.1) in the
// lab, the requester waited forever. Up to the link's READ depth
// (engine.rdDepth) of them are in flight at once, posted in chains (one
// system call for as many as completed since the last), so a large Get
// streams instead of paying a round trip per packet. After a failure no
// more are posted, and read returns once every READ in flight has
// completed (the ones behind the failure are flushed), so nothing writes
// into sge after it returned, unless the link died.
func (ep *Endpoint) read(ctx context.Context, op *getOp, sge verbs.SGE, addr uint64, rkey uint32) error {
	l := op.l
	st, err := l.awaitStripe(ctx)
	if err != nil {
		return err
	}
	mtu, err := st.pathMTU()
	if err != nil {
		return err
	}
	depth := ep.e.rdDepth
	ep.e.waitBegin()
	defer ep.e.waitEnd()
	defer func() {
		ep.mu.Lock()
		op.st, op.inflight = nil, 0
		ep.mu.Unlock()
	}()
	var first error // the first failure: post no more, collect the rest
	// A chain holds at most depth READs (64 fits the QP's preallocated
	// post scratch), and never more than the Get needs.
	chain := min(depth, int((sge.Length+mtu-1)/mtu))
	wrs := make([]verbs.SendWR, chain)
	sges := make([]verbs.SGE, chain)
	// inflight counts the READs posted whose outcome has not been
	// received from op.done: each posted READ sends exactly one (readDone,
	// or retireStripe for those its stripe will never complete).
	inflight := 0
	for done := uint32(0); ; {
		if inflight == 0 && (first != nil || done == sge.Length) {
			return first
		}
		var credit chan struct{} // nil: post nothing now
		if first == nil && done < sge.Length && inflight < depth {
			credit = st.credits
		}
		var stop <-chan struct{} // once posted, a READ is waited for
		if inflight == 0 {
			stop = ctx.Done()
		}
		select {
		case credit <- struct{}{}:
			// As many READs as the depth, the send queue's credits and
			// the bytes left allow, posted as one chain.
			k := 0
			for off := done; ; {
				n := min(sge.Length-off, mtu)
				sges[k] = verbs.SGE{Addr: sge.Addr + uint64(off), Length: n, LKey: sge.LKey}
				wrs[k] = verbs.SendWR{ID: sendTag | readTag | uint64(op.seq), Op: verbs.OpRead, Flags: verbs.SendSignaled,
					SGL: sges[k : k+1], RemoteAddr: addr + uint64(off), RKey: rkey}
				k++
				off += n
				if off == sge.Length || inflight+k == depth || !tryCredit(st) {
					break
				}
			}
			ep.mu.Lock()
			op.st = st
			op.inflight += k
			ep.mu.Unlock()
			posted := k
			if err := st.qp.PostSend(wrs[:k]...); err != nil {
				// The chain was posted up to the request the provider
				// refused (a check before posting refuses all of it).
				if pe := (*verbs.PostError)(nil); errors.As(err, &pe) {
					posted = pe.Index
				} else {
					posted = 0
				}
				ep.mu.Lock()
				op.inflight -= k - posted
				ep.mu.Unlock()
				for range k - posted {
					<-st.credits
				}
				if errors.Is(err, verbs.ErrWrongState) {
					st.broken(err) // being replaced: get reads again on another stripe
				}
				first = fmt.Errorf("posting the READ: %w", err)
			}
			inflight += posted
			for _, w := range wrs[:posted] {
				done += w.SGL[0].Length
			}
		case err := <-op.done:
			inflight--
			if err != nil && first == nil {
				first = err
			}
		case <-l.dead:
			op.abandoned = inflight > 0
			return l.failure()
		case <-stop:
			return fmt.Errorf("waiting for room in the send queue: %w", ctx.Err())
		}
	}
}

// tryCredit takes a credit of st's send queue if one is free at once.
func tryCredit(st *stripe) bool {
	select {
	case st.credits <- struct{}{}:
		return true
	default:
		return false
	}
}

// pathMTU returns the stripe's path MTU in bytes (queried once).
func (st *stripe) pathMTU() (uint32, error) {
	if m := st.mtu.Load(); m != 0 {
		return m, nil
	}
	a, err := st.qp.Query()
	if err != nil {
		return 0, err
	}
	m := uint32(a.PathMTU.Bytes())
	st.mtu.Store(m)
	return m, nil
}

// readDone handles the completion of a Get's READ (engine callback, from
// sendDone).
func (ep *Endpoint) readDone(wc verbs.WC) {
	ep.mu.Lock()
	op := ep.gets[uint32(wc.ID)]
	var st *stripe
	if op != nil && op.st != nil && op.st.qp.QPN() == wc.QPN && op.inflight > 0 {
		st = op.st
		op.inflight--
	}
	ep.mu.Unlock()
	if st == nil {
		return // the Get gave up with its link, or reads again on another stripe
	}
	<-st.credits
	err := wc.Err()
	if err != nil {
		st.sendFailed(err)
	}
	op.finish(err)
}

// finish reports the outcome of op's READ.
func (op *getOp) finish(err error) {
	select {
	case op.done <- err:
	default: // cannot happen: there is room for one outcome per READ in flight
	}
}

// getAnswer hands a GETREPLY, or the NACK of a GET, to the Get waiting for
// it (engine callback, from ctrl).
func (ep *Endpoint) getAnswer(l *link, m wire.Ctrl) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	op := ep.gets[m.Seq]
	if op == nil || op.l != l {
		ep.e.prog.unknown.Add(1)
		return
	}
	select {
	case <-op.answered: // a duplicate
	default:
		op.answer = m
		close(op.answered)
	}
}

// serveGet answers a peer's GET: the read-only window over the kept
// buffer of the epoch asked for, or a NACK.
func (ep *Endpoint) serveGet(l *link, m wire.Ctrl) {
	answer := func(a wire.Ctrl) {
		err := l.sendCtrl(a)
		if !errors.Is(err, errNoStripe) && !errors.Is(err, verbs.ErrQueueFull) {
			return // sent, or the link failed: the Get fails with it
		}
		// Every stripe is being replaced, or the control share of the
		// send queue is full: answer once it can be sent.
		ep.mu.Lock()
		defer ep.mu.Unlock()
		ep.spawnLocked(func() {
			ctx, cancel := context.WithTimeout(ep.ctx, ep.opts.DialTimeout)
			defer cancel()
			l.sendCtrlWait(ctx, a)
		})
	}
	nack := func(r wire.NackReason) {
		ep.getsRefused.Add(1)
		answer(wire.Ctrl{Type: wire.CtrlNack, Seq: m.Seq, Reason: r})
	}
	_, inc, w, ok := ep.e.table.Slot(m.Slot)
	if !ok || w == nil || inc != m.Incarnation {
		nack(wire.NackNoMailbox)
		return
	}
	ep.e.mem.expose(w, m.Epoch, func(rec Record, d wire.Desc, err error) {
		switch {
		case errors.Is(err, ErrNoBuffer):
			nack(wire.NackNoBuffer)
		case err != nil:
			nack(wire.NackStale)
		default:
			ep.getsServed.Add(1)
			answer(wire.Ctrl{Type: wire.CtrlGetReply, Seq: m.Seq, Epoch: rec.Epoch, Addr: d.Addr, RKey: d.RKey, Len: d.Len})
		}
	})
}

// exposure is a read-only type 1 memory window over a kept buffer's
// placed bytes, bound for Gets; its fields are under memory.mu.
type exposure struct {
	mw      *verbs.MW
	mr      *verbs.MR
	desc    wire.Desc // Addr and Len at once, RKey when ready
	ready   bool
	hidden  bool                     // hide was dispatched: answer no more Gets with it
	waiters []func(wire.Desc, error) // Gets waiting for the bind
}

// expose finds the kept buffer of epoch in w, binds a read-only window
// over its placed bytes unless one is bound already, and calls reply with
// the epoch's record and the window (from the bind's completion, or at
// once), or with an error wrapping ErrNoBuffer or ErrStale (window.go,
// keptBuffer) or the bind's.
func (m *memory) expose(w *Window, epoch uint64, reply func(Record, wire.Desc, error)) {
	// Under the dispatch lock no hide of the buffer is dispatched between
	// finding it kept and posting its bind: the unbind comes after.
	w.dispatch.Lock()
	defer w.dispatch.Unlock()
	w.mu.Lock()
	b, err := w.st.keptBuffer(epoch)
	var rec Record
	if b != nil {
		rec = b.rec
	}
	w.mu.Unlock()
	if err != nil {
		reply(rec, wire.Desc{}, err)
		return
	}
	n := min(rec.Len, rec.Cap) // overlapping puts count more bytes than they cover
	if n == 0 {
		reply(rec, wire.Desc{Addr: rec.Addr}, nil) // nothing to read, nothing to bind
		return
	}
	f := func(d wire.Desc, err error) { reply(rec, d, err) }
	mr := m.arenaOf(b.addr, b.cap)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		f(wire.Desc{}, ErrClosed)
		return
	}
	if ex := m.exposed[b]; ex != nil {
		if ex.ready {
			d := ex.desc
			m.mu.Unlock()
			f(d, nil)
			return
		}
		ex.waiters = append(ex.waiters, f)
		m.mu.Unlock()
		return
	}
	ex := &exposure{mr: mr, desc: wire.Desc{Addr: b.addr, Len: uint32(n)}, waiters: []func(wire.Desc, error){f}}
	if k := len(m.mws[mr]); k > 0 {
		ex.mw = m.mws[mr][k-1]
		m.mws[mr] = m.mws[mr][:k-1]
	}
	m.exposed[b] = ex
	m.nextID++
	id := m.nextID
	m.mu.Unlock()
	if ex.mw == nil {
		mw, err := m.pd.AllocMW(verbs.MWType1)
		if err != nil {
			m.exposeFailed(bindOp{b: b, ex: ex}, fmt.Errorf("rvma: memory window for window %v: %w", w.mailbox, err))
			return
		}
		ex.mw = mw // hide reads it under the dispatch lock, held here
	}
	m.post(id, bindOp{w: w, b: b, ex: ex, key: make(chan uint32, 1)}, ex.mw, mr, n)
}

// hide unbinds the read-only window over b, if one was bound for a Get.
// Called under w's dispatch lock.
func (m *memory) hide(w *Window, b *buffer) {
	m.mu.Lock()
	ex := m.exposed[b]
	if ex == nil || ex.mw == nil {
		m.mu.Unlock()
		return
	}
	delete(m.exposed, b)
	ex.hidden = true
	m.nextID++
	id := m.nextID
	m.mu.Unlock()
	m.post(id, bindOp{w: w, b: b, ex: ex, unbind: true, key: make(chan uint32, 1)}, ex.mw, ex.mr, 0)
}

// exposeDone handles the completion of a read-only window's bind or
// unbind.
func (m *memory) exposeDone(op bindOp) {
	ex := op.ex
	if op.unbind {
		m.mu.Lock()
		m.mws[ex.mr] = append(m.mws[ex.mr], ex.mw)
		m.mu.Unlock()
		return
	}
	key := <-op.key
	m.mu.Lock()
	ex.desc.RKey = key
	d, hidden := ex.desc, ex.hidden
	m.mu.Unlock()
	if hidden {
		m.settle(ex, wire.Desc{}, fmt.Errorf("the epoch left the rewind ring: %w", ErrStale))
		return
	}
	m.settle(ex, d, nil)
}

// exposeFailed answers the Gets waiting for a read-only window whose
// bind failed; the window is not used again.
func (m *memory) exposeFailed(op bindOp, err error) {
	m.mu.Lock()
	if m.exposed[op.b] == op.ex {
		delete(m.exposed, op.b)
	}
	m.mu.Unlock()
	m.settle(op.ex, wire.Desc{}, err)
}

// settle calls the Gets waiting for ex with d, or err.
func (m *memory) settle(ex *exposure, d wire.Desc, err error) {
	m.mu.Lock()
	ws := ex.waiters
	ex.waiters = nil
	ex.ready = ex.ready || err == nil
	m.mu.Unlock()
	for _, f := range ws {
		f(d, err)
	}
}

// LastEpoch asks Get for the newest epoch the window keeps.
const LastEpoch = ^uint64(0)
