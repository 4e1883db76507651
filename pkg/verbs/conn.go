package verbs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// ConnOptions configure Dial and a Listener's connections; nil means the
// defaults given with each field.
type ConnOptions struct {
	// Source binds the connection to a local address (zero: any).
	// Listeners ignore it.
	Source netip.AddrPort
	// SendDepth and RecvDepth are the work requests the application may
	// have outstanding on the QP's send and receive queues (default 64
	// each). The QP gets one more of each for the package's own use, and
	// the CQ room for all of them, so it cannot overrun.
	SendDepth, RecvDepth int
	// MaxSendSGE and MaxRecvSGE are the scatter/gather entries a work
	// request may have (default 1); MaxInlineData the bytes a send may
	// carry inline (default 0).
	MaxSendSGE, MaxRecvSGE, MaxInlineData int
	// PD, if set, is the protection domain the QP is created in (to share
	// memory regions between connections); it must be of the device the
	// address resolves to, and stays the caller's. Nil: a PD of the
	// connection's own, closed with it.
	PD *PD
	// Param carries private data, RDMA READ depths and retry counts
	// (ConnParam; nil for its defaults).
	Param *ConnParam
	// AckTimeout, if not zero, is the QP's ACK timeout (CMID.SetAckTimeout):
	// how long before a peer whose host vanished is noticed.
	AckTimeout time.Duration
}

func (o *ConnOptions) withDefaults() ConnOptions {
	var c ConnOptions
	if o != nil {
		c = *o
	}
	if c.SendDepth <= 0 {
		c.SendDepth = 64
	}
	if c.RecvDepth <= 0 {
		c.RecvDepth = 64
	}
	if c.MaxSendSGE <= 0 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE <= 0 {
		c.MaxRecvSGE = 1
	}
	return c
}

// Conn is a connected RC endpoint made by Dial or Listener.Accept: its
// rdma_cm identifier, protection domain, one CQ (with a completion
// channel) for both of its QP's queues, and the QP in RTS. Post work
// requests on QP, register memory on PD, and take completions with Wait
// (or Poll, or the CQ's Spin). The fields are the low-level objects, for
// everything verbs can do; Close closes them all.
//
// When the connection ends (the peer disconnects or its process dies,
// the device goes away, or Close), the QP moves to the error state at
// once: every work request posted before completes with
// WCWRFlushErr (or its own error), and then Wait and Poll return
// ErrPeerGone.
type Conn struct {
	ID *CMID
	PD *PD
	CQ *CQ
	QP *QP

	ch    *CompChannel
	ownPD bool
}

// markerID is the work request ID of the zero-length send and the
// receive a Conn posts when its connection ends: their flushed
// completions, which come after those of everything posted before, tell
// its CQ that it is drained. Poll never returns them.
const markerID = ^uint64(0) - 0x6d6b

// Dial connects to addr (an rdma_cm RC connection, as the TCP port space
// of rdma_cm: a Listener, or any rdma_cm server, on the peer) and returns
// the connected endpoint. Errors wrap ctx's error, ErrNoDevice (no RDMA
// device reaches addr), ErrInvalid (options), *RejectError (refused: by
// the peer, or nothing listens: errors.Is(err, syscall.ECONNREFUSED)),
// *CMEventError (unreachable, connect error), or a verb's error.
func Dial(ctx context.Context, addr netip.AddrPort, opts *ConnOptions) (*Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("verbs: dial %v: %w", addr, err)
	}
	o := opts.withDefaults()
	id, err := NewCMID(PSTCP)
	if err != nil {
		return nil, fmt.Errorf("verbs: dial %v: %w", addr, err)
	}
	c, err := dial(ctx, id, addr, &o)
	if err != nil {
		id.Close()
		return nil, fmt.Errorf("verbs: dial %v: %w", addr, err)
	}
	return c, nil
}

