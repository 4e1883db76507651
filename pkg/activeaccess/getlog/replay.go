package getlog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
)

// The replay protocol, over a stream connection to ServeReplay:
//
//	request  "AAGLREQ1" | from u64 | name length u16 | name
//	answer   "AAGLREP1" | status u8: 0 then count u64 and count records (record.go),
//	                                 1 then message length u16 and message
var (
	reqMagic = []byte("AAGLREQ1")
	repMagic = []byte("AAGLREP1")
)

const (
	maxName       = 255
	replayTimeout = time.Minute // a replay connection that stalls this long is dropped
)

// ServeReplay answers replay requests (Fetch, Recover) on ln, each
// connection in its own goroutine, until ctx ends, the Logger is closed or
// accepting fails. Each request gets the entries logged for its reader up
// to the moment it arrives; an answer stalled for a minute is dropped.
// ServeReplay owns ln: it closes ln when it returns, whatever the reason
// (answers in progress finish, or end with Close). It may be called for
// several listeners.
//
// It returns nil when Close ended it. If ctx is already done it returns
// ctx's error, wrapped, at once; if ctx ends while it serves, ctx's error.
// Other errors wrap ErrClosed (called after Close) or the accept error.
func (l *Logger) ServeReplay(ctx context.Context, ln net.Listener) error {
	if err := ctx.Err(); err != nil {
		ln.Close()
		return fmt.Errorf("getlog: serve replay: %w", err)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		ln.Close()
		return fmt.Errorf("getlog: serve replay: %w", ErrClosed)
	}
	l.lns[ln] = struct{}{}
	l.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer func() {
		stop()
		ln.Close()
		l.mu.Lock()
		delete(l.lns, ln)
		l.mu.Unlock()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-l.stop:
				return nil
			default:
			}
			if ctx.Err() != nil {
				return fmt.Errorf("getlog: serve replay: %w", ctx.Err())
			}
			return fmt.Errorf("getlog: serve replay: %w", err)
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return nil
		}
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go func() {
			defer l.wg.Done()
			l.serveConn(c)
			l.mu.Lock()
			delete(l.conns, c)
			l.mu.Unlock()
			c.Close()
		}()
	}
}

// serveConn answers one request; a malformed one gets an error answer.
func (l *Logger) serveConn(c net.Conn) {
	c.SetDeadline(time.Now().Add(replayTimeout))
	name, from, err := readRequest(bufio.NewReader(c))
	var es []Entry
	if err == nil {
		es, err = l.Entries(name, from)
	}
	w := bufio.NewWriter(c)
	w.Write(repMagic)
	if err != nil {
		msg := err.Error()
		if len(msg) > 1000 {
			msg = msg[:1000]
		}
		w.WriteByte(1)
		binary.Write(w, binary.LittleEndian, uint16(len(msg)))
		w.WriteString(msg)
		w.Flush()
		return
	}
	w.WriteByte(0)
	binary.Write(w, binary.LittleEndian, uint64(len(es)))
	var b []byte
	for _, e := range es {
		b = appendRecord(b[:0], e)
		if _, err := w.Write(b); err != nil {
			return
		}
	}
	w.Flush()
}

func readRequest(r io.Reader) (name string, from uint64, err error) {
	var h [8 + 8 + 2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return "", 0, fmt.Errorf("%w: replay request: %w", ErrInvalid, unexpected(err))
	}
	if !bytes.Equal(h[:8], reqMagic) {
		return "", 0, fmt.Errorf("%w: not a replay request", ErrInvalid)
	}
	from = binary.LittleEndian.Uint64(h[8:])
	n := binary.LittleEndian.Uint16(h[16:])
	if n > maxName {
		return "", 0, fmt.Errorf("%w: reader name of %d bytes", ErrInvalid, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", 0, fmt.Errorf("%w: replay request: %w", ErrInvalid, unexpected(err))
	}
	return string(b), from, nil
}

// Fetch asks the Logger serving replays at addr (host:port, over TCP;
// Logger.ServeReplay) for reader name's entries from number from (1: all).
// Recover is Fetch after a Flush; Fetch alone suits a reader that knows
// its last gets were handled, or a tool that inspects a log.
//
// If ctx is already done, Fetch returns ctx's error, wrapped, and does not
// connect; if ctx ends while it waits, ctx's error. Other errors wrap
// ErrInvalid (a name over 255 bytes, or the Logger refused the request:
// its reason is in the message), ErrCorrupt (a damaged or truncated
// answer, also when the Logger closed the connection early), or the
// network's.
func Fetch(ctx context.Context, addr, name string, from uint64) ([]Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("getlog: fetch: %w", err)
	}
	if len(name) > maxName {
		return nil, fmt.Errorf("%w: reader name of %d bytes", ErrInvalid, len(name))
	}
	if from == 0 {
		from = 1
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fetchErr(ctx, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	req := append([]byte(nil), reqMagic...)
	req = binary.LittleEndian.AppendUint64(req, from)
	req = binary.LittleEndian.AppendUint16(req, uint16(len(name)))
	if _, err := c.Write(append(req, name...)); err != nil {
		return nil, fetchErr(ctx, err)
	}
	es, err := readAnswer(bufio.NewReader(c), from)
	if err != nil {
		return nil, fetchErr(ctx, err)
	}
	return es, nil
}

func fetchErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("getlog: fetch: %w", ctx.Err())
	}
	return fmt.Errorf("getlog: fetch: %w", err)
}

