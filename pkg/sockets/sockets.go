// Package sockets is anchored sockets over RDMA for Go programs
// (docs/sockets.md): TCP connections whose bytes move onto an RDMA
// attachment when both hosts run rvmad with its sockets broker, and
// back to TCP whenever RDMA stops fitting, without losing, duplicating or
// reordering a byte. It speaks the same protocol as the C shim
// (cmd/sockpreload), so a Go program and a C program under the shim talk
// to each other, and a peer with neither only ever sees TCP.
//
// The connection's kernel TCP socket, the anchor, is always there: Dial,
// Listen's Accept and Upgrade return a *Conn over a real *net.TCPConn.
// The connection starts on TCP; in the background, the dialing side
// registers the connection with rvmad, asks the peer (ATTACH_REQ through
// rvmad) and, once the accepting side answered (ATTACH_REP), each
// direction switches to RDMA at a byte offset: the sender says how many
// bytes it wrote to the anchor (SWITCH, on the new QP), then writes into
// a ring the receiver owns with RDMA WRITE_WITH_IMM; the receiver reads
// the anchor up to that offset, then the ring. Credits flow back as
// 8-byte RDMA writes into the sender's control block. Demote (or a QP
// failure, or bytes on the anchor after a switch) moves the connection
// back to TCP through rvmad (DEMOTE), resending from the anchor what the
// peer had not consumed.
//
// Nothing of that is the caller's business: without rvmad, without an
// RDMA device, with a peer that refuses or does not speak the protocol,
// the connection just stays on TCP. Path and Stats say where the bytes
// went.
//
// The transitions are those of the model-checked state machine
// (pkg/sockets/internal/proto); this package does its I/O. A Read
// blocked while the ring is next waits in Go's netpoller on the anchor
// (which also reports the peer's FIN or RST), and the attachment's
// completion queue wakes it; no goroutine spins.
//
// # Limits
//
//   - The acceptor registers a connection with rvmad once Accept
//     returned it; a dialer whose ATTACH_REQ arrives before that is told
//     there is no owner (or busy) and asks again (after 100 ms, 400 ms,
//     1.6 s, then three times 3.2 s later).
//   - A peer that dies while attached shows as the anchor's end: a Read
//     waiting for the ring returns io.ErrUnexpectedEOF (or ErrReset) after
//     Options.PeerGoneWait; a Write whose bytes are held after the QP
//     failed returns ErrReset when the peer's DEMOTE has not come within
//     Options.DemoteTimeout.
//   - Close of a connection whose outgoing direction is on RDMA returns
//     at once, but the connection lives on in the background until the
//     peer consumed what was written (Options.Linger at most). Unread
//     bytes are discarded, not answered with a reset.
//   - Without rvmad (stopped after the attachment), a connection whose
//     outgoing direction is on RDMA cannot demote: Demote, or a QP
//     failure, resets it (ErrReset).
//
// # Conventions
//
// A nil *Options means the defaults each field documents. Close is safe
// to call twice and from any goroutine. Errors wrap their cause with %w;
// callers branch with errors.Is on ErrReset, net.ErrClosed,
// os.ErrDeadlineExceeded, io.EOF and io.ErrUnexpectedEOF. Nothing in
// the package panics on a peer's or a caller's input.
package sockets

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/sockets/internal/broker"
)

// Defaults of Options.
const (
	DefaultRingSize      = 256 << 10
	DefaultAttachTimeout = 10 * time.Second
	DefaultDemoteTimeout = 30 * time.Second
	DefaultPeerGoneWait  = 2 * time.Second
	DefaultLinger        = 30 * time.Second
	DefaultSocket        = broker.DefaultSocket
)

// Options tune a connection. The zero value (or a nil *Options) is the
// default of each field.
type Options struct {
	// Socket is rvmad's broker socket (default DefaultSocket).
	Socket string
	// Disable keeps the connection on TCP: no rvmad, no RDMA.
	Disable bool
	// Device is the RDMA device to use; "" picks the one whose port 1
	// has a RoCE v2 GID for the connection's local address.
	Device string
	// RingSize is the size of the ring this side receives into, a power
	// of two from 4 KiB to 1 GiB (default DefaultRingSize); also the
	// most this side keeps of its own unconsumed bytes.
	RingSize int
	// Accepted tells Upgrade that the connection was accepted (the
	// protocol's server, which answers attachments); false: it was
	// dialed (the client, which asks for them). Dial and Accept set it
	// themselves.
	Accepted bool
	// WaitAttach makes Dial and Upgrade of a dialed connection wait,
	// within their context, until the attachment has an outcome (the
	// outgoing direction switched to RDMA, or the connection stays on
	// TCP). By default they return at once and the attachment happens
	// in the background.
	WaitAttach bool
	// AttachTimeout bounds an attachment's handshake (default
	// DefaultAttachTimeout); the connection stays on TCP after it.
	AttachTimeout time.Duration
	// DemoteTimeout bounds the wait for the peer's DEMOTE (default
	// DefaultDemoteTimeout); a connection whose outgoing bytes are
	// held past it is reset.
	DemoteTimeout time.Duration
	// PeerGoneWait is how long a Read waiting for ring bytes keeps
	// waiting after the anchor reported the peer's FIN or RST (default
	// DefaultPeerGoneWait): the ring's end may still be on its way.
	PeerGoneWait time.Duration
	// Linger bounds how long Close keeps an attached connection alive in
	// the background to deliver what was written (default
	// DefaultLinger); the anchor is reset after it.
	Linger time.Duration
}

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Socket == "" {
		r.Socket = DefaultSocket
	}
	if r.RingSize == 0 {
		r.RingSize = DefaultRingSize
	}
	if r.RingSize < 1<<12 || r.RingSize > 1<<30 || r.RingSize&(r.RingSize-1) != 0 {
		return r, fmt.Errorf("%w: ring size %d is not a power of two from 4 KiB to 1 GiB", ErrOptions, r.RingSize)
	}
	if r.AttachTimeout <= 0 {
		r.AttachTimeout = DefaultAttachTimeout
	}
	if r.DemoteTimeout <= 0 {
		r.DemoteTimeout = DefaultDemoteTimeout
	}
	if r.PeerGoneWait <= 0 {
		r.PeerGoneWait = DefaultPeerGoneWait
	}
	if r.Linger <= 0 {
		r.Linger = DefaultLinger
	}
	return r, nil
}

