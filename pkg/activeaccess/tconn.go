package activeaccess

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Per-connection queue sizes at the target.
const (
	tRecvSlots = 16      // marker receive buffers = the marker window granted
	tImmSlots  = 256     // ModeMediated: more receives, for the inbox writes
	tSendSlots = 16      // status messages in flight
	tRespWRs   = 64      // ModeMediated: get answers in flight
	tBounce    = 1 << 18 // ModeMediated: bytes of get answers in flight, the largest get
	rdDepth    = 16      // RDMA READs in flight per connection (both sides)
	wrRecv     = 1 << 62
	wrSend     = 1 << 61
	wrResp     = 1 << 60

	acceptTimeout = 30 * time.Second // for a source to complete its connection
)

// tconn is the target's end of one source's connection.
type tconn struct {
	t      *Target
	id     *verbs.CMID
	ch     *verbs.CompChannel
	rcq    *verbs.CQ // receives: markers, inbox writes
	scq    *verbs.CQ // sends: status messages, get answers
	qp     *verbs.QP
	qpn    uint32
	mr     *verbs.MR // receive buffers, then tSendSlots send buffers
	inbox  *verbs.MR // ModeMediated: the source's inbox
	bounce *verbs.MR // ModeMediated: the data of get answers
	nrecv  int
	peer   *Peer

	processed atomic.Uint64

	// life guards the buffers and the QP: R while using them, W while
	// tearing them down (unmapping them).
	life sync.RWMutex

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change, under mu
	out     []outItem
	free    []int    // free status buffers
	sqFree  int      // free send queue slots
	bq      *staging // ModeMediated: the bounce buffer's allocator
	down    bool
	gone    chan struct{}
	tdOnce  sync.Once
	counted bool // holds one of the target's source slots
}

type outItem struct {
	reply   Reply
	isReply bool
	ack     uint64
}