func dial(ctx context.Context, id *CMID, addr netip.AddrPort, o *ConnOptions) (*Conn, error) {
	if err := id.ResolveAddr(ctx, o.Source, addr); err != nil {
		return nil, err
	}
	if err := id.ResolveRoute(ctx); err != nil {
		return nil, err
	}
	c, err := newConn(id, o)
	if err != nil {
		return nil, err
	}
	if err := id.Connect(ctx, o.Param); err != nil {
		c.closeObjects()
		return nil, err
	}
	return c, nil
}

// newConn makes a connection's PD, channel, CQ and QP on id.
func newConn(id *CMID, o *ConnOptions) (*Conn, error) {
	dev, err := id.Context()
	if err != nil {
		return nil, err
	}
	c := &Conn{ID: id, PD: o.PD}
	if c.PD == nil {
		if c.PD, err = dev.AllocPD(); err != nil {
			return nil, err
		}
		c.ownPD = true
	} else if c.PD.ctx.c != dev.c {
		return nil, invalid("ConnOptions.PD is of another device than the address resolves to")
	}
	ok := false
	defer func() {
		if !ok {
			c.closeObjects()
		}
	}()
	if c.ch, err = dev.NewCompChannel(); err != nil {
		return nil, err
	}
	// every request posted at once, plus the two markers
	if c.CQ, err = dev.NewCQ(o.SendDepth+o.RecvDepth+2, &CQOptions{Channel: c.ch}); err != nil {
		return nil, err
	}
	if c.QP, err = id.NewQP(c.PD, &QPInitAttr{Type: QPTypeRC, SendCQ: c.CQ, RecvCQ: c.CQ, SignalAll: false,
		Cap: QPCap{MaxSendWR: o.SendDepth + 1, MaxRecvWR: o.RecvDepth + 1, MaxSendSGE: o.MaxSendSGE,
			MaxRecvSGE: o.MaxRecvSGE, MaxInlineData: o.MaxInlineData}}); err != nil {
		return nil, err
	}
	if o.AckTimeout != 0 {
		if err := id.SetAckTimeout(o.AckTimeout); err != nil {
			return nil, err
		}
	}
	id.onEnd = c.drain
	ok = true
	return c, nil
}

// drain runs once when the connection ends (its QP is in the error state
// already): it posts the two markers, whose flushed completions come
// after those of everything posted before on the same queue. A receive
// posted in the error state is flushed only when the device looks at the
// queue again (rxe's user-space provider posts receives without a system
// call): moving the QP to the error state once more makes it look.
func (c *Conn) drain() {
	c.CQ.drainLeft.Store(2)
	left := int32(2)
	if c.QP.PostSend(SendWR{ID: markerID, Op: OpSend, Flags: SendSignaled}) != nil {
		left--
	}
	if c.QP.PostRecv(RecvWR{ID: markerID}) != nil {
		left--
	}
	_ = c.QP.ToError() // ERR to ERR: the receive queue is flushed again
	if left < 2 && c.CQ.drainLeft.Add(left-2) <= 0 {
		c.CQ.gone.Store(true) // no marker to wait for: gone now
	}
	c.CQ.signal()
}

// dropMarkers removes a Conn's markers from wcs and returns how many
// completions are left; the CQ is gone once both came.
func (cq *CQ) dropMarkers(wcs []WC) int {
	n := 0
	for _, wc := range wcs {
		if wc.ID == markerID && (wc.Opcode == WCSend || wc.Opcode == WCRecv || wc.Status != WCSuccess) {
			if cq.drainLeft.Add(-1) == 0 {
				cq.gone.Store(true)
			}
			continue
		}
		wcs[n] = wc
		n++
	}
	return n
}

// Wait returns at least one completion of the connection's QP, parking
// the goroutine until one comes. Errors: ErrPeerGone once the connection
// ended and every completion was returned, ctx's error, ErrClosed, or the
// CQ's other errors (see CQ.Wait).
func (c *Conn) Wait(ctx context.Context, wcs []WC) (int, error) { return c.CQ.Wait(ctx, wcs) }

