package sockets

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
	"github.com/rdmaplus/rdmaplus/pkg/sockets/internal/broker"
	"github.com/rdmaplus/rdmaplus/pkg/sockets/internal/proto"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// tcpItem is an output for the anchor, numbered.
type tcpItem struct {
	proto.Output
	id uint64
}

// attachRetries is how many times a dialer asks again for an attachment
// the acceptor could not take yet (no_owner, busy).
const attachRetries = 6

// Transport is what carries one direction of a connection's bytes.
type Transport string

// Transports.
const (
	TCP  Transport = "tcp"
	RDMA Transport = "rdma"
)

// Path says what carries each direction of a connection now, and the
// attachment's phase ("plain", "attaching", "attached", "demoting").
type Path struct {
	Read, Write Transport
	Phase       string
}

// Stats are a connection's counters.
type Stats struct {
	ReadTCP, ReadRDMA       uint64 // bytes the program read from the anchor, from the ring
	WrittenTCP, WrittenRDMA uint64 // bytes sent on the anchor (resent ones too), into the peer's ring
	RDMAWrites              uint64 // ring writes posted
	Upgrades                uint64 // attachments that reached the attached phase
	// Demotes counts demotes by reason (docs/sockets.md's reason names:
	// "app", "peer", "qp_error", "tcp_after_switch", "timeout", ...).
	Demotes map[string]uint64
	// Fallbacks counts attachments that did not happen, by reason
	// ("no_daemon", "no_device", "no_owner", "denied", ...).
	Fallbacks map[string]uint64
}

// incarnation names this process in ATTACH records.
var incarnation = func() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}()

// Conn is a TCP connection that may be attached to RDMA. It implements
// net.Conn; its methods are safe for concurrent use (reads are serialized
// with each other, as are writes).
type Conn struct {
	tc   *net.TCPConn
	rc   syscall.RawConn
	opts Options
	role proto.Role

	rmu sync.Mutex // one reader at a time
	wmu sync.Mutex // anchor writes, in order

	mu         sync.Mutex
	m          *proto.Machine
	att        *attachment
	tuple      sockwire.Tuple
	b          *broker.Client
	tcpQ       []tcpItem // anchor writes and shutdown, in order
	tcpSeq     uint64    // the id of the next tcpQ item
	wFrom      uint64    // the items of the Write under way: [wFrom, tcpSeq) while writing
	writing    bool
	changed    chan struct{} // closed at every change, when someone waits on it
	chUsed     bool          // someone took changed to wait on it
	seq        uint64
	parked     bool // a reader waits in the netpoller on the anchor
	poked      bool // its read deadline was moved to wake it
	rdl, wdl   time.Time
	closed     bool
	finished   bool
	err        error // the connection is reset
	werr       error // the anchor's writing failed
	events     []func()
	retries    int
	retrying   bool          // an ATTACH_REQ is to be sent again
	bgFlush    bool          // a background flush is under way
	anchorShut bool          // the anchor's writing was shut
	outcome    chan struct{} // closed when the first attachment has an outcome
	outDone    bool
	goneAt     time.Time // when a reader waiting for the ring saw the anchor end
	goneErr    error
	demoteT    *time.Timer
	attachT    *time.Timer
	st         Stats
}

func newConn(tc *net.TCPConn, o Options) *Conn {
	rc, _ := tc.SyscallConn()
	role := proto.Client
	if o.Accepted {
		role = proto.Server
	}
	c := &Conn{tc: tc, rc: rc, opts: o, role: role, changed: make(chan struct{}), outcome: make(chan struct{}),
		m:  proto.New(proto.Config{Role: role, RingSize: o.RingSize, SendBuf: o.RingSize}),
		st: Stats{Demotes: map[string]uint64{}, Fallbacks: map[string]uint64{}}}
	if o.Disable || rc == nil {
		c.settle()
		return c
	}
	go c.start()
	return c
}

// settle marks the first attachment's outcome (WaitAttach returns).
func (c *Conn) settle() {
	if !c.outDone {
		c.outDone = true
		close(c.outcome)
	}
}

func (c *Conn) waitAttach(ctx context.Context) {
	select {
	case <-c.outcome:
	case <-ctx.Done():
	}
}

func (c *Conn) fallback(r sockwire.Reason) {
	c.st.Fallbacks[r.String()]++
	c.settle()
}