func (t *Target) acceptLoop() {
	defer t.wg.Done()
	for {
		id, ev, err := t.l.GetRequest(t.ctx)
		if err != nil {
			if t.ctx.Err() != nil || errors.Is(err, verbs.ErrClosed) {
				return
			}
			t.recordErr(fmt.Errorf("activeaccess: waiting for sources: %w", err))
			select {
			case <-t.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			t.admit(id, ev)
		}()
	}
}

// admit checks a connection request and accepts or rejects it.
func (t *Target) admit(id *verbs.CMID, ev verbs.CMEvent) {
	reject := func(r RejectReason) {
		id.Reject(marshalRefusal(r))
		id.Close()
	}
	h, err := parseHello(ev.PrivateData)
	if err != nil {
		reject(RejectNotAAPeer)
		return
	}
	if h.Version != protoVersion {
		reject(RejectVersion)
		return
	}
	if h.Modes&(1<<t.cfg.Mode) == 0 {
		reject(RejectMode)
		return
	}
	t.mu.Lock()
	switch {
	case t.closed:
		t.mu.Unlock()
		reject(RejectClosing)
		return
	case t.slots >= t.cfg.MaxSources:
		t.mu.Unlock()
		reject(RejectTooMany)
		return
	}
	t.slots++
	t.nextID++
	addr, _ := id.PeerAddr() // the zero AddrPort if rdma_cm has none
	c := &tconn{t: t, id: id, peer: &Peer{ID: t.nextID, Name: h.Name, QPN: h.QPN, Addr: addr}, changed: make(chan struct{}),
		gone: make(chan struct{}), counted: true}
	t.mu.Unlock()
	if err := c.setup(); err != nil {
		t.recordErr(fmt.Errorf("activeaccess: source %q: %w", h.Name, err))
		reject(RejectResources)
		c.releaseSlot()
		c.closeVerbs()
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		reject(RejectClosing)
		c.releaseSlot()
		c.closeVerbs()
		return
	}
	t.conns[c] = struct{}{}
	t.setQPN(c.qpn, c, nil)
	t.mu.Unlock()
	// The grant travels in the accept's private data (64 bytes; an RC
	// accept carries up to 196).
	g := grant{Version: protoVersion, Mode: t.cfg.Mode, SourceID: c.peer.ID, RKey: t.mr.RKey(), Addr: t.mr.Addr(),
		Len: uint64(t.cfg.Size), Credits: uint64(t.grant), Window: tRecvSlots, MsgSize: msgSize}
	if c.inbox != nil {
		g.InboxAddr, g.InboxRKey, g.MaxGet = c.inbox.Addr(), c.inbox.RKey(), tBounce
	} else {
		g.MaxEntry = maxEntry
	}
	actx, cancel := context.WithTimeout(t.ctx, acceptTimeout)
	err = id.Accept(actx, &verbs.ConnParam{PrivateData: g.marshal(), ResponderResources: rdDepth, InitiatorDepth: rdDepth})
	cancel()
	if err != nil {
		switch {
		case t.ctx.Err() != nil:
			// Close ended the accept: nothing to report.
		case errors.Is(err, context.DeadlineExceeded):
			// The internal bound, not a caller's deadline.
			t.recordErr(fmt.Errorf("activeaccess: accepting source %q: %w: it did not complete the connection within %v",
				h.Name, ErrDisconnected, acceptTimeout))
		default:
			t.recordErr(fmt.Errorf("activeaccess: accepting source %q: %w", h.Name, err))
		}
		c.teardown()
		return
	}
	t.wg.Add(4)
	go c.recvLoop()
	go c.sendCQLoop()
	go c.sendLoop()
	go c.cmLoop()
}

func (c *tconn) setup() error {
	vc, err := c.id.Context()
	if err != nil {
		return err
	}
	mediated := c.t.cfg.Mode == ModeMediated
	c.nrecv, c.sqFree = tRecvSlots, tSendSlots
	if mediated {
		c.nrecv += tImmSlots
		c.sqFree += tRespWRs
	}
	if c.ch, err = vc.NewCompChannel(); err != nil {
		return err
	}
	if c.rcq, err = vc.NewCQ(c.nrecv, &verbs.CQOptions{Channel: c.ch}); err != nil {
		return err
	}
	if c.scq, err = vc.NewCQ(c.sqFree, &verbs.CQOptions{Channel: c.ch}); err != nil {
		return err
	}
	if c.qp, err = c.id.NewQP(c.t.pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: c.scq, RecvCQ: c.rcq,
		SignalAll: true, Cap: verbs.QPCap{MaxSendWR: c.sqFree, MaxRecvWR: c.nrecv, MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: msgSize}}); err != nil {
		return err
	}
	c.qpn = c.qp.QPN()
	if c.mr, err = c.t.pd.AllocMR((c.nrecv+tSendSlots)*msgSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if mediated {
		if c.inbox, err = c.t.pd.AllocMR(c.t.cfg.LogSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
			return err
		}
		if c.bounce, err = c.t.pd.AllocMR(tBounce, verbs.AccessLocalWrite); err != nil {
			return err
		}
		c.bq = newStaging(tBounce)
	}
	for i := 0; i < c.nrecv; i++ {
		if err := c.postRecv(i); err != nil {
			return err
		}
	}
	for i := 0; i < tSendSlots; i++ {
		c.free = append(c.free, i)
	}
	return nil
}

func (c *tconn) postRecv(i int) error {
	return c.qp.PostRecv(verbs.RecvWR{ID: wrRecv | uint64(i), SGL: []verbs.SGE{c.mr.SGE(i*msgSize, msgSize)}})
}

// broadcastLocked wakes the connection's waiters; c.mu held.
func (c *tconn) broadcastLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// waitLocked releases c.mu until something changes; c.mu held.
func (c *tconn) waitLocked() {
	ch := c.changed
	c.mu.Unlock()
	select {
	case <-ch:
	case <-c.gone:
	}
	c.mu.Lock()
}

// enqueue queues a reply or an acknowledgement for the source; false
// when the connection is gone.
func (c *tconn) enqueue(it outItem) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return false
	}
	c.out = append(c.out, it)
	c.broadcastLocked()
	return true
}

// sendLoop packs queued replies and acknowledgements into status
// messages, in order, and sends them.
func (c *tconn) sendLoop() {
	defer c.t.wg.Done()
	var reps []Reply
	for {
		c.mu.Lock()
		for !c.down && (len(c.out) == 0 || len(c.free) == 0 || c.sqFree == 0) {
			c.waitLocked()
		}
		if c.down {
			c.mu.Unlock()
			return
		}
		slot := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		c.sqFree--
		reps = reps[:0]
		var acked uint64
		n := 0
		for n < len(c.out) {
			it := c.out[n]
			if it.isReply {
				if len(reps) == maxReplies {
					break
				}
				reps = append(reps, it.reply)
				n++
				continue
			}
			acked = it.ack
			n++
			break
		}
		c.out = append(c.out[:0], c.out[n:]...)
		c.mu.Unlock()
		if err := c.post(func() error {
			o := (c.nrecv + slot) * msgSize
			l := status{Acked: acked, Processed: c.processed.Load(), Replies: reps}.put(c.mr.Bytes()[o:])
			// Inline: rxe copies the message at post time, so the
			// requester never calls rxe_mr_copy in this process's
			// context, where the module's probe would run preemptible
			// by softirqs (a nested probe hit is missed: see the doc).
			return c.qp.PostSend(verbs.SendWR{ID: wrSend | uint64(slot), Op: verbs.OpSend, Flags: verbs.SendInline,
				SGL: []verbs.SGE{c.mr.SGE(o, l)}})
		}); err != nil {
			if !errors.Is(err, ErrClosed) {
				c.t.recordErr(fmt.Errorf("activeaccess: source %d: sending status: %w", c.peer.ID, err))
			}
			go c.teardown()
			return
		}
	}
}

