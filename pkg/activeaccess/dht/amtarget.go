package dht

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Sizes of the active-message table.
const (
	amWindow      = 256 // receives the target keeps posted per source: a source's requests in flight
	amStatusEvery = 64  // the target sends a status after this many requests of a source
	amTargetSQ    = 64
	amSourceSQ    = 128
	amSourceRecv  = 32
	amSignalEvery = 32 // a source signals every this many SENDs
	amMaxSources  = 32
)

// AMTarget is the target of the active-message table: sources SEND each
// insert or delete; one handler goroutine takes the receive completions
// of every source from one completion queue, in batches, applies them to
// the volume (the paper's local_insert) and re-posts the buffers, one
// chain per source and batch. It answers only to return receive credits
// (a status every 64 requests of a source) and flushes. Create it with
// ServeAM.
type AMTarget struct {
	s      server
	notify activeaccess.Notification
	ch     *verbs.CompChannel
	rcq    *verbs.CQ // receives of every source
	scq    *verbs.CQ // status sends of every source

	mu     sync.RWMutex // the handler holds it shared while it uses a connection
	byQPN  map[uint32]*sconn
	serial uint32

	inserted, deleted, full, rejected atomic.Uint64
	exited                            chan struct{}
	closeOnce                         sync.Once
}

// amConn is the AM state of one source at the target.
type amConn struct {
	serial   uint32
	mr       *verbs.MR // amWindow request buffers, then one status buffer
	st       amStatus
	sent     uint64 // st.handled in the last status sent
	reposts  []verbs.RecvWR
	sqUsed   int
	needSend bool
	touched  bool // in the handler's current batch
}

// ServeAM lays a volume of layout l out and accepts AM sources on addr
// (a specific IP address of an RDMA device, and a port), at most 32 at a
// time. opts may be nil (see TargetOptions: ServeAM uses Notify, Event by
// default). ctx bounds the set-up only: once ServeAM returned, the target
// serves until Close. Errors wrap ctx's error (at once when ctx is
// already done), ErrInvalid (a bad layout, address or Notify) or the
// verbs error of the failing step (EADDRINUSE for a port in use).
func ServeAM(ctx context.Context, addr netip.AddrPort, l Layout, opts *TargetOptions) (*AMTarget, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dht: serve: %w", err)
	}
	var cfg TargetOptions
	if opts != nil {
		cfg = *opts
	}
	if cfg.Notify != activeaccess.Poll && cfg.Notify != activeaccess.Event {
		return nil, fmt.Errorf("%w: notification %v", ErrInvalid, cfg.Notify)
	}
	t := &AMTarget{notify: cfg.Notify, byQPN: map[uint32]*sconn{}, exited: make(chan struct{})}
	t.s.setup = t.setup
	t.s.drop = t.drop
	t.s.prepare = func(vc *verbs.Context) error {
		var err error
		if t.ch, err = vc.NewCompChannel(); err != nil {
			return err
		}
		if t.rcq, err = vc.NewCQ(amMaxSources*amWindow, &verbs.CQOptions{Channel: t.ch, Batch: 64}); err != nil {
			t.ch.Close()
			return err
		}
		if t.scq, err = vc.NewCQ(amMaxSources*amTargetSQ, &verbs.CQOptions{Channel: t.ch}); err != nil {
			t.ch.Close()
			return err
		}
		return nil
	}
	if err := listenServer(addr, kindAM, l, &t.s); err != nil {
		return nil, err
	}
	go t.run(t.s.ctx)
	return t, nil
}

