package rvma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Endpoint is a process's RVMA endpoint (docs/rvma.md): it listens on an
// address, owns the windows of the mailboxes it receives on, and puts to
// the mailboxes of other endpoints, reached by their listening addresses.
// Links to peers are made on first use; the application never exchanges
// addresses or keys. Its methods are safe for concurrent use.
type Endpoint struct {
	addr netip.AddrPort
	opts EndpointOptions
	e    *engine

	listener *verbs.CMID
	viewMR   *verbs.MR // the view table: entries peers push, remote write
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	failErr  error                    // wraps ErrFailed once the engine failed
	links    map[netip.AddrPort]*link // links this endpoint dialled (its puts go on them), by the peer's listening address
	accepted map[uint64]*link         // links peers dialled, by link ID
	byQPN    map[uint32]*stripe
	dialing  map[uint32]*link // QPs of stripes being dialled, until addStripe records them (ctrl only)
	// retired holds the QPs of the last maxRetired stripes replaced, for
	// linkOf: a message delivered on a stripe just before it broke may be
	// polled after its replacement retired it.
	retired      map[uint32]*stripe
	retiredOrder []retiredQP
	views        []*remoteView // by view slot; nil when free
	freeViews    []uint32
	puts         map[uint64]*PutOp // in flight, by work request ID
	gets         map[uint32]*getOp // waiting for an answer or a READ, by Seq
	getSeq       uint32
	viewGen      uint32 // numbers the views' RESOLVE Seqs
	// loseCtrl is a test hook: a control message it returns true for is
	// not sent (as if lost with a failed stripe). Set before any traffic.
	loseCtrl func(wire.Ctrl) bool
	queues   map[putKey][]*PutOp // puts waiting their turn, by destination and mailbox
	nextID   uint64
	subs     map[uint32][]subscriber // window slot -> links whose view slots mirror it
	owed     map[uint32][]subscriber // window slot -> subscribers a push of its entry could not reach yet
	// noticeVia: subscribers whose notices travel on this endpoint's own
	// link to their peer instead of theirs (noticeLink, notice.go).
	noticeVia map[subscriber]*link

	lateMu  sync.Mutex          // guards lateOut and lateWR (after a link's lateMu)
	lateOut map[uint64]lateSend // LATE reports posted, by work request ID, until their sends complete
	lateWR  uint64

	ctrlMu sync.Mutex // serialises control sends through ctrlBuf
	ctrlMR *verbs.MR  // staging for control messages (sent inline)

	// holdNotices (tests only) stops pushing entry updates, so that a
	// sender's view goes stale on purpose.
	holdNotices atomic.Bool
	// acceptDelay (tests only) holds an accepted stripe between its
	// installation and its Accept, in nanoseconds: the interval in which
	// its QP cannot send yet.
	acceptDelay atomic.Int64

	linkFailures atomic.Uint64
	stalePuts    atomic.Uint64
	latePuts     atomic.Uint64
	rejected     atomic.Uint64
	lostNotices  atomic.Uint64
	notices      atomic.Uint64
	bufferWaits  atomic.Uint64
	getsServed   atomic.Uint64
	getsRefused  atomic.Uint64
}

// subscriber is a link whose peer mirrors a window in a view slot.
type subscriber struct {
	l        *link
	viewSlot uint32
}

// viewSlots is the number of view slots; a RESOLVE's Seq carries the
// view slot in its low viewSlotBits bits.
const (
	viewSlotBits = 12
	viewSlots    = 1 << viewSlotBits
)