// Poll returns the completions of the connection's QP that are there,
// without blocking; errors as for Wait.
func (c *Conn) Poll(wcs []WC) (int, error) { return c.CQ.Poll(wcs) }

// Done returns a channel closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.ID.Ended() }

// LocalAddr returns the connection's local address.
func (c *Conn) LocalAddr() netip.AddrPort {
	a, _ := c.ID.LocalAddr()
	return a
}

// PeerAddr returns the peer's address.
func (c *Conn) PeerAddr() netip.AddrPort {
	a, _ := c.ID.PeerAddr()
	return a
}

// Close ends the connection (Disconnect, waiting at most DisconnectWait
// for the peer's answer) and closes the QP, CQ, channel, identifier and
// the PD if the Conn made it. Memory regions registered on that PD are
// closed with it. A second Close returns nil.
func (c *Conn) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DisconnectWait)
	defer cancel()
	err := c.ID.Disconnect(ctx)
	if errors.Is(err, ErrClosed) {
		err = nil
	}
	if cerr := c.closeObjects(); err == nil {
		err = cerr
	}
	return err
}

func (c *Conn) closeObjects() error {
	var errs []error
	if c.QP != nil {
		errs = append(errs, c.QP.Close())
	}
	if c.CQ != nil {
		errs = append(errs, c.CQ.Close())
	}
	if c.ch != nil {
		errs = append(errs, c.ch.Close())
	}
	errs = append(errs, c.ID.Close())
	if c.ownPD && c.PD != nil {
		errs = append(errs, c.PD.Close())
	}
	return errors.Join(errs...)
}

// Listener accepts rdma_cm RC connections on an address.
type Listener struct {
	id   *CMID
	opts ConnOptions
}

// Listen listens for connections on addr (a zero address: every RDMA
// device's; port 0: one the system picks, see Addr), with opts for the
// connections Accept makes. Errors wrap ErrClosed or the errno of
// rdma_bind_addr (EADDRINUSE) or rdma_listen.
func Listen(addr netip.AddrPort, opts *ConnOptions) (*Listener, error) {
	id, err := NewCMID(PSTCP)
	if err != nil {
		return nil, fmt.Errorf("verbs: listen %v: %w", addr, err)
	}
	if err := id.Listen(addr, 128); err != nil {
		id.Close()
		return nil, fmt.Errorf("verbs: listen %v: %w", addr, err)
	}
	return &Listener{id: id, opts: opts.withDefaults()}, nil
}

// Addr returns the address the listener is bound to.
func (l *Listener) Addr() netip.AddrPort {
	a, _ := l.id.LocalAddr()
	return a
}

// Accept waits for a connection request, accepts it and returns the
// connected endpoint; PrivateData returns what the peer sent with its
// request. A request Accept cannot serve (no memory, a PD of another
// device) is rejected and the error returned; the listener goes on.
// Errors wrap ctx's error, ErrClosed (the listener closed), or a verb's
// error.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	id, ev, err := l.id.GetRequest(ctx)
	if err != nil {
		return nil, fmt.Errorf("verbs: accept: %w", err)
	}
	c, err := newConn(id, &l.opts)
	if err != nil {
		id.Reject(nil)
		id.Close()
		return nil, fmt.Errorf("verbs: accept: %w", err)
	}
	c.ID.acceptData = ev.PrivateData
	if err := id.Accept(ctx, l.opts.Param); err != nil {
		c.closeObjects()
		return nil, fmt.Errorf("verbs: accept: %w", err)
	}
	return c, nil
}

// Close stops listening; connections accepted stay. A second Close
// returns nil.
func (l *Listener) Close() error { return l.id.Close() }

// PrivateData returns the private data that came with the connection:
// the peer's request for an accepted Conn, its answer for a dialed one
// (padded by the transport with zeros to its maximum length).
func (c *Conn) PrivateData() []byte { return c.ID.acceptData }