func (t *AMTarget) setup(c *sconn) error {
	t.mu.Lock()
	if len(t.byQPN) >= amMaxSources {
		t.mu.Unlock()
		return fmt.Errorf("%w: %d sources connected already", ErrInvalid, amMaxSources)
	}
	t.serial++
	a := &amConn{serial: t.serial}
	t.mu.Unlock()
	var err error
	if a.mr, err = t.s.pd.AllocMR(amWindow*amReqLen+amStatusLen, verbs.AccessLocalWrite); err != nil {
		return err
	}
	c.am = a
	if c.qp, err = c.id.NewQP(t.s.pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: t.scq, RecvCQ: t.rcq,
		Cap: verbs.QPCap{MaxSendWR: amTargetSQ, MaxRecvWR: amWindow, MaxInlineData: amStatusLen}}); err != nil {
		return err
	}
	wrs := make([]verbs.RecvWR, amWindow)
	for i := range wrs {
		wrs[i] = a.recvWR(i)
	}
	if err := c.qp.PostRecv(wrs...); err != nil {
		return err
	}
	t.mu.Lock()
	t.byQPN[c.qp.QPN()] = c
	t.mu.Unlock()
	return nil
}

func (a *amConn) recvWR(i int) verbs.RecvWR {
	return verbs.RecvWR{ID: uint64(a.serial)<<32 | uint64(i), SGL: []verbs.SGE{a.mr.SGE(i*amReqLen, amReqLen)}}
}

func (t *AMTarget) drop(c *sconn) {
	t.mu.Lock() // waits for the handler's batch
	if c.qp != nil && t.byQPN[c.qp.QPN()] == c {
		delete(t.byQPN, c.qp.QPN())
	}
	t.mu.Unlock()
	c.id.Close() // and the QP
	if c.am != nil && c.am.mr != nil {
		c.am.mr.Close()
	}
}

// run is the handler: it takes receive completions in batches, applies
// the requests, re-posts the buffers and sends the statuses due.
func (t *AMTarget) run(ctx context.Context) {
	defer close(t.exited)
	wcs := make([]verbs.WC, 64)
	var touched []*sconn
	for ctx.Err() == nil {
		var n int
		var err error
		if t.notify == activeaccess.Poll {
			n, err = t.rcq.Spin(ctx, wcs)
		} else {
			n, err = t.rcq.Wait(ctx, wcs)
		}
		if err != nil {
			if ctx.Err() == nil {
				t.s.recordErr(fmt.Errorf("dht: AM handler: %w", err))
			}
			return
		}
		t.mu.RLock()
		touched = touched[:0]
		for _, wc := range wcs[:n] {
			c := t.byQPN[wc.QPN]
			if c == nil || uint32(wc.ID>>32) != c.am.serial {
				continue // a departed source's flushed receives
			}
			if wc.Status != verbs.WCSuccess {
				t.failed(c, "a request's receive", wc)
				continue
			}
			a := c.am
			if !a.touched {
				a.touched = true
				touched = append(touched, c)
			}
			slot := int(uint32(wc.ID))
			t.apply(a, a.mr.Bytes()[slot*amReqLen:slot*amReqLen+min(int(wc.ByteLen), amReqLen)])
			a.reposts = append(a.reposts, a.recvWR(slot))
		}
		for _, c := range touched {
			t.respond(c)
		}
		t.mu.RUnlock()
	}
}

// apply handles one request of a source.
func (t *AMTarget) apply(a *amConn, b []byte) {
	a.st.handled++
	r, ok := parseReq(b)
	switch {
	case !ok:
		a.st.rejected++
		t.rejected.Add(1)
	case r.op == amInsert:
		key, _ := layout.Split(r.arg)
		if key == 0 {
			a.st.rejected++
			t.rejected.Add(1)
		} else if err := t.s.v.insert(r.arg); err != nil {
			a.st.full++
			t.full.Add(1)
		} else {
			t.inserted.Add(1)
		}
	case r.op == amDelete:
		if r.arg == 0 || r.arg > 1<<32-1 {
			a.st.rejected++
			t.rejected.Add(1)
		} else if t.s.v.remove(uint32(r.arg)) {
			t.deleted.Add(1)
		}
	case r.op == amFlush:
		a.st.flushed = r.token
		a.needSend = true
	}
}

