package activeaccess

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Source-side sizes.
const (
	sRecvSlots    = 32 // status message buffers (plus Depth for get answers)
	sMarkerSlots  = 16 // marker buffers (at most the window the target grants)
	markerSlotLen = 64
	maxInline     = 256 // small accesses and markers are sent inline
	wrOp          = 0
	wrMarker      = 1 << 62
	wrStatus      = 1 << 61
	wrProbe       = 1 << 60
)

// DefaultKeepAlive is SourceOptions.KeepAlive's default.
const DefaultKeepAlive = time.Second

// SourceOptions tune Dial. A nil *SourceOptions, like the zero value,
// means every default: no name, 1 MiB of staging memory, 64 operations
// in flight, DefaultKeepAlive, rdma_cm's ACK timeout. Values out of range
// make Dial fail with ErrInvalid.
type SourceOptions struct {
	// Name identifies the source to the target's handlers (Peer.Name);
	// at most 40 bytes.
	Name string
	// Staging is the bytes of registered memory the source copies Put
	// data into and receives Get data in, rounded up to whole pages; one
	// access is at most this large (in ModeMediated, 64 bytes less for
	// its header). 0 means 1 MiB.
	Staging int
	// Depth is how many operations may be in flight, 1 to 4096; 0 means
	// 64.
	Depth int
	// KeepAlive is how long a Flush, a Reply or a wait for credits goes
	// without any completion before the source probes the target with a
	// zero-length RDMA WRITE, which the target's NIC acknowledges without
	// its software. A target whose host vanished without disconnecting
	// fails the probe once the transport gives up resending it (see
	// AckTimeout), and the wait fails with ErrDisconnected instead of
	// lasting until its context ends. 0 means DefaultKeepAlive;
	// negative: no probes.
	KeepAlive time.Duration
	// AckTimeout is how long the connection waits for an acknowledgement
	// before it resends (verbs.CMID.SetAckTimeout); a target that stopped
	// answering is declared gone after about 7 times this (the retry
	// count is verbs.DefaultRetryCount). 0 keeps rdma_cm's default:
	// 2.1 s on RoCE, so about 15 s. Negative is ErrInvalid.
	AckTimeout time.Duration
}

// Source is a connection from this process to one Target, through which
// it issues active and plain puts and gets. Create it with Dial. A Source
// is safe for concurrent use; operations are issued in the order their
// calls acquire the connection.
type Source struct {
	cfg    SourceOptions
	id     *verbs.CMID
	pd     *verbs.PD
	ch     *verbs.CompChannel
	cq     *verbs.CQ
	qp     *verbs.QP
	mr     *verbs.MR // status buffers, marker buffers, staging
	g      grant
	mtu    int
	window int
	stBase int // offset of the staging area in mr
	nrecv  int // receive buffers

	cmStop context.CancelFunc
	loops  sync.WaitGroup

	mu         sync.Mutex
	changed    chan struct{}
	closed     atomic.Bool // set under mu
	released   bool        // the verbs objects are gone
	broken     error
	sqFree     int // send queue slots neither queued nor in flight
	sq         sendQueue
	st         *staging
	led        *ledger
	seq        uint64         // last operation issued
	answers    map[uint64]*Op // ModeMediated gets waiting for their answer
	doneSet    map[uint64]bool
	doneThru   uint64 // every operation up to this one completed
	lastActive uint64 // last active operation issued
	lastPlain  uint64
	replies    []Reply
	processed  uint64
	probing    bool // a keep-alive probe is in flight
	stats      SourceStats
	// ModeMediated: the inbox at the target, allocated like staging
	// memory; its spans are freed when their epoch is acknowledged.
	ib       *staging
	ibOpen   []int
	ibEpochs map[uint64][]int
}

// SourceStats count what a Source did.
type SourceStats struct {
	Active      uint64 // active puts and gets issued
	Plain       uint64 // plain puts and gets issued
	CreditWaits uint64 // active accesses that had to wait for credits
	Markers     uint64 // markers sent (credit returns and flushes)
	Acked       uint64 // markers the target acknowledged
	Replies     uint64 // replies received
	Probes      uint64 // keep-alive probes sent (SourceOptions.KeepAlive)
	// Posts counts chains posted (one ibv_post_send, one system call on
	// rxe, each); Signaled and Unsignaled the work requests posted with
	// and without a completion requested.
	Posts, Signaled, Unsignaled uint64
}

