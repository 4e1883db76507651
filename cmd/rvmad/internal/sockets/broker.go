package sockets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// MaxClientsPerUID caps the processes of one user connected to the Unix
// socket at once; further connections are closed at once.
const MaxClientsPerUID = 1024

// Options configure a Broker.
type Options struct {
	// MaxPerUID caps the registrations of one user (config
	// sockets.max_registrations_per_uid).
	MaxPerUID int
	// PairingPort is the peers' pairing port, dialed at the remote
	// address of a connection.
	PairingPort int
	// PeerAddr, if set, returns the host:port to dial for the peer host
	// at remote instead (tests run two brokers on one host).
	PeerAddr func(remote netip.Addr) string
	// Verifier proves ownership; nil: this host's kernel.
	Verifier Verifier
	// Log is the logger; nil discards.
	Log *slog.Logger
}

// Broker is rvmad's sockets broker: it pairs connections between the
// processes of this host (on the Unix socket) and the peer hosts' brokers
// (on the pairing port), and relays their ATTACH_* and DEMOTE
// records in order. It never carries data.
type Broker struct {
	opts   Options
	log    *slog.Logger
	verify Verifier
	m      *metrics

	mu         sync.Mutex
	tab        *table
	clients    map[*client]struct{}
	uidClients map[uint32]int
	segUID     map[uint32]segUsage // statistics segments mapped, per user
	links      map[linkKey]*link
	conns      map[net.Conn]struct{} // accepted pairing connections
	listeners  []net.Listener
	parked     map[sockwire.Tuple]*parked // peers' ATTACH_REQs waiting for an owner, by key
	devWatch   *devWatch                  // the kernel's uevents; nil: not watched
	devNotices uint32                     // DEVICE records sent, the last one's epoch
	closed     bool
	wg         sync.WaitGroup
}

// NewBroker returns a broker that does nothing until Listen and
// ListenPairing. m may be nil (a broker of its own).
func NewBroker(opts Options, m *metrics) *Broker {
	b := &Broker{opts: opts, log: opts.Log, verify: opts.Verifier, tab: newTable(opts.MaxPerUID),
		clients: map[*client]struct{}{}, uidClients: map[uint32]int{}, segUID: map[uint32]segUsage{},
		links: map[linkKey]*link{}, parked: map[sockwire.Tuple]*parked{},
		conns: map[net.Conn]struct{}{}}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	if b.verify == nil {
		b.verify = kernel{}
	}
	if m == nil {
		m = newMetrics(b.counts)
		m.shimFn = b.shimView
	}
	b.m = m
	return b
}

// counts returns the clients and registrations now.
func (b *Broker) counts() (int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.clients), b.tab.len()
}

// SetMaxPerUID changes the cap of registrations per user; registrations
// over a lowered cap stay until unregistered.
func (b *Broker) SetMaxPerUID(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tab.maxPerUID = n
}

// Close stops listening, disconnects every client and peer, and waits
// for the broker's goroutines within ctx.
func (b *Broker) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	for _, l := range b.listeners {
		l.Close()
	}
	if b.devWatch != nil {
		b.devWatch.Close()
	}
	for k, p := range b.parked {
		p.timer.Stop()
		delete(b.parked, k)
	}
	for c := range b.clients {
		c.close()
	}
	for _, l := range b.links {
		l.shut()
	}
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sockets broker: %w", ctx.Err())
	}
}

// addListener keeps l for Close; it fails once the broker is closed.
func (b *Broker) addListener(l net.Listener) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		l.Close()
		return net.ErrClosed
	}
	b.listeners = append(b.listeners, l)
	return nil
}