// respond re-posts a source's buffers and sends its status when due. A
// post that fails is recorded: a QP in the error state still takes posts
// (and flushes them), so a failure means the source will wait for good.
func (t *AMTarget) respond(c *sconn) {
	a := c.am
	a.touched = false
	err := c.qp.PostRecv(a.reposts...)
	a.reposts = a.reposts[:0]
	if err != nil {
		t.s.recordErr(fmt.Errorf("dht: AM source %d: re-posting receives: %w", a.serial, err))
		return
	}
	if !a.needSend && a.st.handled-a.sent < amStatusEvery {
		return
	}
	for a.sqUsed >= amTargetSQ {
		if !t.reapSends(true) {
			t.s.recordErr(fmt.Errorf("dht: AM source %d: no status send completed in 5 s", a.serial))
			return
		}
	}
	o := amWindow * amReqLen
	a.st.put(a.mr.Bytes()[o : o+amStatusLen])
	if err := c.qp.PostSend(verbs.SendWR{ID: uint64(a.serial), Op: verbs.OpSend, Flags: verbs.SendSignaled | verbs.SendInline,
		SGL: []verbs.SGE{a.mr.SGE(o, amStatusLen)}}); err != nil {
		t.s.recordErr(fmt.Errorf("dht: AM source %d: sending its status: %w", a.serial, err))
		return
	}
	a.sqUsed++
	a.sent, a.needSend = a.st.handled, false
	t.reapSends(false)
}

// reapSends collects status send completions (spinning for one if wait);
// t.mu held shared.
func (t *AMTarget) reapSends(wait bool) bool {
	var wcs [16]verbs.WC
	var n int
	var err error
	if wait {
		ctx, cancel := context.WithTimeout(t.s.ctx, 5e9)
		n, err = t.scq.Spin(ctx, wcs[:])
		cancel()
	} else {
		n, err = t.scq.Poll(wcs[:])
	}
	if err != nil {
		return false
	}
	for _, wc := range wcs[:n] {
		if c := t.byQPN[wc.QPN]; c != nil && uint32(wc.ID) == c.am.serial {
			c.am.sqUsed--
			if wc.Status != verbs.WCSuccess {
				t.failed(c, "a status send", wc)
			}
		}
	}
	return n > 0
}

// failed records a connection's failed completion (its QP is in the
// error state now), unless it was flushed: a departing source's work
// requests are.
func (t *AMTarget) failed(c *sconn, what string, wc verbs.WC) {
	if wc.Status == verbs.WCWRFlushErr {
		return
	}
	t.s.recordErr(fmt.Errorf("dht: AM source %d (QP %d): %s failed: %w", c.am.serial, wc.QPN, what, wc.Err()))
}

// AMStats count what an AM target did: inserts and deletes applied,
// inserts that found the heap full, requests rejected.
type AMStats struct{ Inserted, Deleted, Full, Rejected uint64 }

// Stats returns the target's counters. It cannot fail, and keeps its
// last values after Close.
func (t *AMTarget) Stats() AMStats {
	return AMStats{t.inserted.Load(), t.deleted.Load(), t.full.Load(), t.rejected.Load()}
}

// Volume is the target's view of the table (valid until Close). It
// cannot fail.
func (t *AMTarget) Volume() *Volume { return t.s.v }

// Err reports failures while serving (sources that could not be set up,
// failed receives or status sends, a failed handler; errors.Join of the
// first 16), or nil when all went well.
func (t *AMTarget) Err() error { return t.s.err() }

// Close stops the handler, disconnects every source and frees the volume
// (the Volume is unusable after it). It returns nil, also the second
// time.
func (t *AMTarget) Close() error {
	t.closeOnce.Do(func() {
		t.s.stop()
		<-t.exited // the handler no longer touches the volume or a connection
		t.s.close()
		if t.ch != nil {
			t.ch.Close() // and the CQs
		}
	})
	return nil
}
