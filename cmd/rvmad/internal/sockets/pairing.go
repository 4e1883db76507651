package sockets

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// Bounds of the pairing links.
const (
	linkQueue   = 1024            // records waiting for one peer
	dialTimeout = 3 * time.Second // to reach a peer's pairing port
)

// linkKey names a link: this host's address and the peer's. Records of a
// connection always take the link of its addresses, so they stay in order.
type linkKey struct{ local, remote netip.Addr }

// item is one message for a peer, and whom to tell if it cannot go: the
// client that sent it (nil for the broker's own), the connection as that
// client sees it, and the record's type and epoch.
type item struct {
	from  *client
	t     sockwire.Tuple
	typ   sockwire.Type
	epoch uint32
	msg   message
}

// link sends records to one peer broker over a TCP connection it dials
// itself, from the connection's local address; a broker only ever sends
// on the links it dialed, so each direction has one ordered stream. A
// link that fails is dropped, with the records that waited on it; the
// next record dials anew.
type link struct {
	key   linkKey
	queue chan item
	stop  chan struct{}
}

func (l *link) shut() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
}

// toPeerLocked queues it on the link of its connection, dialing one if
// needed. It must be called with b.mu held; it never blocks.
func (b *Broker) toPeerLocked(it item) {
	if b.closed {
		b.answer(it, sockwire.ReasonNoDaemon)
		return
	}
	local, remote := addrs(it.t)
	key := linkKey{local, remote}
	l := b.links[key]
	if l == nil {
		l = &link{key: key, queue: make(chan item, linkQueue), stop: make(chan struct{})}
		b.links[key] = l
		b.wg.Add(1)
		go b.runLink(l)
	}
	select {
	case l.queue <- it:
	default:
		b.m.pairingError(pairQueueFull)
		b.answer(it, sockwire.ReasonNoDaemon)
	}
}

// runLink dials the peer and writes the link's records in order.
func (b *Broker) runLink(l *link) {
	defer b.wg.Done()
	d := net.Dialer{Timeout: dialTimeout, LocalAddr: &net.TCPAddr{IP: l.key.local.AsSlice()}}
	conn, err := d.Dial("tcp", b.peerAddr(l.key.remote))
	if err != nil {
		b.m.pairingError(pairDial)
		b.log.Info("sockets: cannot reach the peer's rvmad", "peer", l.key.remote, "err", err)
		b.linkDown(l)
		return
	}
	defer conn.Close()
	// The peer never sends on this connection: a read that ends means it
	// closed (restarted, stopped), and the link goes at once rather than
	// at the write after next.
	gone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, conn)
		close(gone)
	}()
	var buf []byte
	for {
		select {
		case it := <-l.queue:
			buf, err = it.msg.encode(buf[:0])
			if err == nil {
				_, err = conn.Write(buf)
			}
			if err != nil {
				b.m.pairingError(pairBroken)
				b.log.Info("sockets: pairing connection failed", "peer", l.key.remote, "err", err)
				b.mu.Lock()
				b.answer(it, sockwire.ReasonNoDaemon)
				b.mu.Unlock()
				conn.Close()
				<-gone
				b.linkDown(l)
				return
			}
		case <-gone:
			b.log.Info("sockets: the peer's rvmad closed the pairing connection", "peer", l.key.remote)
			b.linkDown(l)
			return
		case <-l.stop:
			conn.Close()
			<-gone
			return
		}
	}
}

// linkDown drops l and answers the records that waited on it.
func (b *Broker) linkDown(l *link) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.links[l.key] == l {
		delete(b.links, l.key)
	}
	for {
		select {
		case it := <-l.queue:
			b.answer(it, sockwire.ReasonNoDaemon)
		default:
			return
		}
	}
}

// ListenPairing accepts peer brokers on addr (host:port) until Close.
func (b *Broker) ListenPairing(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := b.addListener(ln); err != nil {
		return nil, err
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					b.log.Error("sockets: pairing port stopped accepting", "err", err)
				}
				return
			}
			b.mu.Lock()
			if b.closed {
				b.mu.Unlock()
				conn.Close()
				return
			}
			b.conns[conn] = struct{}{}
			b.wg.Add(1)
			b.mu.Unlock()
			go b.servePeer(conn)
		}
	}()
	return ln.Addr(), nil
}

// servePeer reads a peer broker's messages until it closes or sends what
// is not a message.
func (b *Broker) servePeer(conn net.Conn) {
	defer b.wg.Done()
	defer func() {
		b.mu.Lock()
		delete(b.conns, conn)
		b.mu.Unlock()
		conn.Close()
	}()
	src := conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	buf := make([]byte, sockwire.RecordMax)
	for {
		m, err := readMessage(conn, buf)
		if err == nil {
			err = b.fromPeer(src, m)
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
		case errors.As(err, new(*sockwire.Error)) || errors.Is(err, errMessage) || errors.Is(err, io.ErrUnexpectedEOF):
			b.m.pairingError(pairMalformed)
			b.log.Warn("sockets: a peer sent a malformed message; closing its pairing connection", "peer", src, "err", err)
		default:
			b.log.Debug("sockets: pairing connection ended", "peer", src, "err", err)
		}
		return
	}
}