// Stats returns the source's counters. It cannot fail, and keeps
// answering after Close.
func (s *Source) Stats() SourceStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Acked = s.led.acked
	st.Posts, st.Signaled, st.Unsignaled = s.sq.posts, s.sq.signaled, s.sq.unsignaled
	return st
}

// Dial connects to the target listening at addr. The target's memory
// description, its mode and this source's credits arrive in the accept's
// private data; the application exchanges no keys. opts may be nil (see
// SourceOptions). ctx bounds the connection set-up only: once Dial
// returned, the Source lives until Close, whatever becomes of ctx.
//
// Errors: ctx's error, wrapped (at once when ctx is already done, before
// anything is set up; or when ctx ends during the set-up), a
// *RejectError (errors.Is ErrRejected) when the target refuses,
// ErrProtocol when the peer is not a compatible target, ErrInvalid for a
// bad address or option, or the verbs error of the failing step (address
// or route resolution, connect: an address nobody listens on is a
// *RejectError with Reason 0).
func Dial(ctx context.Context, addr netip.AddrPort, opts *SourceOptions) (*Source, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("activeaccess: dial %v: %w", addr, err)
	}
	var c SourceOptions
	if opts != nil {
		c = *opts
	}
	if c.Staging == 0 {
		c.Staging = 1 << 20
	}
	if c.Depth == 0 {
		c.Depth = 64
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = DefaultKeepAlive
	}
	switch {
	case len(c.Name) > nameLen:
		return nil, fmt.Errorf("%w: source name of %d bytes (at most %d)", ErrInvalid, len(c.Name), nameLen)
	case c.Staging < 0 || c.Depth < 1 || c.Depth > 4096:
		return nil, fmt.Errorf("%w: staging %d, depth %d", ErrInvalid, c.Staging, c.Depth)
	case c.AckTimeout < 0:
		return nil, fmt.Errorf("%w: ACK timeout %v", ErrInvalid, c.AckTimeout)
	case !addr.IsValid():
		return nil, fmt.Errorf("%w: target address %v", ErrInvalid, addr)
	}
	c.Staging = (c.Staging + pageSize - 1) &^ (pageSize - 1)
	s := &Source{cfg: c, changed: make(chan struct{}), answers: map[uint64]*Op{}, doneSet: map[uint64]bool{}}
	if err := s.dial(ctx, addr); err != nil {
		s.release()
		return nil, err
	}
	cmCtx, stop := context.WithCancel(context.Background())
	s.cmStop = stop
	s.loops.Add(2)
	go s.cqLoop()
	go s.cmLoop(cmCtx)
	return s, nil
}