// post runs f, which uses the connection's buffers and QP, unless the
// connection is being torn down (ErrClosed).
func (c *tconn) post(f func() error) error {
	c.life.RLock()
	defer c.life.RUnlock()
	c.mu.Lock()
	down := c.down
	c.mu.Unlock()
	if down {
		return ErrClosed
	}
	return f()
}

// sendCQLoop frees status buffers, answer buffers and send queue slots as
// sends complete.
func (c *tconn) sendCQLoop() {
	defer c.t.wg.Done()
	wcs := make([]verbs.WC, 16)
	for {
		n, err := c.scq.Wait(c.t.ctx, wcs)
		if err != nil {
			return
		}
		c.mu.Lock()
		for _, wc := range wcs[:n] {
			switch {
			case wc.ID&wrSend != 0:
				c.free = append(c.free, int(wc.ID&0xffff))
			case wc.ID&wrResp != 0:
				c.bq.free(int(wc.ID &^ wrResp))
			}
			c.sqFree++
		}
		c.broadcastLocked()
		c.mu.Unlock()
		for _, wc := range wcs[:n] {
			if wc.Err() != nil {
				go c.teardown() // the QP failed, or flushes after a disconnect
				return
			}
		}
	}
}

// recvLoop takes markers and, in ModeMediated, the source's accesses, in
// the order the source issued them.
func (c *tconn) recvLoop() {
	defer c.t.wg.Done()
	wcs := make([]verbs.WC, 16)
	for {
		n, err := c.rcq.Wait(c.t.ctx, wcs)
		if err != nil {
			return
		}
		for _, wc := range wcs[:n] {
			if err := c.received(wc); err != nil {
				if wc.Err() == nil && !errors.Is(err, ErrClosed) {
					c.t.recordErr(fmt.Errorf("activeaccess: source %d: %w", c.peer.ID, err))
				}
				go c.teardown()
				return
			}
		}
	}
}

func (c *tconn) received(wc verbs.WC) error {
	if err := wc.Err(); err != nil {
		return err
	}
	slot := int(wc.ID & 0xffff)
	if wc.Opcode == verbs.WCRecvRDMAWithImm {
		if c.inbox == nil {
			return fmt.Errorf("%w: an inbox write to a transparent target", ErrProtocol)
		}
		if err := c.dispatch(wc.Imm); err != nil {
			return err
		}
		return c.post(func() error { return c.postRecv(slot) })
	}
	var m marker
	if err := c.post(func() error {
		var err error
		if m, err = parseMarker(c.mr.Bytes()[slot*msgSize : slot*msgSize+min(int(wc.ByteLen), msgSize)]); err != nil {
			return err
		}
		return c.postRecv(slot)
	}); err != nil {
		return err
	}
	c.t.addMarker(&pendingMarker{c: c, epoch: m.Epoch})
	return nil
}

// dispatch applies the inbox entry at position imm*64 (ModeMediated).
func (c *tconn) dispatch(imm uint32) error {
	var e entry
	var data []byte
	if err := c.post(func() error {
		ib := c.inbox.Bytes()
		pos := int(imm) * entryHeader
		if pos >= len(ib) {
			return fmt.Errorf("%w: inbox entry at %d of %d bytes", ErrProtocol, pos, len(ib))
		}
		var err error
		if e, err = parseEntry(ib[pos:], uint64(c.t.cfg.Size)); err != nil {
			return err
		}
		if e.Kind == entryPut {
			data = ib[pos+entryHeader : pos+entryHeader+int(e.Len)]
			c.t.applyPut(c, int(e.Off), data)
		}
		return nil
	}); err != nil || e.Kind == entryPut {
		return err
	}
	if e.Len > tBounce {
		return fmt.Errorf("%w: a get of %d bytes, at most %d", ErrProtocol, e.Len, tBounce)
	}
	// A get: reserve answer space (freed as answers complete), then
	// serve and log it, and write the data back.
	c.mu.Lock()
	var off, h int
	for {
		if c.down {
			c.mu.Unlock()
			return ErrClosed
		}
		if c.sqFree > 0 {
			var ok bool
			if off, h, ok = c.bq.alloc(int(e.Len)); ok {
				break
			}
		}
		c.waitLocked()
	}
	c.sqFree--
	c.mu.Unlock()
	return c.post(func() error {
		c.t.applyGet(c, int(e.Off), c.bounce.Bytes()[off:off+int(e.Len)])
		return c.qp.PostSend(verbs.SendWR{ID: wrResp | uint64(h), Op: verbs.OpWriteImm, Imm: e.Op,
			SGL: []verbs.SGE{c.bounce.SGE(off, int(e.Len))}, RemoteAddr: e.ReplyAddr, RKey: e.ReplyRKey})
	})
}

