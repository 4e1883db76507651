// Package broker is pkg/sockets' client of rvmad's sockets broker
// (docs/sockets.md, "rvmad's broker"): a SOCK_SEQPACKET Unix socket on
// which a process REGISTERs the connections it owns (passing each one's
// socket with SCM_RIGHTS), sends ROUTE'd ATTACH_*, DEMOTE records to the
// peer host's owner of a connection, and receives the peer's records and
// the broker's RESULTs.
//
// One Client serves every connection of a process (the broker knows a
// process by its credentials, one Unix connection each). Records that
// arrive are handed to the Handler registered for their connection's
// tuple, one at a time, in order.
package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// DefaultSocket is where rvmad's broker listens.
const DefaultSocket = "/run/rvmad/sockets.sock"

// ErrGone is the broker's connection ended (rvmad stopped or
// disconnected this process).
var ErrGone = errors.New("sockets broker: connection to rvmad ended")

// ErrDenied is a REGISTER the broker refused (RESULT with a reason).
var ErrDenied = errors.New("sockets broker: registration refused")

// Handler receives the records about one connection: the peer's
// ATTACH_REQ, ATTACH_REP, ATTACH_NACK and DEMOTE (as sockwire records),
// the broker's RESULT about a routed record it could not take or
// deliver, and its DEVICE (an RDMA device being removed), which every
// handler gets. Gone is called once when the broker's connection ends.
// Neither may block for long: the client's one reader calls them.
type Handler interface {
	FromBroker(rec sockwire.Record)
	BrokerGone()
}

// Client is one process's connection to rvmad's broker.
type Client struct {
	conn *net.UnixConn

	mu       sync.Mutex
	handlers map[sockwire.Tuple]Handler
	waiting  map[sockwire.Tuple]chan sockwire.Reason // REGISTER results
	gone     bool
	out      chan []byte
	done     chan struct{}
	once     sync.Once
}

// Dial connects to the broker at path. It fails when nothing listens
// there (no rvmad, or its sockets service disabled).
func Dial(path string) (*Client, error) {
	if path == "" {
		path = DefaultSocket
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("sockets broker: %w", err)
	}
	c := &Client{conn: conn, handlers: map[sockwire.Tuple]Handler{},
		waiting: map[sockwire.Tuple]chan sockwire.Reason{}, out: make(chan []byte, 1024), done: make(chan struct{})}
	go c.readLoop()
	go c.writeLoop()
	return c, nil
}

// Gone reports whether the broker's connection ended.
func (c *Client) Gone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gone
}

// Close ends the connection; every handler's BrokerGone is called.
func (c *Client) Close() error {
	c.shut()
	return nil
}

func (c *Client) shut() {
	c.once.Do(func() {
		close(c.done)
		c.conn.Close()
	})
}

// TupleOf is the tuple of the connected TCP socket rc as the broker
// checks it: the socket's own family, IPv4 addresses as ::ffff:a.b.c.d
// (getsockname, getpeername). It also returns the socket's descriptor
// number (informative).
func TupleOf(rc syscall.RawConn) (sockwire.Tuple, int, error) {
	var t sockwire.Tuple
	var fdn int
	var terr error
	err := rc.Control(func(fd uintptr) {
		fdn = int(fd)
		t, terr = sockTuple(int(fd))
	})
	if err == nil {
		err = terr
	}
	return t, fdn, err
}

func sockTuple(fd int) (sockwire.Tuple, error) {
	local, err := unix.Getsockname(fd)
	if err != nil {
		return sockwire.Tuple{}, err
	}
	remote, err := unix.Getpeername(fd)
	if err != nil {
		return sockwire.Tuple{}, err
	}
	switch l := local.(type) {
	case *unix.SockaddrInet4:
		if r, ok := remote.(*unix.SockaddrInet4); ok {
			return sockwire.Tuple{Family: sockwire.AFInet, LocalPort: uint16(l.Port), RemotePort: uint16(r.Port),
				Local: netip.AddrFrom4(l.Addr).As16(), Remote: netip.AddrFrom4(r.Addr).As16()}, nil
		}
	case *unix.SockaddrInet6:
		if r, ok := remote.(*unix.SockaddrInet6); ok {
			return sockwire.Tuple{Family: sockwire.AFInet6, LocalPort: uint16(l.Port), RemotePort: uint16(r.Port),
				Local: l.Addr, Remote: r.Addr}, nil
		}
	}
	return sockwire.Tuple{}, fmt.Errorf("sockets broker: not an IPv4 or IPv6 connection")
}

// Register proves to the broker that this process owns the connection
// whose socket is rc (passed with SCM_RIGHTS) and has its records go to
// h. It waits for the broker's RESULT within ctx; a refusal wraps
// ErrDenied, a lost broker ErrGone.
func (c *Client) Register(ctx context.Context, rc syscall.RawConn, h Handler) (sockwire.Tuple, error) {
	t, _, err := TupleOf(rc)
	if err != nil {
		return t, err
	}
	ch := make(chan sockwire.Reason, 1)
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return t, ErrGone
	}
	c.waiting[t] = ch
	c.handlers[t] = h
	c.mu.Unlock()
	unwait := func() {
		c.mu.Lock()
		if c.waiting[t] == ch {
			delete(c.waiting, t)
		}
		c.mu.Unlock()
	}
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		rec, err := sockwire.Marshal(sockwire.Register{Epoch: 1, Tuple: t, FD: int32(fd)})
		if err != nil {
			serr = err
			return
		}
		// Written here, not by the writer: the descriptor must be the
		// socket's while the kernel copies it.
		_, _, serr = c.conn.WriteMsgUnix(rec, unix.UnixRights(int(fd)), nil)
	})
	if cerr == nil {
		cerr = serr
	}
	if cerr != nil {
		unwait()
		c.forget(t, h)
		return t, fmt.Errorf("sockets broker: REGISTER: %w", cerr)
	}
	select {
	case r := <-ch:
		if r != 0 {
			c.forget(t, h)
			return t, fmt.Errorf("%w: %v", ErrDenied, r)
		}
		return t, nil
	case <-c.done:
		unwait()
		return t, ErrGone
	case <-ctx.Done():
		unwait()
		c.forget(t, h)
		return t, ctx.Err()
	}
}