// start registers the connection with rvmad and, on the dialing side,
// asks for an attachment.
func (c *Conn) start() {
	b := brokerFor(c.opts.Socket)
	if b == nil {
		c.mu.Lock()
		c.fallback(sockwire.ReasonNoDaemon)
		c.mu.Unlock()
		return
	}
	t, _, err := broker.TupleOf(c.rc)
	if err != nil {
		c.mu.Lock()
		c.fallback(sockwire.ReasonDenied)
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	c.tuple, c.b = t, b // records may come as soon as the broker has the registration
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.AttachTimeout)
	defer cancel()
	_, err = b.Register(ctx, c.rc, (*handler)(c))
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.b = nil
		r := sockwire.ReasonDenied
		if errors.Is(err, broker.ErrGone) {
			r = sockwire.ReasonNoDaemon
		}
		c.fallback(r)
		return
	}
	if c.closed {
		c.settle()
		return
	}
	if c.role == proto.Server {
		return // the dialer asks
	}
	c.attachLocked()
}

// attachLocked allocates this side's resources (if needed) and sends
// ATTACH_REQ.
func (c *Conn) attachLocked() {
	if c.closed || c.err != nil {
		c.settle()
		return
	}
	if c.att == nil {
		a, r := c.newAttachment()
		if a == nil {
			c.fallback(r)
			return
		}
		c.att = a
	}
	if !c.m.Attach() {
		c.settle()
		return
	}
	epoch := c.m.Epoch()
	if c.attachT != nil {
		c.attachT.Stop()
	}
	c.attachT = time.AfterFunc(c.opts.AttachTimeout, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.m.Phase() == proto.Attaching && c.m.Epoch() == epoch {
			c.fallback(sockwire.ReasonTimeout)
			c.m.Demote(sockwire.ReasonTimeout)
			c.drain()
		}
	})
	c.drain()
}