// fromClient handles a message of a local process and what it passed
// with it (SCM_RIGHTS), which the caller closes after if fromClient did
// not. A REGISTER must pass exactly one descriptor, the connection's
// socket, which is closed as soon as it is checked; no descriptor,
// several or another file is refused like a socket that is not the
// connection's. An error disconnects the client (a message it must not
// send, or descriptors passed with another record).
func (b *Broker) fromClient(c *client, m message, p *passed) error {
	if err := m.check(sockwire.TypeRegister, sockwire.TypeUnregister, sockwire.TypeStats, sockwire.TypeList); err != nil {
		return err
	}
	t := m.tuple()
	switch m.rec.(type) {
	case sockwire.Register, sockwire.Stats:
	default:
		if p.nonEmpty() {
			return fmt.Errorf("%w: descriptors passed with %v", errMessage, m.rec.Type())
		}
	}
	switch rec := m.rec.(type) {
	case sockwire.Stats:
		b.addSegment(c, rec, p)
		return nil
	case sockwire.List:
		b.mu.Lock()
		c.listing = true // no DEVICE in the middle of its text
		b.mu.Unlock()
		return b.list(c)
	case sockwire.Register:
		reason := sockwire.Reason(0)
		ino, err := b.verify.Owner(p.sock(), t)
		n, truncated := len(p.fds), p.truncated
		p.close()
		if err != nil {
			if errors.Is(err, errNotOwner) {
				b.log.Debug("sockets: a registration refused", "pid", c.pid, "uid", c.uid,
					"fd", rec.FD, "passed", n, "truncated", truncated)
			} else {
				b.log.Warn("sockets: cannot check the owner of a connection", "pid", c.pid, "err", err)
			}
			reason = sockwire.ReasonDenied
		} else {
			b.mu.Lock()
			err = b.tab.register(c, t, ino)
			b.mu.Unlock()
			if err != nil {
				b.log.Debug("sockets: registration over the user's cap", "uid", c.uid, "pid", c.pid)
				reason = sockwire.ReasonLimit
			}
		}
		c.send(message{rec: sockwire.Result{Epoch: rec.Epoch, Tuple: t, Request: sockwire.TypeRegister, Reason: reason}})
		if reason == 0 {
			b.mu.Lock()
			b.unparkLocked(t)
			b.mu.Unlock()
		}
		return nil
	case sockwire.Unregister:
		reason := sockwire.ReasonDenied
		b.mu.Lock()
		if r := b.tab.owned(c, t); r != nil {
			b.tab.remove(r)
			reason = 0
		}
		b.mu.Unlock()
		c.send(message{rec: sockwire.Result{Epoch: rec.Epoch, Tuple: t, Request: sockwire.TypeUnregister, Reason: reason}})
		return nil
	}

	typ, epoch := m.rec.Type(), m.rec.RecordEpoch()
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.tab.owned(c, t)
	if r == nil {
		b.answer(item{from: c, t: t, typ: typ, epoch: epoch}, sockwire.ReasonDenied)
		return nil
	}
	switch rec := m.rec.(type) {
	case sockwire.Attach:
		if rec.Reply {
			b.m.attached()
		}
	case sockwire.Nack:
		b.m.refused(rec.Reason)
	case sockwire.Demote:
		b.m.demoted(rec.Reason)
	}
	if typ == sockwire.TypeAttachRep || typ == sockwire.TypeAttachNack {
		r.pending = 0
	}
	b.toPeerLocked(item{from: c, t: t, typ: typ, epoch: epoch, msg: m})
	return nil
}

// answer tells the client of it that its record was refused or could not
// reach the peer: an ATTACH_REQ gets ROUTE and ATTACH_NACK
// (counted as an attachment refused), anything else a RESULT.
func (b *Broker) answer(it item, reason sockwire.Reason) {
	if it.from == nil {
		return
	}
	switch it.typ {
	case sockwire.TypeAttachReq:
		b.m.refused(reason)
		it.from.send(routedMsg(it.t, sockwire.Nack{Epoch: it.epoch, Reason: reason}))
	default:
		it.from.send(message{rec: sockwire.Result{Epoch: it.epoch, Tuple: it.t, Request: it.typ, Reason: reason}})
	}
}

