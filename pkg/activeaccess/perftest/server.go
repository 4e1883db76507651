package perftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Errors a session ends with, besides the connection's, the context's and
// the target's (test with errors.Is).
var (
	// ErrProtocol: the client sent something perftest's side channel does
	// not (a malformed queue-pair description, a description that changes
	// a queue pair already connected, more than MaxQPs queue pairs, a
	// message too long, data after the closing handshake).
	ErrProtocol = errors.New("perftest: protocol error")
	// ErrClientLeft: the client closed the connection before the closing
	// handshake: it failed (perftest exits on a completion error, such as
	// a write the target's module refused) or was killed.
	ErrClientLeft = errors.New("perftest: the client left before the closing handshake")
)

// MaxQPs bounds the queue pairs one client may connect (perftest's -q); a
// client that describes more ends its session with ErrProtocol.
const MaxQPs = 256

// Options tune Serve and ServeConn. A nil *Options, like the zero value,
// means offset 0 and the standard logger.
type Options struct {
	// Offset is where in the target's memory the clients' accesses go:
	// every client queue pair is given the address Region().Addr+Offset.
	// A client moving size bytes per message accesses
	// [Offset, Offset+max(size, cycle)), where cycle is its cycle buffer
	// (its page size: 4 KiB on x86-64; smaller messages step through it
	// by size rounded up to the cache line). Beyond the memory its
	// accesses fail with a remote access error. Negative, or beyond the
	// memory: ServeConn fails with activeaccess.ErrInvalid.
	Offset int
	// ErrorLog receives Serve's per-client errors; nil means the log
	// package's standard logger.
	ErrorLog *log.Logger
}

// maxMsg bounds a side-channel message; perftest's largest is 108 bytes.
const maxMsg = 512

// Serve answers perftest clients that connect to ln, each in its own
// goroutine (ServeConn), until ctx ends; it then closes ln, ends the
// sessions (their queue pairs are closed) and returns ctx's error,
// wrapped. If ctx is already done, it closes ln and returns ctx's error
// at once. If accepting fails otherwise (ln closed by the caller, no file
// descriptors left), it ends the sessions the same way and returns that
// error. A client's error ends only that client's session and goes to
// opts.ErrorLog. opts may be nil (see Options). Errors wrap ctx's error,
// activeaccess.ErrInvalid (a nil target), or the accept error.
func Serve(ctx context.Context, ln net.Listener, t *activeaccess.Target, opts *Options) error {
	if err := ctx.Err(); err != nil {
		ln.Close()
		return fmt.Errorf("perftest: serve: %w", err)
	}
	if t == nil {
		return fmt.Errorf("perftest: serve: %w: nil target", activeaccess.ErrInvalid)
	}
	var c Options
	if opts != nil {
		c = *opts
	}
	logger := c.ErrorLog
	if logger == nil {
		logger = log.Default()
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx) // ends the sessions before wg.Wait
	defer cancel()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("perftest: serve: %w", ctx.Err())
			}
			return fmt.Errorf("perftest: serve: accepting clients: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			if err := ServeConn(ctx, conn, t, &c); err != nil && ctx.Err() == nil {
				logger.Printf("perftest client %v: %v", conn.RemoteAddr(), err)
			}
		}()
	}
}

// ServeConn runs one perftest client's session on conn: it answers the
// side channel, connects each queue pair the client describes to a
// PlainQP of t, and returns nil once the client completed the closing
// handshake, after closing those queue pairs (conn is left open). A
// client that says nothing keeps it waiting until ctx ends, as a perftest
// server would wait. opts may be nil (see Options).
//
// If ctx is already done, ServeConn returns ctx's error, wrapped, without
// reading from conn; if ctx ends during the session, it returns ctx's
// error (the queue pairs are closed). Other errors: ErrClientLeft (the
// client exited early: it failed or was killed); ErrProtocol; the
// connection's error; activeaccess.ErrInvalid (a nil or library-mediated
// target, whose handlers see only its Sources' messages, or an offset
// outside the memory), activeaccess.ErrClosed (the target was closed), or
// another error of Target.ConnectPlain.
func ServeConn(ctx context.Context, conn net.Conn, t *activeaccess.Target, opts *Options) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("perftest: serve conn: %w", err)
	}
	if t == nil {
		return fmt.Errorf("perftest: serve conn: %w: nil target", activeaccess.ErrInvalid)
	}
	var c Options
	if opts != nil {
		c = *opts
	}
	mtu, err := t.PathMTU()
	if err != nil {
		return fmt.Errorf("perftest: %w", err)
	}
	if t.Mode() != activeaccess.ModeTransparent {
		return fmt.Errorf("perftest: %w: plain sources need a transparent target", activeaccess.ErrInvalid)
	}
	if size := len(t.Memory()); c.Offset < 0 || c.Offset >= size {
		return fmt.Errorf("perftest: %w: offset %d outside the target's %d bytes", activeaccess.ErrInvalid, c.Offset, size)
	}
	reg := t.Region()
	s := &session{conn: conn, portMTU: mtu, rkey: reg.RKey, vaddr: reg.Addr + uint64(c.Offset),
		connect: func(remote verbs.QPInfo, outReads int, mtu verbs.MTU) (verbs.QPInfo, int, io.Closer, error) {
			p, err := t.ConnectPlain(remote, &activeaccess.PlainOptions{MaxRdAtomic: outReads, PathMTU: mtu})
			if err != nil {
				return verbs.QPInfo{}, 0, nil, err
			}
			return p.Info(), p.MaxRdAtomic(), p, nil
		}}
	return s.run(ctx)
}