func (c *Conn) newAttachment() (*attachment, sockwire.Reason) {
	local, _ := netip.AddrFromSlice(c.tuple.Local[:])
	d, idx, err := deviceFor(c.opts.Device, local.Unmap())
	if err != nil {
		return nil, sockwire.ReasonNoDevice
	}
	var gid verbs.GID
	for _, e := range d.gids {
		if e.Index == idx && e.Port == port {
			gid = e.GID
		}
	}
	a, err := newAttachment(d, idx, c.opts.RingSize, gid)
	if err != nil {
		putDevice(d)
		return nil, sockwire.ReasonNoMemory
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel, a.done = cancel, make(chan struct{})
	go c.progress(ctx, a)
	return a, 0
}

// progress waits for the attachment's completions and hands them to the
// state machine; it ends when the attachment is released.
func (c *Conn) progress(ctx context.Context, a *attachment) {
	defer close(a.done)
	wcs := make([]verbs.WC, 32)
	for {
		n, err := a.cq.Wait(ctx, wcs)
		c.mu.Lock()
		if a.released || c.att != a {
			c.mu.Unlock()
			return
		}
		if err != nil {
			a.dead = true
			c.m.QPError(c.m.Epoch())
			c.drain()
			c.mu.Unlock()
			return
		}
		for _, wc := range wcs[:n] {
			c.completion(a, wc)
			if a.released {
				break
			}
		}
		c.drain()
		c.mu.Unlock()
	}
}

// completion handles one work completion.
func (c *Conn) completion(a *attachment, wc verbs.WC) {
	if wc.ID < recvBase {
		a.outstanding -= int(max(wc.ID, 1))
	}
	if wc.Status != verbs.WCSuccess {
		if !a.dead {
			a.dead = true
			c.m.QPError(c.m.Epoch())
		}
		return
	}
	epoch := c.m.Epoch()
	switch wc.Opcode {
	case verbs.WCRecv:
		rec, err := a.recvRecord(int(wc.ID-recvBase), int(wc.ByteLen))
		c.repost(a, int(wc.ID-recvBase))
		if err != nil {
			c.protocolError(fmt.Errorf("a record on the QP: %w", err))
			return
		}
		switch r := rec.(type) {
		case sockwire.Switch:
			if r.Epoch == epoch {
				a.prod = r.Offset
			}
			c.m.FromQP(proto.Msg{Kind: proto.MsgSwitch, Epoch: r.Epoch, Off: r.Offset})
		case sockwire.Fin:
			c.m.FromQP(proto.Msg{Kind: proto.MsgFin, Epoch: r.Epoch, Off: r.Offset})
		case sockwire.Abort:
			if r.Epoch == epoch {
				c.reset(fmt.Errorf("%w: the peer aborted (%v)", ErrReset, r.Reason))
			}
		default:
			c.protocolError(fmt.Errorf("%v on the QP", rec.Type()))
		}
	case verbs.WCRecvRDMAWithImm:
		c.repost(a, int(wc.ID-recvBase))
		n := sockwire.ImmLen(wc.Imm)
		switch sockwire.ImmType(wc.Imm) {
		case sockwire.ImmData:
			if uint64(n) > uint64(a.ring.Len()) {
				c.protocolError(fmt.Errorf("a ring write of %d bytes", n))
				return
			}
			// The machine copies what it takes: hand it the ring's
			// own bytes (the peer writes there again only once they
			// are credited), in two pieces across the wrap.
			for _, p := range a.ringView(a.prod, int(n)) {
				off := a.prod
				a.prod += uint64(len(p))
				c.m.FromQP(proto.Msg{Kind: proto.MsgData, Epoch: epoch, Off: off, Data: p})
			}
		case sockwire.ImmCtrl:
			credit, blocked := a.readCtrl()
			if credit > a.credit {
				a.credit = credit
				c.m.FromQP(proto.Msg{Kind: proto.MsgCredit, Epoch: epoch, Off: credit})
			}
			// Blocked at or beyond the last credit written: the
			// sender waits for one. Behind it, that credit frees it.
			if blocked > a.blocked {
				a.blocked = blocked
				if blocked >= a.lastCredit {
					c.m.FromQP(proto.Msg{Kind: proto.MsgBlocked, Epoch: epoch, Off: blocked})
				}
			}
		default:
			c.protocolError(fmt.Errorf("immediate %#x", wc.Imm))
		}
	}
}

func (c *Conn) repost(a *attachment, i int) {
	if a.dead || a.released {
		return
	}
	if err := a.postRecv(i); err != nil {
		a.dead = true
		c.m.QPError(c.m.Epoch())
	}
}

func (c *Conn) protocolError(err error) {
	c.reset(fmt.Errorf("%w: %w: %w", ErrReset, proto.ErrProtocol, err))
}

// reset ends the connection with err: ABORT on a live QP, the
// attachment released, the anchor reset.
func (c *Conn) reset(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if a := c.att; a != nil && a.connected && !a.dead && !a.released {
		reason := sockwire.ReasonProtocol
		if b, e := sockwire.Marshal(sockwire.Abort{Epoch: c.m.Epoch(), Reason: reason}); e == nil {
			a.ops = nil
			a.queueRecord(b)
			_, _ = a.pump()
		}
	}
	c.releaseAtt()
	c.tcpQ = nil
	_ = c.tc.SetLinger(0)
	c.settle()
	c.notify()
	// Never close the anchor under c.mu: a reader inside the anchor's
	// RawRead waits for c.mu, and Close waits for that reader.
	go c.tc.Close()
}

func (c *Conn) releaseAtt() {
	if c.att != nil {
		c.att.release()
		c.att = nil
	}
}

// handler is a Conn as the broker client's Handler (kept out of Conn's
// exported methods).
type handler Conn

// FromBroker implements broker.Handler.
func (h *handler) FromBroker(rec sockwire.Record) { (*Conn)(h).fromBroker(rec) }

// BrokerGone implements broker.Handler.
func (h *handler) BrokerGone() { (*Conn)(h).brokerGone() }

// fromBroker takes a record from the peer through rvmad, or rvmad's
// RESULT about one of ours.
func (c *Conn) fromBroker(rec sockwire.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.finished {
		return
	}
	switch r := rec.(type) {
	case sockwire.Attach:
		if !r.Reply {
			c.attachRequest(r)
			break
		}
		msg := proto.Msg{Kind: proto.MsgAttachRep, Epoch: r.Epoch, Ring: int(r.Endpoint.RingSize())}
		if c.role != proto.Client || r.Epoch != c.m.Epoch() || c.m.Phase() != proto.Attaching || c.att == nil {
			c.m.FromBroker(msg) // stale, or a demote already under way: the machine decides
			break
		}
		if err := c.att.connect(r.Endpoint); err != nil {
			c.fallback(sockwire.ReasonNoDevice)
			c.m.Demote(sockwire.ReasonNoDevice)
			c.m.FromBroker(msg)
			break
		}
		c.m.FromBroker(msg)
		if c.m.Phase() == proto.Attached {
			c.st.Upgrades++
		}
		_, _ = c.pumpAtt()
		c.settle()
	case sockwire.Nack:
		was := c.m.Phase()
		c.m.FromBroker(proto.Msg{Kind: proto.MsgAttachNack, Epoch: r.Epoch, Reason: r.Reason})
		if was == proto.Attaching && c.m.Phase() == proto.Plain {
			// A server that has not registered within the 2 s
			// the peer's rvmad kept the request answers no_owner:
			// ask again 100 ms later. One whose bytes were moving
			// answers busy: 100 ms, 400 ms, 1.6 s, then 3.2 s. As
			// the shim does.
			if (r.Reason == sockwire.ReasonNoOwner || r.Reason == sockwire.ReasonBusy) &&
				c.retries < attachRetries && !c.closed {
				c.retries++
				c.retrying = true
				delay := 3200 * time.Millisecond
				if r.Reason == sockwire.ReasonNoOwner {
					delay = 100 * time.Millisecond
				} else if c.retries <= 3 {
					delay = time.Duration(25<<(2*c.retries)) * time.Millisecond
				}
				time.AfterFunc(delay, func() {
					c.mu.Lock()
					defer c.mu.Unlock()
					c.retrying = false
					if c.m.Phase() == proto.Plain && c.err == nil && !c.finished {
						c.attachLocked()
					} else {
						c.settle()
					}
				})
			} else {
				c.fallback(r.Reason)
				c.releaseAtt()
			}
		}
	case sockwire.Demote:
		c.m.FromBroker(proto.Msg{Kind: proto.MsgDemote, Epoch: r.Epoch, Off: r.Consumed, Reason: r.Reason})
	case sockwire.Device:
		// The device is being removed, and its removal waits until
		// this process closes it: back to TCP, which releases it.
		deviceGone(r.Name)
		if c.att != nil && c.att.dev.name == r.Name {
			c.m.Demote(sockwire.ReasonDevice)
		}
	case sockwire.Result:
		if r.Reason == 0 {
			break
		}
		switch r.Request {
		case sockwire.TypeDemote:
			c.reset(fmt.Errorf("%w: the DEMOTE could not reach the peer (%v)", ErrReset, r.Reason))
		case sockwire.TypeAttachRep:
			c.m.Demote(r.Reason)
		}
	}
	c.drain()
}

// attachRequest answers the peer's ATTACH_REQ (server side).
func (c *Conn) attachRequest(r sockwire.Attach) {
	msg := proto.Msg{Kind: proto.MsgAttachReq, Epoch: r.Epoch, Ring: int(r.Endpoint.RingSize())}
	if c.role != proto.Server || c.m.Phase() != proto.Plain || c.closed {
		reason := sockwire.ReasonBusy
		if c.closed {
			reason = sockwire.ReasonShutdown
		}
		if c.role != proto.Server {
			reason = sockwire.ReasonProtocol
		}
		c.sendBroker(sockwire.Nack{Epoch: r.Epoch, Reason: reason})
		return
	}
	if c.att != nil { // a previous attachment's leftovers
		c.releaseAtt()
	}
	a, reason := c.newAttachment()
	if a == nil {
		c.fallback(reason)
		c.m.Refuse(msg, reason)
		return
	}
	if err := a.connect(r.Endpoint); err != nil {
		a.release()
		c.fallback(sockwire.ReasonNoDevice)
		c.m.Refuse(msg, sockwire.ReasonNoDevice)
		return
	}
	c.att = a
	c.m.FromBroker(msg)
	if c.m.Phase() == proto.Attached {
		c.st.Upgrades++
	} else {
		c.releaseAtt()
	}
}

// brokerGone: rvmad went away. An attachment under way ends; a live one
// stays (but can no longer demote).
func (c *Conn) brokerGone() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b = nil
	if c.m.Phase() == proto.Attaching {
		c.m.FromBroker(proto.Msg{Kind: proto.MsgAttachNack, Epoch: c.m.Epoch(), Reason: sockwire.ReasonNoDaemon})
		c.fallback(sockwire.ReasonNoDaemon)
		c.releaseAtt()
	}
	c.drain()
}