func (s *Source) dial(ctx context.Context, addr netip.AddrPort) error {
	var err error
	if s.id, err = verbs.NewCMID(verbs.PSTCP); err != nil {
		return fmt.Errorf("activeaccess: dial: %w", err)
	}
	if s.cfg.AckTimeout > 0 {
		if err := s.id.SetAckTimeout(s.cfg.AckTimeout); err != nil {
			return fmt.Errorf("activeaccess: dial: %w", err)
		}
	}
	if err := s.id.ResolveAddr(ctx, netip.AddrPort{}, addr); err != nil {
		return fmt.Errorf("activeaccess: dial %v: %w", addr, err)
	}
	if err := s.id.ResolveRoute(ctx); err != nil {
		return fmt.Errorf("activeaccess: dial %v: %w", addr, err)
	}
	vc, err := s.id.Context()
	if err != nil {
		return fmt.Errorf("activeaccess: dial %v: %w", addr, err)
	}
	if s.pd, err = vc.AllocPD(); err != nil {
		return fmt.Errorf("activeaccess: dial: %w", err)
	}
	if s.ch, err = vc.NewCompChannel(); err != nil {
		return fmt.Errorf("activeaccess: dial: %w", err)
	}
	depth := s.cfg.Depth + sMarkerSlots
	s.nrecv = sRecvSlots + s.cfg.Depth
	if s.cq, err = vc.NewCQ(depth+s.nrecv, &verbs.CQOptions{Channel: s.ch}); err != nil {
		return fmt.Errorf("activeaccess: dial: %w", err)
	}
	if s.qp, err = s.id.NewQP(s.pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: s.nrecv, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: maxInline}}); err != nil {
		return fmt.Errorf("activeaccess: dial: %w", err)
	}
	s.stBase = s.nrecv*msgSize + sMarkerSlots*markerSlotLen
	// Remote write: a mediated target writes get answers into staging.
	if s.mr, err = s.pd.AllocMR(s.stBase+s.cfg.Staging, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return fmt.Errorf("activeaccess: dial: staging memory: %w", err)
	}
	for i := 0; i < s.nrecv; i++ {
		if err := s.postRecv(i); err != nil {
			return fmt.Errorf("activeaccess: dial: %w", err)
		}
	}
	h := hello{Version: protoVersion, Modes: 1<<ModeTransparent | 1<<ModeMediated, Name: s.cfg.Name, QPN: s.qp.QPN()}
	err = s.id.Connect(ctx, &verbs.ConnParam{PrivateData: h.marshal(), ResponderResources: rdDepth, InitiatorDepth: rdDepth})
	var rej *verbs.RejectError
	if errors.As(err, &rej) {
		return &RejectError{Reason: parseRefusal(rej.PrivateData), Status: rej.Status}
	}
	if err != nil {
		return fmt.Errorf("activeaccess: connect to %v: %w", addr, err)
	}
	if s.g, err = parseGrant(s.id.AcceptData()); err != nil {
		return err
	}
	a, err := s.qp.Query()
	if err != nil {
		return fmt.Errorf("activeaccess: dial: %w", err)
	}
	s.mtu = a.PathMTU.Bytes()
	if s.mtu == 0 {
		s.mtu = 256 // the smallest: the most entries, an upper bound
	}
	s.window = min(int(s.g.Window), sMarkerSlots)
	s.sqFree = s.cfg.Depth
	// A completion every quarter of the queue (at most every 32 requests)
	// frees slots while the rest is in flight.
	s.sq = newSendQueue(depth, min(32, s.cfg.Depth/4))
	s.st = newStaging(s.cfg.Staging)
	s.led = newLedger(int64(s.g.Credits))
	if s.g.Mode == ModeMediated {
		s.ib = newStaging(int(s.g.Credits))
		s.ibEpochs = map[uint64][]int{}
	}
	return nil
}

func (s *Source) postRecv(i int) error {
	return s.qp.PostRecv(verbs.RecvWR{ID: wrStatus | uint64(i), SGL: []verbs.SGE{s.mr.SGE(i*msgSize, msgSize)}})
}

// release closes what dial built (after a failed Dial, or in Close).
func (s *Source) release() {
	if s.id != nil {
		s.id.Close() // and the QP
	}
	if s.ch != nil {
		s.ch.Close() // and the CQ
	}
	if s.pd != nil {
		s.pd.Close() // and the MR
	}
}

// ID returns the id the target gave this source (Peer.ID in its
// handlers). Like Size, Mode and Grant it describes the connection as
// Dial set it up, cannot fail, and keeps its value after Close.
func (s *Source) ID() uint32 { return s.g.SourceID }

// Size returns the bytes of the target's memory (whole pages).
func (s *Source) Size() int { return int(s.g.Len) }

// Mode returns the mode the target chose.
func (s *Source) Mode() Mode { return s.g.Mode }

// Grant returns the credits the target granted: log bytes in
// ModeTransparent, inbox bytes in ModeMediated.
func (s *Source) Grant() int64 { return int64(s.g.Credits) }

// Credits returns the credits available now. It cannot fail; after Close
// it keeps its last value.
func (s *Source) Credits() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.led.avail
}

// Processed returns how many of this source's log entries the target's
// handlers had processed at its last status message. It cannot fail;
// after Close it keeps its last value.
func (s *Source) Processed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.processed
}

// Cost returns the credits an active put of n bytes at offset off takes:
// in ModeTransparent an upper bound of the log bytes it can use (one
// entry per packet and page, with its data; exact when the pages log
// data), in ModeMediated its inbox bytes (a header and the data; a get
// takes a header only). It cannot fail and does not check off and n
// (Put does): a Put whose Cost exceeds Grant fails with ErrTooLarge.
func (s *Source) Cost(off, n int) int64 {
	if s.g.Mode == ModeMediated {
		return inboxCost(true, n)
	}
	return cost(s.g.Addr+uint64(off), n, s.mtu)
}

// broadcast wakes every goroutine waiting for a change; s.mu held.
func (s *Source) broadcast() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// usable returns why no operation can start; s.mu held.
func (s *Source) usable() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.broken
}