// ErrOptions is an Options value that cannot be used (a ring size that
// is not a power of two in range), or a network that is not TCP.
var ErrOptions = errors.New("sockets: invalid options")

// ErrReset is a connection reset: the peer aborted, the protocol broke,
// or a demote could not complete. It wraps syscall.ECONNRESET.
var ErrReset = fmt.Errorf("sockets: connection reset: %w", syscall.ECONNRESET)

func checkNetwork(network string) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
		return nil
	}
	return fmt.Errorf("%w: network %q is not tcp, tcp4 or tcp6", ErrOptions, network)
}

// Dial connects to addr on network ("tcp", "tcp4" or "tcp6") within ctx
// and returns the connection on TCP; its attachment to RDMA proceeds in
// the background (or before Dial returns, with Options.WaitAttach). It
// fails as net.Dialer.DialContext does (an *net.OpError), or with
// ErrOptions. A missing rvmad or RDMA device is never an error: the
// connection stays on TCP.
func Dial(ctx context.Context, network, addr string, opts *Options) (*Conn, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkNetwork(network); err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	o.Accepted = false
	c := newConn(nc.(*net.TCPConn), o)
	if o.WaitAttach {
		c.waitAttach(ctx)
	}
	return c, nil
}

// Upgrade takes over tc, an established TCP connection, and returns it as
// a *Conn (which now owns tc: do not use tc any more). opts.Accepted says
// whether tc was accepted (the protocol's server) or dialed (the
// client); both ends of a connection must be upgraded, with opposite
// roles, for it to attach. ctx bounds only the wait of
// Options.WaitAttach. It fails with ErrOptions, or when tc is nil.
func Upgrade(ctx context.Context, tc *net.TCPConn, opts *Options) (*Conn, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if tc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrOptions)
	}
	c := newConn(tc, o)
	if o.WaitAttach && !o.Accepted {
		c.waitAttach(ctx)
	}
	return c, nil
}

// Listener accepts TCP connections and returns them as *Conn, each
// registered with rvmad so that its dialer can attach it to RDMA.
type Listener struct {
	l    *net.TCPListener
	opts Options
}

// Listen listens on addr on network ("tcp", "tcp4" or "tcp6"), as
// net.Listen does. It fails as net.Listen does, or with ErrOptions. A
// dual-stack listener's IPv4 connections (AF_INET6 sockets with ::ffff:
// addresses) attach with IPv4 dialers: rvmad pairs the two views (since
// its commit 903d7d0).
func Listen(network, addr string, opts *Options) (*Listener, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkNetwork(network); err != nil {
		return nil, err
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	o.Accepted = true
	return &Listener{l: l.(*net.TCPListener), opts: o}, nil
}

// Accept waits for the next connection; it implements net.Listener. It
// fails as net.TCPListener.Accept does (net.ErrClosed after Close).
func (l *Listener) Accept() (net.Conn, error) { return l.AcceptContext(context.Background()) }

// AcceptContext is Accept that gives up when ctx ends (returning ctx's
// error); the listener stays usable.
func (l *Listener) AcceptContext(ctx context.Context) (*Conn, error) {
	if ctx.Done() == nil {
		tc, err := l.l.AcceptTCP()
		if err != nil {
			return nil, err
		}
		return newConn(tc, l.opts), nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dl, ok := ctx.Deadline()
		step := time.Now().Add(50 * time.Millisecond)
		if !ok || dl.After(step) {
			dl = step
		}
		if err := l.l.SetDeadline(dl); err != nil {
			return nil, err
		}
		tc, err := l.l.AcceptTCP()
		_ = l.l.SetDeadline(time.Time{})
		if err == nil {
			return newConn(tc, l.opts), nil
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return nil, err
		}
	}
}

// Close stops listening; connections already accepted stay. Safe twice.
func (l *Listener) Close() error {
	err := l.l.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.l.Addr() }

// brokers are the process's connections to rvmad, by socket path.
var (
	brokerMu  sync.Mutex
	brokers   = map[string]*broker.Client{}
	brokerBad = map[string]time.Time{} // when dialing last failed
)

// brokerFor returns the process's broker client at path, dialing it if
// needed; nil when rvmad does not answer (tried again after a second).
func brokerFor(path string) *broker.Client {
	brokerMu.Lock()
	defer brokerMu.Unlock()
	if b := brokers[path]; b != nil && !b.Gone() {
		return b
	}
	if t, ok := brokerBad[path]; ok && time.Since(t) < time.Second {
		return nil
	}
	b, err := broker.Dial(path)
	if err != nil {
		brokerBad[path] = time.Now()
		delete(brokers, path)
		return nil
	}
	delete(brokerBad, path)
	brokers[path] = b
	return b
}