func (c *Conn) sendBroker(rec sockwire.Record) error {
	if c.b == nil {
		return broker.ErrGone
	}
	return c.b.Send(c.tuple, rec)
}

func (c *Conn) pumpAtt() (int, error) {
	if c.att == nil {
		return 0, nil
	}
	w, err := c.att.pump()
	c.st.RDMAWrites += uint64(w)
	if err != nil {
		c.m.QPError(c.m.Epoch())
	}
	return w, err
}

// drain carries out the state machine's outputs, and what they lead to,
// and wakes the waiters. The caller holds c.mu.
func (c *Conn) drain() {
	for {
		outs := c.m.Outputs()
		if len(outs) == 0 {
			break
		}
		for _, o := range outs {
			c.output(o)
		}
		if _, err := c.pumpAtt(); err != nil {
			continue // the QP error's demote has outputs
		}
	}
	if err := c.m.Err(); err != nil && c.err == nil {
		c.reset(fmt.Errorf("%w: %w", ErrReset, err))
	}
	c.afterChange()
	if len(c.tcpQ) > 0 && !c.bgFlush && c.err == nil {
		c.bgFlush = true
		go c.flushBackground()
	}
	c.notify()
}

func (c *Conn) output(o proto.Output) {
	switch o.Via {
	case proto.ViaTCP:
		if c.err == nil {
			c.tcpQ = append(c.tcpQ, tcpItem{Output: o, id: c.tcpSeq})
			c.tcpSeq++
			c.st.WrittenTCP += uint64(len(o.Data))
		}
	case proto.ViaQP:
		a := c.att
		if a == nil || a.released || a.dead || o.Msg.Epoch != c.m.Epoch() {
			return
		}
		switch o.Msg.Kind {
		case proto.MsgData:
			a.stageData(o.Msg.Off, o.Msg.Data)
			c.st.WrittenRDMA += uint64(len(o.Msg.Data))
		case proto.MsgSwitch, proto.MsgFin:
			if b, err := sockwire.Marshal(o.Msg.Record()); err == nil {
				a.queueRecord(b)
			}
		case proto.MsgCredit:
			a.lastCredit = o.Msg.Off
			a.queueCtrl(sockwire.CtrlCreditOff, o.Msg.Off)
		case proto.MsgBlocked:
			a.queueCtrl(sockwire.CtrlBlockedOff, o.Msg.Off)
		}
	case proto.ViaBroker:
		var rec sockwire.Record
		switch o.Msg.Kind {
		case proto.MsgAttachReq, proto.MsgAttachRep:
			if c.att == nil {
				return
			}
			rec = sockwire.Attach{Reply: o.Msg.Kind == proto.MsgAttachRep, Epoch: o.Msg.Epoch, Tuple: c.tuple,
				Incarnation: incarnation, Endpoint: c.att.local}
		default:
			rec = o.Msg.Record()
		}
		if o.Msg.Kind == proto.MsgDemote {
			c.st.Demotes[o.Msg.Reason.String()]++
			c.armDemoteTimer()
		}
		if err := c.sendBroker(rec); err != nil {
			switch o.Msg.Kind {
			case proto.MsgAttachReq:
				epoch := o.Msg.Epoch
				c.events = append(c.events, func() {
					c.m.FromBroker(proto.Msg{Kind: proto.MsgAttachNack, Epoch: epoch, Reason: sockwire.ReasonNoDaemon})
					c.fallback(sockwire.ReasonNoDaemon)
					c.releaseAtt()
				})
			case proto.MsgDemote:
				if out, _ := c.m.Modes(); out == proto.OutHeld {
					c.events = append(c.events, func() {
						c.reset(fmt.Errorf("%w: no rvmad to carry the DEMOTE", ErrReset))
					})
				}
			}
		}
	}
}