// wait releases s.mu until something changes or ctx ends; s.mu held.
// When nothing changed for KeepAlive it probes the target (probeLocked)
// and returns nil, so the caller checks its condition again.
func (s *Source) wait(ctx context.Context) error {
	ch := s.changed
	var idle <-chan time.Time
	if s.cfg.KeepAlive > 0 {
		t := time.NewTimer(s.cfg.KeepAlive)
		defer t.Stop()
		idle = t.C
	}
	s.mu.Unlock()
	defer s.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-idle:
		s.mu.Lock()
		s.probeLocked()
		s.mu.Unlock()
		return nil
	}
}

// probeLocked posts a signaled zero-length RDMA WRITE unless one is in
// flight or the send queue is full (then what fills it probes as well).
// The target's NIC acknowledges it; if the target's host is gone, it
// fails with a retry error once the transport stops resending, which
// breaks the connection. s.mu held.
func (s *Source) probeLocked() {
	if s.probing || s.sqFree == 0 || s.usable() != nil {
		return
	}
	s.probing = true
	s.sqFree--
	s.stats.Probes++
	s.queueLocked(verbs.SendWR{ID: wrProbe | s.stats.Probes, Op: verbs.OpWrite,
		RemoteAddr: s.g.Addr, RKey: s.g.RKey, SGL: []verbs.SGE{{}}}, nil)
	s.postLocked() // a failure breaks the connection, which the caller sees
}

// breakLocked records the connection's first fatal error; s.mu held.
func (s *Source) breakLocked(err error) {
	if s.broken == nil {
		s.broken = err
	}
	s.broadcast()
}

// Op is an operation in flight. When Done is closed, a get's data is in
// the caller's buffer and a put has reached the target: in ModeTransparent
// its memory effect is done and it is logged, in ModeMediated it is in
// the target's inbox; in neither is it handled yet (use Flush for that).
type Op struct {
	s        *Source
	seq      uint64
	get      bool
	dst      []byte
	stOff    int // where the data is in staging
	stH      int
	done     chan struct{}
	err      error
	active   bool
	finished bool // done is closed
	// ModeMediated gets complete when the target's answer arrived too.
	needAnswer, sent, answered bool
}

// Done is closed when the operation completed, successfully or not (Err
// then tells). An operation the Source still holds back to post together
// with later ones (see Put) is posted now. It cannot fail: Close, or the
// end of the connection, completes every pending operation.
func (o *Op) Done() <-chan struct{} {
	select {
	case <-o.done:
	default:
		o.s.kick(o)
	}
	return o.done
}

// Err returns nil while the operation is pending or after it succeeded,
// and its error once it failed: it wraps ErrRefused when the target
// refused it, ErrDisconnected when the connection failed (also when the
// Source could not post it), ErrClosed when the Source was closed first.
func (o *Op) Err() error {
	select {
	case <-o.done:
		return o.err
	default:
		return nil
	}
}

// Wait blocks until the operation completed and returns its error (see
// Err). If ctx is already done it returns ctx's error, wrapped, at once
// (also for an operation that completed); if ctx ends while it waits, it
// returns ctx's error. Either way the operation goes on.
func (o *Op) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return callErr("wait", err)
	}
	select {
	case <-o.done:
		return o.err
	default:
	}
	o.s.kick(o)
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		return callErr("wait", ctx.Err())
	}
}

// errPendingAtClose fails the operations still pending when the Source
// is closed.
var errPendingAtClose = fmt.Errorf("activeaccess: operation pending at Close: %w", ErrClosed)

// callErr names the call in an error of the Source's state (closed,
// broken) or of the caller's context.
func callErr(call string, err error) error {
	return fmt.Errorf("activeaccess: %s: %w", call, err)
}

// Put starts an active put: src is copied into the target's memory at
// offset off (or, on pages without W, only into its log) and the
// handler of the pages' domain sees it. src may be reused when Put
// returns. Put blocks while the connection has no credits, queue slots
// or staging memory for it. While earlier operations are in flight, Put
// may queue the access and post it with the ones that follow (one system
// call for the lot), when the next completion arrives or when a caller
// waits for one of them (Op.Wait, Op.Done, Flush); a failure to post it
// then fails the Op with ErrDisconnected.
//
// If ctx is already done, Put returns ctx's error, wrapped, and issues
// nothing; if ctx ends while Put waits for credits, queue slots or
// staging memory, it returns ctx's error and issues nothing. Other
// errors wrap ErrInvalid (empty src), ErrRange (outside the target's
// memory), ErrTooLarge (more than the staging memory or the credit
// grant, or a mediated get over 256 KiB), ErrClosed (after Close),
// ErrDisconnected or ErrRefused (the connection broke, before or while
// Put waited).
func (s *Source) Put(ctx context.Context, off int, src []byte) (*Op, error) {
	return s.post(ctx, "put", true, false, off, src)
}

