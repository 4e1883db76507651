package dht

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// server is the target side of the RMA and AM tables: the volume in
// registered memory, and an rdma_cm listener that accepts sources of one
// kind; the kind's hooks build and drop each connection's QP.
type server struct {
	kind    byte
	l       *verbs.CMID
	pd      *verbs.PD
	mr      *verbs.MR
	v       *Volume
	ctx     context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup
	prepare func(vc *verbs.Context) error // before the first source is accepted (nil: nothing)
	setup   func(c *sconn) error          // creates c.qp (on c.id)
	drop    func(c *sconn)                // after the QP is gone

	mu     sync.Mutex
	closed bool
	conns  map[*sconn]struct{}
	errs   []error
}

// acceptTimeout bounds a source's connection set-up at the target; a
// source that does not complete it in time is dropped, and Err reports
// errAcceptTimeout (never context.DeadlineExceeded: no caller's context
// ended).
const acceptTimeout = 30 * time.Second

var errAcceptTimeout = fmt.Errorf("%w: the source did not complete its connection within %v", ErrDisconnected, acceptTimeout)

// sconn is one accepted source.
type sconn struct {
	s    *server
	id   *verbs.CMID
	qp   *verbs.QP
	once sync.Once
	rcq  *verbs.CQ // the connection's CQ (RMA)
	am   *amConn   // the AM table's state
}

func listenServer(addr netip.AddrPort, kind byte, l Layout, s *server) error {
	if err := l.Check(); err != nil {
		return err
	}
	if !addr.Addr().IsValid() || addr.Addr().IsUnspecified() || addr.Port() == 0 {
		return fmt.Errorf("%w: listen address %v: need a specific IP address and port", ErrInvalid, addr)
	}
	s.kind, s.conns = kind, map[*sconn]struct{}{}
	var err error
	if s.l, err = verbs.NewCMID(verbs.PSTCP); err != nil {
		return fmt.Errorf("dht: listen: %w", err)
	}
	fail := func(err error) error {
		s.release()
		return err
	}
	if err := s.l.Listen(addr, 16); err != nil {
		return fail(fmt.Errorf("dht: listen on %v: %w", addr, err))
	}
	vc, err := s.l.Context()
	if err != nil {
		return fail(fmt.Errorf("dht: %v is not an RDMA device's address: %w", addr.Addr(), err))
	}
	if s.pd, err = vc.AllocPD(); err != nil {
		return fail(fmt.Errorf("dht: %w", err))
	}
	if s.mr, err = s.pd.AllocMR(l.Size(), verbs.AccessAll); err != nil {
		return fail(fmt.Errorf("dht: volume memory: %w", err))
	}
	s.v = newVolume(l, s.mr.Bytes())
	if s.prepare != nil {
		if err := s.prepare(vc); err != nil {
			return fail(fmt.Errorf("dht: %w", err))
		}
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.acceptLoop()
	return nil
}

func (s *server) release() {
	if s.l != nil {
		s.l.Close()
	}
	if s.pd != nil {
		s.pd.Close()
	}
}

func (s *server) recordErr(err error) {
	s.mu.Lock()
	if len(s.errs) < 16 {
		s.errs = append(s.errs, err)
	}
	s.mu.Unlock()
}

// err joins the errors recorded while serving.
func (s *server) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

func (s *server) acceptLoop() {
	defer s.wg.Done()
	for {
		id, ev, err := s.l.GetRequest(s.ctx)
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, verbs.ErrClosed) {
				return
			}
			s.recordErr(fmt.Errorf("dht: waiting for sources: %w", err))
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.admit(id, ev)
		}()
	}
}

func (s *server) admit(id *verbs.CMID, ev verbs.CMEvent) {
	if k, ok := parseHello(ev.PrivateData); !ok || k != s.kind {
		id.Reject(nil)
		id.Close()
		return
	}
	c := &sconn{s: s, id: id}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		id.Reject(nil)
		id.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	if err := s.setup(c); err != nil {
		s.recordErr(fmt.Errorf("dht: setting a source up: %w", err))
		id.Reject(nil)
		c.teardown()
		return
	}
	rem := remoteMem{Addr: s.mr.Addr(), RKey: s.mr.RKey(), Len: uint32(s.mr.Len())}
	actx, cancel := context.WithTimeoutCause(s.ctx, acceptTimeout, errAcceptTimeout)
	err := id.Accept(actx, &verbs.ConnParam{PrivateData: rem.marshal(), ResponderResources: 16, InitiatorDepth: 16})
	if err != nil && context.Cause(actx) == errAcceptTimeout {
		err = errAcceptTimeout // this package's limit, not a caller's deadline
	}
	cancel()
	if err != nil {
		s.recordErr(fmt.Errorf("dht: accepting a source: %w", err))
		c.teardown()
		return
	}
	for {
		ev, err := id.WaitEvent(s.ctx)
		switch {
		case err != nil && s.ctx.Err() == nil:
			s.recordErr(fmt.Errorf("dht: watching a source's connection (dropped): %w", err))
		case err == nil && ev.Type == verbs.CMDeviceRemoval:
			s.recordErr(fmt.Errorf("dht: a source's connection dropped: %v", ev.Type))
		case err == nil && ev.Type != verbs.CMDisconnected:
			continue // nothing else ends a connection
		}
		c.teardown()
		return
	}
}

// teardown forgets the connection and frees its verbs objects.
func (c *sconn) teardown() {
	c.once.Do(func() {
		s := c.s
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		if c.qp != nil {
			c.qp.ToError()
		}
		if s.drop != nil {
			s.drop(c) // the kind's state, then the QP with the CMID
		}
		c.id.Close()
	})
}

// close stops accepting, disconnects every source (closing a connected
// identifier sends the disconnect request) and frees everything. The
// volume's memory is gone afterwards.
func (s *server) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.stop()    // every connection's watcher tears it down
	s.l.Close() // wakes the accept loop
	s.wg.Wait()
	s.release()
}