// afterChange runs the deferred events and releases an attachment that
// is over: demoted on both sides, or both directions ended and every
// post completed.
func (c *Conn) afterChange() {
	for len(c.events) > 0 {
		ev := c.events[0]
		c.events = c.events[1:]
		ev()
		for _, o := range c.m.Outputs() {
			c.output(o)
		}
	}
	a := c.att
	if a == nil {
		return
	}
	ph := c.m.Phase()
	if ph == proto.Plain && !c.retrying {
		c.releaseAtt()
		return
	}
	if c.m.Done() && len(a.ops) == 0 && a.outstanding == 0 {
		c.releaseAtt()
	}
}

// armDemoteTimer resets the connection if its outgoing bytes are still
// held (the peer's DEMOTE never came) after DemoteTimeout.
func (c *Conn) armDemoteTimer() {
	epoch := c.m.Epoch()
	if c.demoteT != nil {
		c.demoteT.Stop()
	}
	c.demoteT = time.AfterFunc(c.opts.DemoteTimeout, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.m.Epoch() != epoch || c.m.Phase() != proto.Demoting || c.err != nil {
			return
		}
		if out, _ := c.m.Modes(); out == proto.OutHeld {
			c.reset(fmt.Errorf("%w: the peer's DEMOTE did not come within %v", ErrReset, c.opts.DemoteTimeout))
			return
		}
		c.releaseAtt()
		c.notify()
	})
}

// waitCh is the channel closed at the next change. The caller holds c.mu.
func (c *Conn) waitCh() chan struct{} {
	c.chUsed = true
	return c.changed
}

// notify wakes every waiter: writers and readers waiting on changed, and
// a reader parked in the netpoller, whose read deadline is moved into
// the past.
func (c *Conn) notify() {
	c.seq++
	if c.chUsed {
		close(c.changed)
		c.changed = make(chan struct{})
		c.chUsed = false
	}
	if c.parked && !c.poked && !c.finished {
		c.poked = true
		_ = c.tc.SetReadDeadline(time.Unix(1, 0))
	}
}

func (c *Conn) opErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return io.EOF
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.tc.LocalAddr(), Addr: c.tc.RemoteAddr(), Err: err}
}

// Read reads up to len(p) bytes, from the anchor or the ring as the
// protocol says; it implements net.Conn. It returns io.EOF after the
// peer's last byte; an *net.OpError wrapping os.ErrDeadlineExceeded at
// the read deadline, net.ErrClosed after Close, ErrReset (with
// syscall.ECONNRESET) when the connection was reset, or
// io.ErrUnexpectedEOF when the anchor ended before the ring's end of
// stream (the peer died while attached).
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n, err := c.read(p, false, time.Time{})
	return n, c.opErr("read", err)
}

