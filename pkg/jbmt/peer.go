package jbmt

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// Peer is this host's connection to the JBMT service of another host: one
// reliable connection per peer host, shared by every process (the
// module's), made by the first Dial and made again by the next Dial after
// it went down.
type Peer struct {
	svc  *Service
	id   uint32
	addr netip.AddrPort
}

// ID is the connection's id on this host.
func (p *Peer) ID() uint32 { return p.id }

// Addr is the peer's address as dialled.
func (p *Peer) Addr() netip.AddrPort { return p.addr }

// Dial returns the connection to the JBMT service at addr (IPv4; port 0
// means the module's jbmt_port, the same on every host by default),
// making it when it is not up. It waits for ctx: when ctx ends first Dial
// returns ctx's error and the module goes on connecting in the background
// (for at most a minute), for the next Dial to find. Errors wrap
// ErrInvalid (not IPv4), ErrClosed, ErrNotSupported, ctx's error, or the
// connection's errno (syscall.ECONNREFUSED: nothing listens there;
// ETIMEDOUT; EHOSTUNREACH: no RDMA route to the address; ECONNRESET;
// ENOSPC: the host keeps as many connections as its module allows).
func (s *Service) Dial(ctx context.Context, addr netip.AddrPort) (*Peer, error) {
	if !addr.Addr().Unmap().Is4() {
		return nil, fmt.Errorf("%w: %v is not an IPv4 address", ErrInvalid, addr)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("jbmt: dial %v: %w", addr, err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("jbmt: dial: %w", ErrClosed)
	}
	timeout := time.Duration(0) // the module's longest
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	type result struct {
		id  uint32
		err error
	}
	done := make(chan result, 1)
	go func() {
		id, err := s.dev.JBMTConnect(addr, timeout)
		done <- result{id, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, wrap(fmt.Sprintf("dial %v", addr), r.err)
		}
		return &Peer{svc: s, id: r.id, addr: addr}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("jbmt: dial %v: %w", addr, ctx.Err())
	}
}