// session is one client's side channel; connect is Target.ConnectPlain.
type session struct {
	conn    net.Conn
	portMTU verbs.MTU
	rkey    uint32
	vaddr   uint64
	connect func(remote verbs.QPInfo, outReads int, mtu verbs.MTU) (local verbs.QPInfo, rd int, qp io.Closer, err error)

	mtu     verbs.MTU         // negotiated; 0 until the MTU message
	qps     map[uint32]qpDesc // by the client's QPN
	reports bool              // the client sent its reports: the next description closes
	done    bool              // "done" sent
}

type qpDesc struct {
	client dest // as first described
	reply  []byte
	qp     io.Closer
}

func (s *session) run(ctx context.Context) (err error) {
	s.qps = map[uint32]qpDesc{}
	defer func() {
		for _, q := range s.qps {
			if e := q.qp.Close(); e != nil && err == nil {
				err = fmt.Errorf("perftest: closing a queue pair: %w", e)
			}
		}
	}()
	stop := context.AfterFunc(ctx, func() { s.conn.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, maxMsg)
	for {
		n, err := s.conn.Read(buf)
		if err == nil {
			n, err = s.complete(buf, n)
		}
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return fmt.Errorf("perftest: session: %w", ctx.Err())
			case s.done && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
				// The client may close before its "done" is read:
				// perftest leaves our "done" unread, so its close can
				// reset the connection.
				return nil
			case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
				return ErrClientLeft
			}
			return fmt.Errorf("perftest: reading from the client: %w", err)
		}
		if n == len(buf) {
			return fmt.Errorf("%w: a message of more than %d bytes", ErrProtocol, len(buf)-1)
		}
		m := buf[:n]
		if s.done {
			if bytes.Equal(m, doneMsg) {
				return nil
			}
			return fmt.Errorf("%w: %q after the closing handshake", ErrProtocol, m)
		}
		reply, err := s.answer(m)
		if err != nil {
			return err
		}
		if _, err := s.conn.Write(reply); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("perftest: session: %w", ctx.Err())
			}
			return fmt.Errorf("perftest: writing to the client: %w", err)
		}
	}
}

// complete reads the rest of a message that arrived in pieces, where its
// size is known from its start: a queue-pair description (keyMsgSize) or
// a report (8 bytes). perftest writes each message with one write(2), so
// this only matters if TCP splits one.
func (s *session) complete(buf []byte, n int) (int, error) {
	want := n
	switch {
	case looksLikeKey(buf[:n]) && n < keyMsgSize:
		want = keyMsgSize
	case !s.done && len(s.qps) > 0 && n < 8 && !looksLikeKey(buf[:n]):
		want = 8
	}
	if want == n {
		return n, nil
	}
	m, err := io.ReadFull(s.conn, buf[n:want])
	return n + m, err
}

// answer returns the reply to the client's message m.
func (s *session) answer(m []byte) ([]byte, error) {
	switch {
	case looksLikeKey(m):
		d, err := parseDest(m)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		q, ok := s.qps[d.QPN]
		switch {
		case ok && (q.client.PSN != d.PSN || q.client.GID != d.GID || q.client.RKey != d.RKey || q.client.VAddr != d.VAddr):
			return nil, fmt.Errorf("%w: client QP %#x described again differently", ErrProtocol, d.QPN)
		case !ok && len(s.qps) == MaxQPs:
			return nil, fmt.Errorf("%w: more than %d queue pairs", ErrProtocol, MaxQPs)
		case !ok:
			if q, err = s.connectQP(d); err != nil {
				return nil, err
			}
		}
		if !s.reports {
			return q.reply, nil
		}
		s.done = true
		return append(append([]byte(nil), q.reply...), doneMsg...), nil
	case len(s.qps) == 0 && s.mtu == 0:
		if mtu, ok := parseMTU(m); ok {
			s.mtu = min(mtu, s.portMTU)
			r := make([]byte, len(m))
			r[0] = '0' + byte(s.mtu)
			return r, nil
		}
	case len(s.qps) > 0 && len(m) == 8:
		s.reports = true // echoed: the client takes our report for its own
	}
	return m, nil
}

// connectQP connects a target queue pair to the client's d and formats
// the description the client gets back.
func (s *session) connectQP(d dest) (qpDesc, error) {
	mtu := s.mtu
	if mtu == 0 {
		mtu = s.portMTU
	}
	local, rd, qp, err := s.connect(verbs.QPInfo{QPN: d.QPN, PSN: d.PSN, LID: d.LID, GID: d.GID}, min(max(d.OutReads, 1), 255), mtu)
	if err != nil {
		return qpDesc{}, fmt.Errorf("perftest: connecting client QP %#x: %w", d.QPN, err)
	}
	q := qpDesc{client: d, qp: qp, reply: dest{LID: local.LID, OutReads: rd, QPN: local.QPN, PSN: local.PSN,
		RKey: s.rkey, VAddr: s.vaddr, GID: local.GID}.marshal()}
	s.qps[d.QPN] = q
	return q, nil
}