func readAnswer(r io.Reader, from uint64) ([]Entry, error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("%w: answer: %w", ErrCorrupt, unexpected(err))
	}
	if !bytes.Equal(h[:8], repMagic) {
		return nil, fmt.Errorf("%w: not a replay answer", ErrCorrupt)
	}
	switch h[8] {
	case 0:
	case 1:
		var n uint16
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
			return nil, fmt.Errorf("%w: answer: %w", ErrCorrupt, unexpected(err))
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(r, msg); err != nil {
			return nil, fmt.Errorf("%w: answer: %w", ErrCorrupt, unexpected(err))
		}
		return nil, fmt.Errorf("%w: the logger refused: %s", ErrInvalid, msg)
	default:
		return nil, fmt.Errorf("%w: answer status %d", ErrCorrupt, h[8])
	}
	var count uint64
	if err := binary.Read(r, binary.LittleEndian, &count); err != nil {
		return nil, fmt.Errorf("%w: answer: %w", ErrCorrupt, unexpected(err))
	}
	es, err := readRecords(r, from, count)
	if err == nil && uint64(len(es)) != count {
		err = fmt.Errorf("%w: answer announced %d entries, held %d", ErrCorrupt, count, len(es))
	}
	if err != nil {
		return nil, err
	}
	return es, nil
}

// Recover is what a restarted reader does before it re-executes its work:
// src is its new connection to the target (Dial'ed with the same
// SourceOptions.Name, name), whose Flush makes the target's handler process
// every get logged so far (including the crashed process's last ones);
// then the log is fetched from the Logger's replay listener at addr.
//
// If ctx is already done, Recover returns ctx's error, wrapped, and
// neither flushes nor connects. Other errors wrap ErrInvalid (a nil src),
// or are those of Source.Flush (wrapped in "getlog: recover:") and Fetch.
func Recover(ctx context.Context, src *activeaccess.Source, addr, name string) (*Replayer, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("getlog: recover: %w", err)
	}
	if src == nil {
		return nil, fmt.Errorf("getlog: recover: %w: nil source", ErrInvalid)
	}
	if err := src.Flush(ctx); err != nil {
		return nil, fmt.Errorf("getlog: recover: %w", err)
	}
	es, err := Fetch(ctx, addr, name, 1)
	if err != nil {
		return nil, err
	}
	return NewReplayer(es), nil
}

// Replayer hands a re-executing reader the bytes of its logged gets, in
// the order it made them. Not safe for concurrent use.
type Replayer struct {
	es      []Entry
	next    int
	lastOff int // the range of the last Get
	lastEnd int
	skipped int
}

// NewReplayer replays entries (as Fetch or Logger.Entries return them).
// It cannot fail; entries that are not a reader's gets make Get return
// ErrDiverged.
func NewReplayer(entries []Entry) *Replayer { return &Replayer{es: entries, lastOff: -1, lastEnd: -1} }

// Get fills dst with the bytes the reader got when it read len(dst) bytes
// at offset off, taking the next entries of the log: they must cover
// exactly [off, off+len(dst)) in order. An entry lying inside the previous
// Get's range that does not start this one is a retransmitted READ served
// twice and is skipped. Errors: io.EOF when the log is exhausted (the
// reader has caught up and goes on live), ErrDiverged when the log's next
// entries are not this get (dst is then unchanged and the replay
// position too), ErrInvalid for an empty dst.
func (r *Replayer) Get(off int, dst []byte) error {
	if len(dst) == 0 || off < 0 {
		return fmt.Errorf("%w: get of %d bytes at %d", ErrInvalid, len(dst), off)
	}
	i, skipped := r.next, 0
	for i < len(r.es) && r.es[i].Offset != off && r.es[i].Offset >= r.lastOff && r.es[i].Offset+len(r.es[i].Data) <= r.lastEnd {
		i++
		skipped++
	}
	if i == len(r.es) {
		return io.EOF
	}
	start, pos := i, off
	for pos < off+len(dst) {
		if i == len(r.es) {
			return fmt.Errorf("%w: the log ends at offset %d inside the get [%d, +%d)", ErrDiverged, pos, off, len(dst))
		}
		e := r.es[i]
		if e.Offset != pos || pos+len(e.Data) > off+len(dst) {
			return fmt.Errorf("%w: entry %d is [%d, +%d), the get [%d, +%d) needs offset %d next", ErrDiverged, e.Seq, e.Offset, len(e.Data), off, len(dst), pos)
		}
		pos += len(e.Data)
		i++
	}
	for _, e := range r.es[start:i] {
		copy(dst[e.Offset-off:], e.Data)
	}
	r.next, r.lastOff, r.lastEnd = i, off, off+len(dst)
	r.skipped += skipped
	return nil
}

// Remaining returns how many entries are not replayed yet. It cannot
// fail.
func (r *Replayer) Remaining() int { return len(r.es) - r.next }

// Skipped returns how many repeated entries (retransmitted READs) Get
// skipped. It cannot fail.
func (r *Replayer) Skipped() int { return r.skipped }