// Get starts an active get: the target's memory at offset off (or zeros,
// on pages without R) is read into dst, which is filled when the
// operation completes and must not be touched before; the handler of the
// pages' domain sees it if the pages log reads. Errors as for Put.
func (s *Source) Get(ctx context.Context, off int, dst []byte) (*Op, error) {
	return s.post(ctx, "get", true, true, off, dst)
}

// PutPlain starts a plain RMA put: no credits, not covered by Flush
// (FlushPlain covers it). Aim it at pages that do not log writes: a plain
// access to a logging page uses log space no credit reserved, and the
// target may refuse it, or a credit-respecting source's access after it.
// Errors as for Put.
func (s *Source) PutPlain(ctx context.Context, off int, src []byte) (*Op, error) {
	return s.post(ctx, "plain put", false, false, off, src)
}

// GetPlain starts a plain RMA get; see PutPlain and Get. Errors as for Put.
func (s *Source) GetPlain(ctx context.Context, off int, dst []byte) (*Op, error) {
	return s.post(ctx, "plain get", false, true, off, dst)
}

// PutWait is Put followed by the operation's Wait; errors as for both.
func (s *Source) PutWait(ctx context.Context, off int, src []byte) error {
	o, err := s.Put(ctx, off, src)
	if err != nil {
		return err
	}
	return o.Wait(ctx)
}

// GetWait is Get followed by the operation's Wait; errors as for both.
func (s *Source) GetWait(ctx context.Context, off int, dst []byte) error {
	o, err := s.Get(ctx, off, dst)
	if err != nil {
		return err
	}
	return o.Wait(ctx)
}