// Listen creates an endpoint listening on addr, which must be an address
// of an RDMA device (RoCE: an IP address of the netdev under it) with a
// non-zero port, configured by opts (nil: the defaults of
// EndpointOptions). A ctx that has ended fails it before it does anything;
// Listen does not wait on the network. Errors wrap ErrInvalid (bad address
// or options), ErrDevice with the verbs error of the step that failed
// (binding, listening, opening or allocating on the device; with
// verbs.ErrNotSupported for a device without memory windows), or ctx's
// error.
func Listen(ctx context.Context, addr netip.AddrPort, opts *EndpointOptions) (_ *Endpoint, err error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rvma: listen on %v: %w", addr, sentinelOr(ErrDevice, err))
	}
	var o EndpointOptions
	if opts != nil {
		o = *opts
	}
	if o, err = o.normalize(); err != nil {
		return nil, fmt.Errorf("rvma: listen on %v: %w", addr, sentinelOr(ErrDevice, err))
	}
	if !addr.IsValid() || addr.Port() == 0 || addr.Addr().IsUnspecified() {
		return nil, fmt.Errorf("rvma: listen on %v: %w", addr, invalidf("need a device's IP address and a port"))
	}
	ep := &Endpoint{addr: addr, opts: o, links: map[netip.AddrPort]*link{}, accepted: map[uint64]*link{},
		byQPN: map[uint32]*stripe{}, dialing: map[uint32]*link{}, retired: map[uint32]*stripe{}, puts: map[uint64]*PutOp{}, gets: map[uint32]*getOp{}, queues: map[putKey][]*PutOp{}, subs: map[uint32][]subscriber{}, owed: map[uint32][]subscriber{}, noticeVia: map[subscriber]*link{},
		lateOut: map[uint64]lateSend{}}
	if ep.listener, err = verbs.NewCMID(verbs.PSTCP); err != nil {
		return nil, fmt.Errorf("rvma: listen on %v: %w", addr, sentinelOr(ErrDevice, err))
	}
	defer func() {
		if err != nil {
			ep.listener.Close()
			if ep.e != nil {
				ep.e.Close()
			}
		}
	}()
	if err = ep.listener.Listen(addr, 64); err != nil {
		return nil, fmt.Errorf("rvma: listen on %v: %w", addr, sentinelOr(ErrDevice, err))
	}
	dev, err := ep.listener.Context()
	if err != nil {
		return nil, fmt.Errorf("rvma: listen on %v: %w", addr, sentinelOr(ErrDevice, err))
	}
	if ep.e, err = newEngine(dev, false, net.IP(addr.Addr().Unmap().AsSlice()), engineOptions{Spin: o.Spin, onFail: ep.failed,
		counting: o.Counting, records: o.Records}); err != nil {
		return nil, fmt.Errorf("rvma: listen on %v: %w", addr, sentinelOr(ErrDevice, err))
	}
	if ep.viewMR, err = ep.e.pd.AllocMR(viewSlots*wire.EntrySize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, fmt.Errorf("rvma: listen on %v: view table: %w", addr, sentinelOr(ErrDevice, err))
	}
	if ep.ctrlMR, err = ep.e.pd.AllocMR(wire.EntrySize, verbs.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("rvma: listen on %v: %w", addr, sentinelOr(ErrDevice, err))
	}
	ep.views = make([]*remoteView, viewSlots)
	for i := viewSlots - 1; i >= 0; i-- {
		ep.freeViews = append(ep.freeViews, uint32(i))
	}
	ep.e.links = ep
	ep.ctx, ep.cancel = context.WithCancel(context.Background())
	ep.wg.Add(1)
	go ep.acceptLoop()
	return ep, nil
}

// Addr returns the address the endpoint listens on.
func (ep *Endpoint) Addr() netip.AddrPort { return ep.addr }

// Alloc returns n bytes of registered memory, outside the Go heap, that
// windows accept as buffers and puts send without a copy. It lives until
// the endpoint is closed; the slice must not be used after that. Errors
// wrap ErrClosed, ErrFailed, ErrInvalid (n <= 0) or ErrDevice with the
// verbs error of the registration (RLIMIT_MEMLOCK is the usual limit).
func (ep *Endpoint) Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("rvma: alloc %d bytes: %w", n, invalidf("size must be positive"))
	}
	if err := ep.use(); err != nil {
		return nil, err
	}
	mem, err := ep.e.alloc(n)
	if err != nil {
		return nil, fmt.Errorf("rvma: alloc %d bytes: %w", n, sentinelOr(ErrDevice, err))
	}
	return mem, nil
}

// InitWindow opens a window on mailbox mb (the paper's RVMA_Init_window),
// configured by opts (nil: the defaults of WindowOptions). Senders can put
// to it as soon as a buffer is posted. It sends nothing on the network.
// Errors wrap ErrClosed, ErrFailed, ErrInvalid (the mailbox already has a
// window, MaxWindows are open or lingering, or bad options) or ErrDevice
// (the kernel module refused a counted window).
func (ep *Endpoint) InitWindow(mb Mailbox, opts *WindowOptions) (*Window, error) {
	var o WindowOptions
	if opts != nil {
		o = *opts
	}
	if err := ep.use(); err != nil {
		return nil, err
	}
	w, err := ep.e.initWindow(mb, o)
	if err != nil {
		return nil, fmt.Errorf("rvma: init window %v: %w", mb, sentinelOr(ErrDevice, err))
	}
	return w, nil
}

func (ep *Endpoint) use() error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.downLocked()
}

// downLocked says why the endpoint takes no more work: closed or failed;
// ep.mu held.
func (ep *Endpoint) downLocked() error {
	if ep.closed {
		return fmt.Errorf("rvma: endpoint %v: %w", ep.addr, ErrClosed)
	}
	return ep.failErr
}

// Err returns why the endpoint failed (wrapping ErrFailed), or nil.
func (ep *Endpoint) Err() error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.failErr
}

// failed takes the engine's first failure. A window whose bind or unbind
// failed can neither accept puts nor be guarded any more, so the endpoint
// stops: its links go down first (nothing arrives any more), then every
// window hands its pending buffers over with FlagFailed, and every later
// call fails with ErrFailed.
func (ep *Endpoint) failed(cause error) {
	err := fmt.Errorf("%w: %v: %w", ErrFailed, ep.addr, cause)
	ep.mu.Lock()
	if ep.closed || ep.failErr != nil {
		ep.mu.Unlock()
		return
	}
	ep.failErr = err
	links := ep.allLinksLocked()
	ep.mu.Unlock()
	for _, l := range links {
		l.fail(err, true)
	}
	for _, w := range ep.e.table.Values() {
		w.fail()
	}
}