// read is Read; closing lets Close's linger read after Close, until
// until (zero: the read deadline).
func (c *Conn) read(p []byte, closing bool, until time.Time) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		c.mu.Lock()
		if err := c.readBlocked(closing); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		if c.poked {
			c.poked = false
			dl := c.rdl
			if closing {
				dl = until
			}
			_ = c.tc.SetReadDeadline(dl)
		}
		seq := c.seq
		c.mu.Unlock()

		var n int
		var rerr error
		var wait bool // wait on changed, not in the netpoller
		done := false
		err := c.rc.Read(func(fd uintptr) bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.seq != seq {
				return true
			}
			if e := c.readBlocked(closing); e != nil {
				rerr, done = e, true
				return true
			}
			fromTCP := false
			var tcpErr error
			data, eof, err := c.m.Read(len(p), func(want int) ([]byte, bool) {
				k, err := unix.Read(int(fd), p[:want])
				switch {
				case err == unix.EAGAIN || err == unix.EINTR:
					return nil, false
				case err != nil:
					tcpErr = err
					return nil, false
				case k == 0:
					return nil, true
				}
				fromTCP = true
				return p[:k], false
			})
			c.drain()
			seq = c.seq // our own changes: nothing to look at again
			switch {
			case err != nil:
				c.reset(fmt.Errorf("%w: %w", ErrReset, err))
				rerr, done = c.err, true
			case len(data) > 0:
				n = copy(p, data)
				if fromTCP {
					c.st.ReadTCP += uint64(n)
				} else {
					c.st.ReadRDMA += uint64(n)
				}
				c.goneAt = time.Time{}
				done = true
			case eof:
				rerr, done = io.EOF, true
			case tcpErr != nil:
				rerr, done = tcpErr, true
			case c.m.TCPWant() != 0:
				c.parked = true
				return false
			default:
				// The ring is next: watch the anchor for the peer's
				// end, or bytes after the switch. (Look each time:
				// the netpoller forgets a readiness it reported
				// before this RawRead began.)
				var one [1]byte
				k, _, err := unix.Recvfrom(int(fd), one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
				switch {
				case err == unix.EAGAIN || err == unix.EINTR:
					c.parked = true
					return false
				case err == nil && k > 0:
					c.m.Demote(sockwire.ReasonTCPAfterSwitch)
					c.drain()
					return true
				}
				if c.goneAt.IsZero() {
					c.goneAt = time.Now()
					c.goneErr = err
				}
				if time.Since(c.goneAt) >= c.opts.PeerGoneWait {
					if c.goneErr != nil {
						rerr = fmt.Errorf("%w: %w", ErrReset, c.goneErr)
					} else {
						rerr = fmt.Errorf("sockets: the anchor ended before the ring's end of stream: %w", io.ErrUnexpectedEOF)
					}
					done = true
					return true
				}
				wait = true
			}
			return true
		})
		c.mu.Lock()
		c.parked = false
		ch, goneAt := c.waitCh(), c.goneAt
		rdl := c.rdl
		if closing {
			rdl = until
		}
		c.mu.Unlock()
		if done {
			return n, rerr
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if !rdl.IsZero() && !time.Now().Before(rdl) {
					return 0, os.ErrDeadlineExceeded
				}
				continue // poked
			}
			if errors.Is(err, net.ErrClosed) {
				c.mu.Lock()
				e := c.readBlocked(closing)
				c.mu.Unlock()
				if e != nil {
					return 0, e
				}
			}
			return 0, err
		}
		if wait {
			if err := waitChange(ch, rdl, goneAt.Add(c.opts.PeerGoneWait)); err != nil {
				return 0, err
			}
		}
	}
}

// readBlocked is the error a read gets now, if any.
func (c *Conn) readBlocked(closing bool) error {
	switch {
	case c.err != nil:
		return c.err
	case c.closed && !closing:
		return net.ErrClosed
	case c.finished:
		return net.ErrClosed
	}
	return nil
}

// waitChange waits until ch closes, the deadline dl passes (an error), or
// wake (zero: never).
func waitChange(ch chan struct{}, dl, wake time.Time) error {
	var tc <-chan time.Time
	stop := func() {}
	if !dl.IsZero() {
		d := time.Until(dl)
		if d <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		tc, stop = t.C, func() { t.Stop() }
	}
	var wc <-chan time.Time
	if !wake.IsZero() {
		t := time.NewTimer(max(time.Until(wake), time.Millisecond))
		wc = t.C
		defer t.Stop()
	}
	defer stop()
	select {
	case <-ch:
	case <-tc:
		return os.ErrDeadlineExceeded
	case <-wc:
	}
	return nil
}