// post starts an operation for call (put, get, plain put, plain get).
func (s *Source) post(ctx context.Context, call string, active, get bool, off int, b []byte) (*Op, error) {
	if err := ctx.Err(); err != nil {
		return nil, callErr(call, err)
	}
	if s.closed.Load() {
		return nil, callErr(call, ErrClosed)
	}
	n := len(b)
	mediated := active && s.ib != nil
	st := n // staging bytes: the data, and for a mediated access its entry first
	if mediated {
		st += entryHeader
	}
	switch {
	case n == 0:
		return nil, fmt.Errorf("%w: empty access", ErrInvalid)
	case off < 0 || off > int(s.g.Len) || n > int(s.g.Len)-off:
		return nil, fmt.Errorf("%w: [%d, +%d) of %d bytes", ErrRange, off, n, s.g.Len)
	case st > s.cfg.Staging:
		return nil, fmt.Errorf("%w: %d bytes, staging memory %d", ErrTooLarge, n, s.cfg.Staging)
	case mediated && get && n > int(s.g.MaxGet):
		return nil, fmt.Errorf("%w: a get of %d bytes, the target answers at most %d", ErrTooLarge, n, s.g.MaxGet)
	}
	var c int64
	if mediated {
		c = inboxCost(!get, n)
	} else if active {
		c = s.Cost(off, n)
	}
	if c > int64(s.g.Credits) {
		return nil, fmt.Errorf("%w: %d bytes need %d credits, the grant is %d", ErrTooLarge, n, c, s.g.Credits)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var stOff, stH, ibOff, ibH int
	waited := false
	for {
		if err := s.usable(); err != nil {
			return nil, callErr(call, err)
		}
		credits := !active || s.led.avail >= c
		ibOK := false
		if mediated && credits && s.sqFree > 0 {
			// The inbox is a ring: the credits are its free bytes, but
			// an entry needs them contiguous.
			before := s.ib.head
			if ibOff, ibH, ibOK = s.ib.alloc(int(c)); ibOK && !s.led.charge(int64(ibH-before)) {
				s.ib.cancel(ibH)
				ibOK = false
			}
			credits = ibOK
		}
		if credits && s.sqFree > 0 {
			var ok bool
			if stOff, stH, ok = s.st.alloc(st); ok {
				break
			}
		}
		if ibOK { // give the inbox span back while waiting
			used := int64(ibH - s.ib.spans[len(s.ib.spans)-1].start)
			s.ib.cancel(ibH)
			s.led.uncharge(used)
		}
		if !credits {
			if !waited {
				waited = true
				s.stats.CreditWaits++
			}
			if s.led.open > 0 && s.led.outstanding() < s.window && s.sqFree > 0 {
				// Credits come back with the acknowledgement of a
				// marker sent after the accesses that spent them.
				s.markerLocked(false)
				if err := s.postLocked(); err != nil {
					return nil, callErr(call, err)
				}
				continue
			}
		}
		if err := s.wait(ctx); err != nil {
			return nil, callErr(call, err)
		}
	}
	if active && !mediated {
		s.led.charge(c)
	}
	s.seq++
	o := &Op{s: s, seq: s.seq, get: get, stOff: stOff, stH: stH, done: make(chan struct{}), active: active}
	mem := s.mr.Bytes()[s.stBase:]
	wr := verbs.SendWR{ID: wrOp | o.seq, Op: verbs.OpWrite, SGL: []verbs.SGE{s.mr.SGE(s.stBase+stOff, n)},
		RemoteAddr: s.g.Addr + uint64(off), RKey: s.g.RKey}
	switch {
	case mediated:
		e := entry{Kind: entryPut, Off: uint64(off), Len: uint32(n)}
		o.stOff += entryHeader
		if get {
			e.Kind, e.ReplyAddr, e.ReplyRKey, e.Op = entryGet, s.mr.Addr()+uint64(s.stBase+o.stOff), s.mr.RKey(), uint32(o.seq)
			o.needAnswer, o.dst = true, b
			st = entryHeader
		} else {
			copy(mem[o.stOff:], b)
		}
		e.put(mem[stOff:])
		wr.Op, wr.Imm, wr.SGL = verbs.OpWriteImm, uint32(ibOff/entryHeader), []verbs.SGE{s.mr.SGE(s.stBase+stOff, st)}
		wr.RemoteAddr, wr.RKey = s.g.InboxAddr+uint64(ibOff), s.g.InboxRKey
	case get:
		o.dst = b
		wr.Op = verbs.OpRead
	default:
		copy(mem[stOff:], b)
	}
	if wr.Op != verbs.OpRead && wr.SGL[0].Length <= uint32(min(maxInline, s.qp.Cap().MaxInlineData)) {
		wr.Flags |= verbs.SendInline
	}
	if mediated {
		s.ibOpen = append(s.ibOpen, ibH)
	}
	if o.needAnswer {
		s.answers[o.seq] = o
	}
	s.sqFree--
	s.queueLocked(wr, o)
	if active {
		s.stats.Active++
		s.lastActive = o.seq
		if s.led.open >= int64(s.g.Credits)/4 && s.led.outstanding() < s.window && s.sqFree > 0 {
			s.markerLocked(false)
		}
	} else {
		s.stats.Plain++
		s.lastPlain = o.seq
	}
	if err := s.maybePostLocked(); err != nil {
		return nil, callErr(call, err) // o failed with it
	}
	return o, nil
}

// markerLocked closes the open credit epoch and queues its marker; s.mu
// held, a queue slot and a marker window slot free.
func (s *Source) markerLocked(flush bool) {
	ep := s.led.closeEpoch()
	if s.ib != nil {
		s.ibEpochs[ep] = s.ibOpen
		s.ibOpen = nil
	}
	slot := int(ep % uint64(s.window))
	o := s.nrecv*msgSize + slot*markerSlotLen
	l := marker{Epoch: ep, Flush: flush}.put(s.mr.Bytes()[o:])
	s.sqFree--
	s.queueLocked(verbs.SendWR{ID: wrMarker | ep, Op: verbs.OpSend, Flags: verbs.SendInline, SGL: []verbs.SGE{s.mr.SGE(o, l)}}, nil)
	s.stats.Markers++
}

// Flush returns when every active Put and Get this source issued before
// the call has completed and been processed by the target's handlers
// (the paper's active flush); the replies those handlers sent are then
// available from Reply. Plain operations are not covered (FlushPlain).
// While it waits the source probes the target (SourceOptions.KeepAlive),
// so a target whose host vanished fails it with ErrDisconnected; a live
// target whose handlers are slow keeps it waiting until ctx ends.
//
// If ctx is already done, Flush returns ctx's error, wrapped, and sends
// nothing; if ctx ends while it waits, it returns ctx's error (the
// marker it sent may still be acknowledged later). Other errors wrap
// ErrClosed (after Close), ErrDisconnected or ErrRefused (the connection
// broke, for example because an operation failed).
func (s *Source) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return callErr("flush", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if err := s.usable(); err != nil {
			return callErr("flush", err)
		}
		if s.led.outstanding() < s.window && s.sqFree > 0 {
			break
		}
		if err := s.wait(ctx); err != nil {
			return callErr("flush", err)
		}
	}
	last := s.lastActive
	s.markerLocked(true)
	if err := s.postLocked(); err != nil {
		return callErr("flush", err)
	}
	ep := s.led.last
	for s.led.acked < ep || s.doneThru < last {
		if err := s.usable(); err != nil {
			return callErr("flush", err)
		}
		if err := s.wait(ctx); err != nil {
			return callErr("flush", err)
		}
	}
	return nil
}