// forget drops h as the handler of t (if it still is).
func (c *Client) forget(t sockwire.Tuple, h Handler) {
	c.mu.Lock()
	if c.handlers[t] == h {
		delete(c.handlers, t)
	}
	c.mu.Unlock()
}

// Unregister tells the broker to forget t and stops handing its records
// to h. It does not wait for the answer.
func (c *Client) Unregister(t sockwire.Tuple, h Handler) {
	c.mu.Lock()
	mine := c.handlers[t] == h
	if mine {
		delete(c.handlers, t)
	}
	c.mu.Unlock()
	if mine {
		if b, err := sockwire.Marshal(sockwire.Unregister{Epoch: 1, Tuple: t}); err == nil {
			c.queue(b)
		}
	}
}

// Send relays rec (ATTACH_REQ, ATTACH_REP, ATTACH_NACK, DEMOTE) about the
// connection t to its owner on the peer host: ROUTE and rec in one
// message, in order with every other Send. It fails with ErrGone when
// the broker is gone or the queue is full, or with the record's encoding
// error.
func (c *Client) Send(t sockwire.Tuple, rec sockwire.Record) error {
	b, err := sockwire.Marshal(sockwire.Route{Epoch: rec.RecordEpoch(), Tuple: t})
	if err == nil {
		b, err = sockwire.Append(b, rec)
	}
	if err != nil {
		return fmt.Errorf("sockets broker: %w", err)
	}
	if !c.queue(b) {
		return ErrGone
	}
	return nil
}

func (c *Client) queue(b []byte) bool {
	select {
	case <-c.done:
		return false
	default:
	}
	select {
	case c.out <- b:
		return true
	default:
		c.shut()
		return false
	}
}

func (c *Client) writeLoop() {
	for {
		select {
		case b := <-c.out:
			if _, err := c.conn.Write(b); err != nil {
				c.shut()
				return
			}
		case <-c.done:
			return
		}
	}
}

func (c *Client) readLoop() {
	defer c.end()
	buf := make([]byte, 2*(sockwire.RouteSize+sockwire.RecordMax))
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := c.conn.ReadMsgUnix(buf, oob)
		if oobn > 0 { // never expected: close whatever came
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					if fds, err := unix.ParseUnixRights(&m); err == nil {
						for _, fd := range fds {
							unix.Close(fd)
						}
					}
				}
			}
		}
		if err != nil || n == 0 {
			if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_ = err // the broker is gone either way
			}
			return
		}
		route, rec, err := parse(buf[:n])
		if err != nil {
			continue // not ours to judge: skip what we cannot read
		}
		c.dispatch(route, rec)
	}
}

// parse splits one message into its optional ROUTE and its record.
func parse(b []byte) (*sockwire.Route, sockwire.Record, error) {
	h, err := sockwire.PeekHeader(b)
	if err != nil {
		return nil, nil, err
	}
	if h.Type != sockwire.TypeRoute {
		rec, err := sockwire.Decode(b)
		return nil, rec, err
	}
	if len(b) <= h.Length {
		return nil, nil, fmt.Errorf("sockets broker: a ROUTE alone")
	}
	r, err := sockwire.Decode(b[:h.Length])
	if err != nil {
		return nil, nil, err
	}
	rec, err := sockwire.Decode(b[h.Length:])
	if err != nil {
		return nil, nil, err
	}
	route := r.(sockwire.Route)
	return &route, rec, nil
}

func (c *Client) dispatch(route *sockwire.Route, rec sockwire.Record) {
	var t sockwire.Tuple
	if route != nil {
		t = route.Tuple
	} else if res, ok := rec.(sockwire.Result); ok {
		t = res.Tuple
		if res.Request == sockwire.TypeRegister {
			c.mu.Lock()
			ch := c.waiting[t]
			delete(c.waiting, t)
			c.mu.Unlock()
			if ch != nil {
				ch <- res.Reason
			}
			return
		}
		if res.Request == sockwire.TypeUnregister {
			return
		}
	} else if d, ok := rec.(sockwire.Device); ok {
		c.mu.Lock()
		hs := make([]Handler, 0, len(c.handlers))
		for _, h := range c.handlers {
			hs = append(hs, h)
		}
		c.mu.Unlock()
		for _, h := range hs {
			h.FromBroker(d)
		}
		return
	} else {
		return
	}
	c.mu.Lock()
	h := c.handlers[t]
	c.mu.Unlock()
	if h != nil {
		h.FromBroker(rec)
	}
}

func (c *Client) end() {
	c.shut()
	c.mu.Lock()
	c.gone = true
	hs := make([]Handler, 0, len(c.handlers))
	for _, h := range c.handlers {
		hs = append(hs, h)
	}
	c.handlers = map[sockwire.Tuple]Handler{}
	c.mu.Unlock()
	for _, h := range hs {
		h.BrokerGone()
	}
}