// Write writes p, on the anchor or into the peer's ring; it implements
// net.Conn. It blocks while the send buffer (the ring's size of bytes
// the peer has not consumed) is full. It fails with an *net.OpError
// wrapping os.ErrDeadlineExceeded at the write deadline (n bytes were
// taken and will be delivered), net.ErrClosed after Close, an error
// wrapping syscall.EPIPE after CloseWrite, ErrReset, or the anchor's
// write error.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	total := 0
	for {
		c.mu.Lock()
		var err error
		switch {
		case c.err != nil:
			err = c.err
		case c.closed:
			err = net.ErrClosed
		case c.werr != nil:
			err = c.werr
		case !c.wdl.IsZero() && !time.Now().Before(c.wdl):
			err = os.ErrDeadlineExceeded
		}
		if err != nil {
			c.mu.Unlock()
			return total, c.opErr("write", err)
		}
		if len(p) == 0 {
			err := c.flushLocked()
			c.mu.Unlock()
			return total, c.opErr("write", err)
		}
		if !c.writing {
			c.writing, c.wFrom = true, c.tcpSeq
			defer c.endWrite()
		}
		n, err := c.m.Write(p[:min(len(p), chunkMax)])
		if err != nil {
			c.mu.Unlock()
			if errors.Is(err, proto.ErrClosed) {
				err = fmt.Errorf("%w: %w", err, syscall.EPIPE)
			}
			return total, c.opErr("write", err)
		}
		c.drain()
		ch, wdl := c.waitCh(), c.wdl
		total += n
		p = p[n:]
		ferr := c.flushLocked()
		c.mu.Unlock()
		if ferr != nil {
			return total, c.opErr("write", ferr)
		}
		if n == 0 {
			if err := waitChange(ch, wdl, time.Time{}); err != nil {
				return total, c.opErr("write", err)
			}
		}
	}
}

// endWrite marks the end of a Write: what it queued is now owed.
func (c *Conn) endWrite() {
	c.mu.Lock()
	c.writing = false
	c.mu.Unlock()
}

// flushLocked writes the queued anchor outputs, in order, releasing
// c.mu while it writes. The caller holds c.wmu and c.mu. A write that
// times out leaves its remainder queued; another error is kept in werr.
func (c *Conn) flushLocked() error {
	for len(c.tcpQ) > 0 && c.err == nil && c.werr == nil {
		o := c.tcpQ[0]
		c.mu.Unlock()
		var n int
		var err error
		if len(o.Data) > 0 {
			n, err = c.tc.Write(o.Data)
		}
		if err == nil && o.Shut {
			err = c.tc.CloseWrite()
		}
		c.mu.Lock()
		if c.err != nil {
			return c.err
		}
		if len(c.tcpQ) == 0 || c.tcpQ[0].id != o.id {
			// Close dropped the queue (nothing in it was owed).
			return net.ErrClosed
		}
		if err == nil && o.Shut {
			c.anchorShut = true
		}
		if err != nil {
			c.tcpQ[0].Data = o.Data[n:]
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
			if c.err != nil {
				return c.err
			}
			c.werr = err
			return err
		}
		c.tcpQ = c.tcpQ[1:]
	}
	if c.err != nil {
		return c.err
	}
	return c.werr
}

// flushBackground writes queued anchor outputs that no Write is there to
// write (a DEMOTE's resend).
func (c *Conn) flushBackground() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bgFlush = false
	_ = c.flushLocked()
}

// CloseWrite shuts the connection's writing down (the peer reads end of
// file after the last byte); reading goes on. It fails with net.ErrClosed
// after Close, ErrReset, or the anchor's error.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.err != nil:
		return c.opErr("close", c.err)
	case c.closed:
		return c.opErr("close", net.ErrClosed)
	}
	c.m.ShutdownWrite()
	c.drain()
	return c.opErr("close", c.flushLocked())
}

// Close closes the connection; it implements net.Conn. Blocked Reads and
// Writes return net.ErrClosed. A connection whose outgoing direction is
// on RDMA stays alive in the background until the peer consumed what was
// written (at most Options.Linger, then the anchor is reset); bytes the
// peer sends meanwhile are discarded. Close is safe to call twice; it
// returns the anchor's close error, if any.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed || c.finished {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.err != nil {
		c.finishLocked()
		c.mu.Unlock()
		return c.closeAnchor()
	}
	c.m.ShutdownWrite()
	c.drain()
	out, _ := c.m.Modes()
	owed := false // bytes a Write already reported as written
	for _, o := range c.tcpQ {
		owed = owed || len(o.Data) > 0 && !(c.writing && o.id >= c.wFrom)
	}
	if out == proto.OutTCP && !owed {
		// Nothing is owed on the ring or the anchor: close as TCP
		// does (a Write blocked on the anchor returns).
		c.tcpQ = nil
		c.finishLocked()
		c.mu.Unlock()
		return c.closeAnchor()
	}
	c.mu.Unlock()
	go c.linger()
	return nil
}