// FlushPlain returns when every plain operation issued before the call
// has completed at the target (its data is in the target's memory, or
// in the caller's buffer for a get). Context and errors as for Flush.
func (s *Source) FlushPlain(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return callErr("flush plain", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	last := s.lastPlain
	for {
		if err := s.usable(); err != nil {
			return callErr("flush plain", err)
		}
		if s.doneThru >= last {
			return nil
		}
		if s.sq.postedSeq < last {
			if err := s.postLocked(); err != nil {
				return callErr("flush plain", err)
			}
		}
		if err := s.wait(ctx); err != nil {
			return callErr("flush plain", err)
		}
	}
}

// Reply returns the next reply a target handler sent to this source,
// waiting for one if none is queued (probing the target as Flush does).
// Replies queue until read. If ctx is already done, Reply returns ctx's
// error, wrapped, and takes no reply; if ctx ends while it waits, it
// returns ctx's error. Other errors wrap ErrClosed (after Close), or the
// connection's error (ErrDisconnected, ErrRefused) once it broke and no
// reply is left.
func (s *Source) Reply(ctx context.Context) (Reply, error) {
	if err := ctx.Err(); err != nil {
		return Reply{}, callErr("reply", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.replies) == 0 {
		if err := s.usable(); err != nil {
			return Reply{}, callErr("reply", err)
		}
		if err := s.wait(ctx); err != nil {
			return Reply{}, callErr("reply", err)
		}
	}
	r := s.replies[0]
	s.replies = s.replies[1:]
	return r, nil
}

// Replies returns how many replies are queued. It cannot fail; after
// Close it counts the replies left unread.
func (s *Source) Replies() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.replies)
}

