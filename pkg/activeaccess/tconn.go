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
	tRecvSlots = 16 // marker receive buffers = the marker window granted
	tSendSlots = 16 // status messages in flight
	rdDepth    = 16 // RDMA READs in flight per connection (both sides)
	wrRecv     = 1 << 62
	wrSend     = 1 << 61
)

// tconn is the target's end of one source's connection.
type tconn struct {
	t    *Target
	id   *verbs.CMID
	ch   *verbs.CompChannel
	cq   *verbs.CQ
	qp   *verbs.QP
	qpn  uint32
	mr   *verbs.MR // tRecvSlots receive buffers, then tSendSlots send buffers
	peer *Peer

	processed atomic.Uint64

	mu      sync.Mutex
	out     []outItem
	free    []int
	kick    chan struct{}
	gone    chan struct{}
	down    bool
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
	c := &tconn{t: t, id: id, peer: &Peer{ID: t.nextID, Name: h.Name}, kick: make(chan struct{}, 1),
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
	actx, cancel := context.WithTimeout(t.ctx, 30*time.Second)
	err = id.Accept(actx, &verbs.ConnParam{ResponderResources: rdDepth, InitiatorDepth: rdDepth})
	cancel()
	if err != nil {
		t.recordErr(fmt.Errorf("activeaccess: accepting source %q: %w", h.Name, err))
		c.teardown()
		return
	}
	// The grant is the first message (pkg/verbs's Connect does not hand
	// the accept's private data to the source).
	g := grant{Version: protoVersion, Mode: t.cfg.Mode, SourceID: c.peer.ID, RKey: t.mr.RKey(), Addr: t.mr.Addr(),
		Len: uint64(t.cfg.Size), Credits: uint64(t.grant), MaxEntry: maxEntry, Window: tRecvSlots, MsgSize: msgSize}
	c.mu.Lock()
	if c.down {
		c.mu.Unlock()
		return
	}
	slot := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	o := (tRecvSlots + slot) * msgSize
	copy(c.mr.Bytes()[o:], g.marshal())
	err = c.qp.PostSend(verbs.SendWR{ID: wrSend | uint64(slot), Op: verbs.OpSend, SGL: []verbs.SGE{c.mr.SGE(o, grantLen)}})
	c.mu.Unlock()
	if err != nil {
		t.recordErr(fmt.Errorf("activeaccess: source %q: sending the grant: %w", h.Name, err))
		c.teardown()
		return
	}
	if a, err := c.qp.Query(); err == nil {
		c.peer.QPN = a.DestQPN
	}
	t.wg.Add(3)
	go c.cqLoop()
	go c.sendLoop()
	go c.cmLoop()
}

func (c *tconn) setup() error {
	vc, err := c.id.Context()
	if err != nil {
		return err
	}
	if c.ch, err = vc.NewCompChannel(); err != nil {
		return err
	}
	if c.cq, err = vc.NewCQ(2*(tRecvSlots+tSendSlots), &verbs.CQOptions{Channel: c.ch}); err != nil {
		return err
	}
	if c.qp, err = c.id.NewQP(c.t.pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: c.cq, RecvCQ: c.cq,
		SignalAll: true, Cap: verbs.QPCap{MaxSendWR: tSendSlots, MaxRecvWR: tRecvSlots, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return err
	}
	c.qpn = c.qp.QPN()
	if c.mr, err = c.t.pd.AllocMR((tRecvSlots+tSendSlots)*msgSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := 0; i < tRecvSlots; i++ {
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

// enqueue queues a reply or an acknowledgement for the source; false
// when the connection is gone.
func (c *tconn) enqueue(it outItem) bool {
	c.mu.Lock()
	if c.down {
		c.mu.Unlock()
		return false
	}
	c.out = append(c.out, it)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return true
}

// sendLoop packs queued replies and acknowledgements into status
// messages, in order, and sends them.
func (c *tconn) sendLoop() {
	defer c.t.wg.Done()
	var reps []Reply
	for {
		c.mu.Lock()
		for !c.down && (len(c.out) == 0 || len(c.free) == 0) {
			c.mu.Unlock()
			select {
			case <-c.kick:
			case <-c.gone:
			}
			c.mu.Lock()
		}
		if c.down {
			c.mu.Unlock()
			return
		}
		slot := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
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
		// The buffers are used under c.mu: teardown unmaps them under it.
		buf := c.mr.Bytes()[(tRecvSlots+slot)*msgSize:]
		l := status{Acked: acked, Processed: c.processed.Load(), Replies: reps}.put(buf)
		err := c.qp.PostSend(verbs.SendWR{ID: wrSend | uint64(slot), Op: verbs.OpSend,
			SGL: []verbs.SGE{c.mr.SGE((tRecvSlots+slot)*msgSize, l)}})
		c.mu.Unlock()
		if err != nil {
			c.t.recordErr(fmt.Errorf("activeaccess: source %d: sending status: %w", c.peer.ID, err))
			go c.teardown()
			return
		}
	}
}

// cqLoop takes the connection's completions: markers in, status
// messages out.
func (c *tconn) cqLoop() {
	defer c.t.wg.Done()
	wcs := make([]verbs.WC, 16)
	for {
		n, err := c.cq.Wait(c.t.ctx, wcs)
		if err != nil {
			return
		}
		for _, wc := range wcs[:n] {
			if wc.Err() != nil {
				// The QP failed or is flushing after a disconnect:
				// the connection manager's event tears it down.
				go c.teardown()
				return
			}
			slot := int(wc.ID & 0xffff)
			if wc.ID&wrRecv != 0 {
				c.mu.Lock()
				if c.down {
					c.mu.Unlock()
					return
				}
				b := c.mr.Bytes()[slot*msgSize : slot*msgSize+min(int(wc.ByteLen), msgSize)]
				m, err := parseMarker(b)
				if err == nil {
					err = c.postRecv(slot)
				}
				c.mu.Unlock()
				if err != nil {
					c.t.recordErr(fmt.Errorf("activeaccess: source %d: %w", c.peer.ID, err))
					go c.teardown()
					return
				}
				c.t.addMarker(&pendingMarker{c: c, epoch: m.Epoch})
				continue
			}
			c.mu.Lock()
			c.free = append(c.free, slot)
			c.mu.Unlock()
			select {
			case c.kick <- struct{}{}:
			default:
			}
		}
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
		c.closeVerbs()
		c.mu.Unlock()
		close(c.gone)
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
		c.ch.Close() // and the CQ
	} else if c.cq != nil {
		c.cq.Close()
	}
	if c.mr != nil {
		c.mr.Close()
	}
}