// closeAnchor closes the anchor; the caller holds no lock.
func (c *Conn) closeAnchor() error {
	err := c.tc.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// linger keeps a closed connection going until its outgoing direction
// ended (everything written was consumed and the anchor shut) or
// Options.Linger passed, discarding what the peer sends.
func (c *Conn) linger() {
	until := time.Now().Add(c.opts.Linger)
	c.mu.Lock()
	c.rdl, c.wdl = until, until
	if !c.poked {
		_ = c.tc.SetReadDeadline(until)
	}
	_ = c.tc.SetWriteDeadline(until)
	c.mu.Unlock()
	c.flushBackground()
	c.rmu.Lock()
	defer c.rmu.Unlock()
	buf := make([]byte, 64<<10)
	eof := false
	clean := false
	for time.Now().Before(until) {
		c.mu.Lock()
		ch := c.waitCh()
		pending := len(c.tcpQ) > 0
		over := c.err != nil || c.finished
		out, _ := c.m.Modes()
		clean = c.anchorShut && !pending || out == proto.OutTCP && !pending && c.att == nil
		c.mu.Unlock()
		if over || clean {
			break
		}
		if pending {
			c.flushBackground()
		}
		if eof {
			if waitChange(ch, until, time.Time{}) != nil {
				break
			}
			continue
		}
		_, err := c.read(buf, true, until)
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			eof = true
		case errors.Is(err, os.ErrDeadlineExceeded):
		default:
			eof = true
		}
	}
	c.mu.Lock()
	if !clean && c.err == nil {
		_ = c.tc.SetLinger(0)
	}
	c.finishLocked()
	c.mu.Unlock()
	_ = c.closeAnchor()
}

// finishLocked releases the attachment and the broker's registration;
// the caller closes the anchor after unlocking c.mu.
func (c *Conn) finishLocked() {
	if c.finished {
		return
	}
	c.finished = true
	c.releaseAtt()
	if c.b != nil {
		c.b.Unregister(c.tuple, (*handler)(c))
	}
	for _, t := range []*time.Timer{c.attachT, c.demoteT} {
		if t != nil {
			t.Stop()
		}
	}
	c.settle()
	c.notify()
}

// LocalAddr is the anchor's local address.
func (c *Conn) LocalAddr() net.Addr { return c.tc.LocalAddr() }

// RemoteAddr is the anchor's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.tc.RemoteAddr() }

// SetDeadline sets the read and write deadlines; it never fails on an
// open connection (net.ErrClosed after Close).
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline of Read (zero: none); a Read
// blocked meanwhile sees the new one. It fails with net.ErrClosed after
// Close.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.finished {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl = t
	if !c.poked {
		_ = c.tc.SetReadDeadline(t)
	}
	c.notify()
	return nil
}

// SetWriteDeadline sets the deadline of Write (zero: none). It fails
// with net.ErrClosed after Close.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.finished {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl = t
	_ = c.tc.SetWriteDeadline(t)
	c.notify()
	return nil
}

// Path says what carries each direction now.
func (c *Conn) Path() Path {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, in := c.m.Modes()
	p := Path{Read: TCP, Write: TCP, Phase: c.m.Phase().String()}
	if out == proto.OutRing {
		p.Write = RDMA
	}
	if in != proto.InTCP {
		p.Read = RDMA
	}
	return p
}

// Stats returns a copy of the connection's counters.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Demotes = make(map[string]uint64, len(c.st.Demotes))
	for k, v := range c.st.Demotes {
		s.Demotes[k] = v
	}
	s.Fallbacks = make(map[string]uint64, len(c.st.Fallbacks))
	for k, v := range c.st.Fallbacks {
		s.Fallbacks[k] = v
	}
	return s
}

// ErrNotAttached is Demote of a connection that has no attachment.
var ErrNotAttached = errors.New("sockets: the connection is not attached")

// Demote moves the connection back to TCP (reason "app") and waits,
// within ctx, until both sides agreed. It fails with ErrNotAttached when
// there is no attachment to demote (the connection is on TCP already),
// ctx's error, ErrReset, or net.ErrClosed.
func (c *Conn) Demote(ctx context.Context) error {
	c.mu.Lock()
	if c.closed || c.finished {
		c.mu.Unlock()
		return net.ErrClosed
	}
	if !c.m.Demote(sockwire.ReasonApp) {
		ph := c.m.Phase()
		c.mu.Unlock()
		if ph == proto.Demoting {
			return c.waitPlain(ctx)
		}
		return ErrNotAttached
	}
	c.drain()
	c.mu.Unlock()
	return c.waitPlain(ctx)
}

func (c *Conn) waitPlain(ctx context.Context) error {
	for {
		c.mu.Lock()
		err, ph, ch, pend := c.err, c.m.Phase(), c.waitCh(), len(c.tcpQ) > 0
		c.mu.Unlock()
		if err != nil {
			return err
		}
		if pend {
			c.flushBackground()
			continue
		}
		if ph == proto.Plain {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