// cqLoop completes operations and takes the target's status messages.
func (s *Source) cqLoop() {
	defer s.loops.Done()
	wcs := make([]verbs.WC, 32)
	for {
		n, err := s.cq.Wait(context.Background(), wcs)
		if err != nil {
			s.mu.Lock()
			s.failAllLocked(errPendingAtClose)
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		if s.released { // Close unmapped the buffers and failed the operations
			s.mu.Unlock()
			return
		}
		for _, wc := range wcs[:n] {
			s.completeLocked(wc)
		}
		if len(s.sq.wrs) > 0 && !s.closed.Load() && s.broken == nil {
			s.postLocked() // what queued while those were in flight; a failure fails it
		}
		s.broadcast()
		s.mu.Unlock()
	}
}

func (s *Source) completeLocked(wc verbs.WC) {
	werr := wc.Err()
	switch {
	case wc.ID&wrStatus != 0:
		if werr != nil {
			s.breakLocked(wcError(werr, s.broken))
			return
		}
		slot := int(wc.ID & 0xffff)
		var err error
		if wc.Opcode == verbs.WCRecvRDMAWithImm {
			err = s.answered(wc.Imm)
		} else {
			err = s.status(s.mr.Bytes()[slot*msgSize : slot*msgSize+min(int(wc.ByteLen), msgSize)])
		}
		if err == nil {
			err = s.postRecv(slot)
		}
		if err != nil {
			s.breakLocked(fmt.Errorf("%w: %w", ErrDisconnected, err))
			s.qp.ToError()
		}
	default: // an operation or a marker, and every request posted before it
		s.sendCompletedLocked(wc)
	}
}

// status takes a status message: replies, progress, acknowledgements.
func (s *Source) status(b []byte) error {
	st, reps, err := parseStatus(b, s.replies)
	if err != nil {
		return err
	}
	s.stats.Replies += uint64(len(reps) - len(s.replies))
	s.replies = reps
	s.processed = max(s.processed, st.Processed)
	if st.Acked == 0 {
		return nil
	}
	before := s.led.acked
	if _, err := s.led.ack(st.Acked); err != nil {
		return err
	}
	if s.ib != nil {
		for ep := before + 1; ep <= st.Acked; ep++ {
			for _, h := range s.ibEpochs[ep] {
				s.ib.free(h)
			}
			delete(s.ibEpochs, ep)
		}
	}
	return nil
}

// answered takes a mediated target's answer to the get whose op number
// (the low 32 bits of its sequence number) is imm.
func (s *Source) answered(imm uint32) error {
	seq := s.seq&^0xffffffff | uint64(imm)
	if seq > s.seq {
		seq -= 1 << 32
	}
	o := s.answers[seq]
	if o == nil || o.answered {
		return fmt.Errorf("%w: an answer for op %d, which waits for none", ErrProtocol, imm)
	}
	o.answered = true
	if o.sent {
		s.finish(o, nil)
	}
	return nil
}

// finish completes an operation unless it is complete; s.mu held.
func (s *Source) finish(o *Op, err error) {
	if o.finished {
		return
	}
	o.finished = true
	if o.needAnswer {
		delete(s.answers, o.seq)
	}
	s.markDone(o.seq)
	if err != nil {
		o.err = err
	} else if o.get {
		copy(o.dst, s.mr.Bytes()[s.stBase+o.stOff:s.stBase+o.stOff+len(o.dst)])
	}
	s.st.free(o.stH)
	close(o.done)
}

// markDone records that operation seq completed; doneThru moves past
// every operation up to the first incomplete one (operations complete in
// order, but for mediated gets waiting for their answer).
func (s *Source) markDone(seq uint64) {
	if seq != s.doneThru+1 {
		s.doneSet[seq] = true
		return
	}
	s.doneThru++
	for len(s.doneSet) > 0 && s.doneSet[s.doneThru+1] {
		delete(s.doneSet, s.doneThru+1)
		s.doneThru++
	}
}

// failAllLocked completes every operation not yet complete, queued or in
// flight, with err (or the connection's first error), as no completion
// will come for them; s.mu held.
func (s *Source) failAllLocked(err error) {
	if s.broken != nil {
		err = s.broken
	}
	s.breakLocked(err)
	q := &s.sq
	for q.n > 0 {
		if e := q.pop(); e.op != nil {
			s.finish(e.op, err)
		}
	}
	for _, o := range q.ops {
		if o != nil {
			s.finish(o, err)
		}
	}
	clear(q.ops)
	q.wrs, q.sge, q.ops = q.wrs[:0], q.sge[:0], q.ops[:0]
	for _, o := range s.answers {
		s.finish(o, err)
	}
}

// cmLoop watches the connection: a disconnect (the target closed or its
// process died) breaks it, and moving the QP to the error state flushes
// what is in flight, so nothing waits forever.
func (s *Source) cmLoop(ctx context.Context) {
	defer s.loops.Done()
	for {
		ev, err := s.id.WaitEvent(ctx)
		if err != nil {
			return
		}
		if ev.Type == verbs.CMDisconnected || ev.Type == verbs.CMDeviceRemoval {
			s.mu.Lock()
			s.breakLocked(fmt.Errorf("%w: the target closed the connection (%v)", ErrDisconnected, ev.Type))
			s.mu.Unlock()
			s.qp.ToError()
			return
		}
	}
}

// Close ends the connection: it disconnects (waiting at most 5 s for the
// target's answer), and operations still pending fail with ErrClosed
// (Flush first to end gracefully); calls waiting in Put, Flush or Reply
// return ErrClosed. It returns the verbs error of a failed disconnect
// (not a target that left first, nor one that did not answer in time); a
// second Close returns nil.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return nil
	}
	s.closed.Store(true)
	broken := s.broken != nil
	s.broadcast()
	s.mu.Unlock()
	s.cmStop()
	var err error
	if !broken {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// Another rdma_cm event instead of DISCONNECTED (the target left
		// at the same time: TIMEWAIT_EXIT) still means the connection is
		// gone; Close reports only real failures.
		var ce *verbs.CMEventError
		if e := s.id.Disconnect(ctx); e != nil && !errors.Is(e, context.DeadlineExceeded) && !errors.As(e, &ce) {
			err = fmt.Errorf("activeaccess: disconnect: %w", e)
		}
		cancel()
	}
	s.mu.Lock()
	s.released = true
	s.release() // no completion is processed while the memory goes away
	s.failAllLocked(errPendingAtClose)
	s.mu.Unlock()
	s.loops.Wait()
	return err
}