// allLinksLocked returns the links this endpoint dialled or accepted;
// ep.mu held.
func (ep *Endpoint) allLinksLocked() []*link {
	links := make([]*link, 0, len(ep.links)+len(ep.accepted))
	for _, l := range ep.links {
		if l.dial {
			links = append(links, l)
		}
	}
	for _, l := range ep.accepted {
		links = append(links, l)
	}
	return links
}

// EndpointStats are an endpoint's counters.
type EndpointStats struct {
	Links         int    // links this endpoint dialled (its puts travel on them), connected or being connected; links peers dialled are not counted
	RefusedWrites uint64 // puts the NIC refused into this endpoint's windows (stale keys)
	UnknownRecv   uint64 // arrivals for no window, or malformed
	StalePuts     uint64 // this endpoint's puts refused as stale
	LinkFailures  uint64 // links that ended other than by this endpoint's Close: the peer disconnected or died, or an error
	Rejected      uint64 // connection requests refused (not RVMA, bad hello)
	LatePuts      uint64 // this endpoint's puts that receivers reported as late (EndpointOptions.OnLate)
	LostNotices   uint64 // entry updates, and reports of late or refused puts, that could not be sent to their peer and will not be (its link failed, a queue overflowed)
	Notices       uint64 // entry updates pushed to subscribers (each one post on the wire)
	BufferWaits   uint64 // times one of this endpoint's puts found no buffer posted for its epoch in its view and waited for the receiver's next entry update
	GetsServed    uint64 // peers' Gets answered with a kept buffer's read-only window
	GetsRefused   uint64 // peers' Gets refused (epoch not completed or no longer kept, no such window)
	// CopyRegistrations counts this endpoint's puts from, and Gets into,
	// memory outside Alloc that registered a copy of their own (larger
	// than 4 KiB, or every kept chunk lent): each costs system calls and
	// pinning, where a copy into a kept chunk costs neither.
	CopyRegistrations uint64
}

// Stats returns the endpoint's counters.
func (ep *Endpoint) Stats() EndpointStats {
	ep.mu.Lock()
	n := len(ep.links)
	ep.mu.Unlock()
	return EndpointStats{Links: n, RefusedWrites: ep.e.prog.refused.Load(), UnknownRecv: ep.e.prog.unknown.Load(),
		StalePuts: ep.stalePuts.Load(), LatePuts: ep.latePuts.Load(), LinkFailures: ep.linkFailures.Load(), Rejected: ep.rejected.Load(),
		LostNotices: ep.lostNotices.Load(), Notices: ep.notices.Load(), BufferWaits: ep.bufferWaits.Load(),
		GetsServed: ep.getsServed.Load(), GetsRefused: ep.getsRefused.Load(), CopyRegistrations: ep.e.bounce.registered.Load()}
}

// Windows returns the endpoint's windows, in slot order: the open ones
// and closed ones whose mailbox is still reserved. It returns nil after
// Close.
func (ep *Endpoint) Windows() []*Window {
	if ep.use() != nil {
		return nil
	}
	return ep.e.table.Values()
}

// Close closes the endpoint: its windows are closed (pending waits return
// ErrClosed), pending puts fail with ErrClosed, links are disconnected (the
// peers' pending puts to it fail with ErrPeerGone) and the device is
// released. Memory from Alloc must not be used afterwards, nor the
// Completion pointers of windows the kernel module counts (their records
// are unmapped; Posted's Load, Wait and Spin stay safe). Close is
// idempotent.
func (ep *Endpoint) Close() error {
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		return nil
	}
	ep.closed = true
	links := ep.allLinksLocked()
	ep.mu.Unlock()

	ep.cancel()
	ep.listener.Close() // ends acceptLoop
	ep.wg.Wait()

	// Close the windows while the progress loop still completes unbinds.
	var windows []*Window
	ep.e.table.mu.RLock()
	for _, s := range ep.e.table.slots {
		if s.used && s.val != nil {
			windows = append(windows, s.val)
		}
	}
	ep.e.table.mu.RUnlock()
	for _, w := range windows {
		w.Close()
	}
	ep.e.syncCounted() // the module published the closed epochs at once
	for deadline := time.Now().Add(time.Second); ep.e.mem.bindsPending() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}

	for _, l := range links {
		l.fail(fmt.Errorf("rvma: endpoint %v: %w", ep.addr, ErrClosed), true)
	}
	return ep.e.Close()
}

// errPeer wraps a cause as ErrPeerGone.
func errPeer(dst netip.AddrPort, cause error) error {
	if errors.Is(cause, ErrPeerGone) || errors.Is(cause, ErrClosed) {
		return cause
	}
	return fmt.Errorf("%w: %v: %w", ErrPeerGone, dst, cause)
}

// Counting reports who counts the puts into this endpoint's windows:
// CountModule when the kernel module does (windows with GuardNone, or
// with WindowOptions.Counting CountLibrary, are counted by the library all
// the same), CountLibrary otherwise.
func (ep *Endpoint) Counting() Counting {
	if ep.e.mod != nil {
		return CountModule
	}
	return CountLibrary
}