// fromPeer handles a message of the peer broker at src. An error closes
// the pairing connection.
func (b *Broker) fromPeer(src netip.Addr, m message) error {
	if err := m.checkPeer(); err != nil {
		return err
	}
	theirs := m.route.Tuple
	if local, _ := addrs(theirs); local != src.Unmap() {
		b.m.pairingError(pairAddress)
		b.log.Debug("sockets: a peer's record about a connection that is not with it", "peer", src)
		return nil
	}
	t := swap(theirs)
	typ, epoch := m.rec.Type(), m.rec.RecordEpoch()

	// Check the owner still holds the socket it registered, without the
	// lock; then deliver if the registration did not change meanwhile.
	b.mu.Lock()
	r := b.tab.lookup(t)
	var want uint64
	if r != nil {
		want = r.inode
	}
	b.mu.Unlock()
	alive := false
	if r != nil {
		ino, err := b.verify.Inode(t)
		alive = err == nil && ino == want
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if r != nil && b.tab.lookup(t) == r && r.inode == want {
		if alive {
			switch rec := m.rec.(type) {
			case sockwire.Attach:
				if rec.Reply {
					b.m.attached()
				}
			case sockwire.Nack:
				b.m.refused(rec.Reason)
			}
			if typ == sockwire.TypeAttachReq {
				r.pending = epoch
			}
			rec := m.rec
			if res, ok := rec.(sockwire.Result); ok {
				res.Tuple = r.tuple
				rec = res
			}
			r.owner.send(routedMsg(r.tuple, rec)) // the owner's own view
			return nil
		}
		b.tab.remove(r) // the socket is gone or another now
	}
	switch typ {
	case sockwire.TypeAttachReq:
		if b.parkLocked(t, epoch, m.rec) {
			return nil
		}
		b.m.refused(sockwire.ReasonNoOwner)
		b.toPeerLocked(item{t: t, msg: routedMsg(t, sockwire.Nack{Epoch: epoch, Reason: sockwire.ReasonNoOwner})})
	case sockwire.TypeAttachRep:
		// The process that asked is gone: it never switched, so the
		// acceptor can go back to TCP whatever it consumed.
		b.m.pairingError(pairNoOwner)
		b.toPeerLocked(item{t: t, msg: routedMsg(t, sockwire.Demote{Epoch: epoch, Reason: sockwire.ReasonNoOwner})})
	case sockwire.TypeDemote:
		// Nobody will answer: the sender resets at once rather than
		// wait for a DEMOTE that cannot come.
		b.m.pairingError(pairNoOwner)
		b.toPeerLocked(item{t: t, msg: routedMsg(t, sockwire.Result{Epoch: epoch, Tuple: t,
			Request: sockwire.TypeDemote, Reason: sockwire.ReasonNoOwner})})
	default:
		b.m.pairingError(pairNoOwner)
	}
	return nil
}

// parkFor is how long a peer's ATTACH_REQ waits for its connection's
// owner to register before it is refused (no_owner), and maxParked how
// many wait at once, all peers together (beyond: refused at once).
const (
	parkFor   = 2 * time.Second
	maxParked = 4096
)

// parked is a peer's ATTACH_REQ for a connection nobody here owns yet:
// the acceptor registers a connection a little after it accepted it (at
// its first read or write after the attach delay, or in a child forked
// after authentication, as sshd's), and the request goes to it as soon
// as it does, rather than the client asking again seconds later.
type parked struct {
	epoch uint32
	rec   sockwire.Record
	timer *time.Timer
}

// parkLocked keeps the peer's ATTACH_REQ about t (this host's view) for
// parkFor; false when the broker is closed or too many wait.
func (b *Broker) parkLocked(t sockwire.Tuple, epoch uint32, rec sockwire.Record) bool {
	k := key(t)
	if b.closed || (b.parked[k] == nil && len(b.parked) >= maxParked) {
		return false
	}
	if old := b.parked[k]; old != nil { // a request of another epoch: the older is answered
		old.timer.Stop()
		b.m.refused(sockwire.ReasonNoOwner)
		b.toPeerLocked(item{t: t, msg: routedMsg(t, sockwire.Nack{Epoch: old.epoch, Reason: sockwire.ReasonNoOwner})})
	}
	p := &parked{epoch: epoch, rec: rec}
	p.timer = time.AfterFunc(parkFor, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.parked[k] != p {
			return
		}
		delete(b.parked, k)
		b.m.refused(sockwire.ReasonNoOwner)
		b.toPeerLocked(item{t: t, msg: routedMsg(t, sockwire.Nack{Epoch: epoch, Reason: sockwire.ReasonNoOwner})})
	})
	b.parked[k] = p
	return true
}

// unparkLocked hands a parked ATTACH_REQ about t to the owner that just
// registered t.
func (b *Broker) unparkLocked(t sockwire.Tuple) {
	k := key(t)
	p := b.parked[k]
	if p == nil {
		return
	}
	p.timer.Stop()
	delete(b.parked, k)
	r := b.tab.lookup(t)
	if r == nil { // unregistered meanwhile: as if never registered
		b.m.refused(sockwire.ReasonNoOwner)
		b.toPeerLocked(item{t: t, msg: routedMsg(t, sockwire.Nack{Epoch: p.epoch, Reason: sockwire.ReasonNoOwner})})
		return
	}
	r.pending = p.epoch
	r.owner.send(routedMsg(r.tuple, p.rec))
}

// clientGone forgets a disconnected client: its registrations go, and an
// ATTACH_REQ handed to it and not answered is refused to the
// peer (no_owner) so that the peer does not wait.
func (b *Broker) clientGone(c *client) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.clients[c]; !ok {
		return
	}
	delete(b.clients, c)
	if b.uidClients[c.uid]--; b.uidClients[c.uid] <= 0 {
		delete(b.uidClients, c.uid)
	}
	b.dropSegmentLocked(c)
	for _, r := range b.tab.dropClient(c) {
		if r.pending != 0 && !b.closed {
			b.m.refused(sockwire.ReasonNoOwner)
			b.toPeerLocked(item{t: r.tuple, msg: routedMsg(r.tuple, sockwire.Nack{Epoch: r.pending, Reason: sockwire.ReasonNoOwner})})
		}
	}
}

// addClient admits a new client unless its user has MaxClientsPerUID.
func (b *Broker) addClient(c *client) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.uidClients[c.uid] >= MaxClientsPerUID {
		return false
	}
	b.clients[c] = struct{}{}
	b.uidClients[c.uid]++
	return true
}

// peerAddr is where the peer host at remote listens for pairing.
func (b *Broker) peerAddr(remote netip.Addr) string {
	if b.opts.PeerAddr != nil {
		return b.opts.PeerAddr(remote)
	}
	return net.JoinHostPort(remote.String(), strconv.Itoa(b.opts.PairingPort))
}