// applyPut does in software what the module does for an incoming write
// (ModeMediated): per page, W lets the data reach memory, WL and WLD log
// it for the domain's handler. Pages of no domain are plain memory.
func (t *Target) applyPut(c *tconn, off int, data []byte) {
	mem := t.mr.Bytes()
	t.pgMu.RLock()
	defer t.pgMu.RUnlock()
	for a, end := off, off+len(data); a < end; {
		b := min((a/pageSize+1)*pageSize, end)
		p := data[a-off : b-off]
		sl := t.pages[a/pageSize]
		if sl.d == nil || sl.act&W != 0 {
			copy(mem[a:b], p)
		}
		if sl.d != nil && sl.act&(WL|WLD) != 0 {
			acc := Access{Kind: KindPut, Offset: a, Length: b - a, Suppressed: sl.act&W == 0, Source: c.peer, Domain: sl.d, c: c}
			if sl.act&WLD != 0 {
				acc.Data = append([]byte(nil), p...)
			}
			sl.d.sw.push(acc)
		}
		a = b
	}
}

// applyGet serves a get into dst (ModeMediated): per page, memory if R
// (or no domain), else zeros; RL and RLD log it with what was served.
func (t *Target) applyGet(c *tconn, off int, dst []byte) {
	mem := t.mr.Bytes()
	t.pgMu.RLock()
	defer t.pgMu.RUnlock()
	for a, end := off, off+len(dst); a < end; {
		b := min((a/pageSize+1)*pageSize, end)
		p := dst[a-off : b-off]
		sl := t.pages[a/pageSize]
		if sl.d == nil || sl.act&R != 0 {
			copy(p, mem[a:b])
		} else {
			clear(p)
		}
		if sl.d != nil && sl.act&(RL|RLD) != 0 {
			acc := Access{Kind: KindGet, Offset: a, Length: b - a, Suppressed: sl.act&R == 0, Source: c.peer, Domain: sl.d, c: c}
			if sl.act&RLD != 0 {
				acc.Data = append([]byte(nil), p...)
			}
			sl.d.sw.push(acc)
		}
		a = b
	}
}

// cmLoop waits for the source to disconnect.
func (c *tconn) cmLoop() {
	defer c.t.wg.Done()
	for {
		ev, err := c.id.WaitEvent(c.t.ctx)
		if err != nil || ev.Type == verbs.CMDisconnected || ev.Type == verbs.CMDeviceRemoval {
			c.teardown()
			return
		}
	}
}

// teardown ends the connection. The source's slot is released only once
// the handlers processed what it logged, so a new source's grant never
// overlaps the departed one's unprocessed entries.
func (c *tconn) teardown() {
	c.tdOnce.Do(func() {
		c.mu.Lock()
		c.down = true
		c.broadcastLocked()
		c.mu.Unlock()
		close(c.gone)
		c.life.Lock()
		c.closeVerbs()
		c.life.Unlock()
		t := c.t
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
		t.addMarker(&pendingMarker{c: c, then: func() {
			t.mu.Lock()
			if c.qpn != 0 {
				t.setQPN(c.qpn, nil, c)
			}
			t.mu.Unlock()
			c.releaseSlot()
		}})
		t.mu.Lock()
		closed := t.closed
		t.mu.Unlock()
		if closed {
			c.releaseSlot()
		}
	})
}

func (c *tconn) releaseSlot() {
	t := c.t
	t.mu.Lock()
	if c.counted {
		c.counted = false
		t.slots--
	}
	t.mu.Unlock()
}

func (c *tconn) closeVerbs() {
	c.id.Close() // and the QP
	if c.ch != nil {
		c.ch.Close() // and the CQs
	} else {
		for _, cq := range []*verbs.CQ{c.rcq, c.scq} {
			if cq != nil {
				cq.Close()
			}
		}
	}
	for _, mr := range []*verbs.MR{c.mr, c.inbox, c.bounce} {
		if mr != nil {
			mr.Close()
		}
	}
}
