package activeaccess

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Mode is how a target makes accesses active; it is chosen by the target
// and announced to each source when it connects.
type Mode uint8

// Modes.
const (
	// ModeTransparent: sources issue plain RDMA WRITE and READ; the
	// target's kernel module (the emulated IOMMU) steers and logs them.
	ModeTransparent Mode = 1
	// ModeMediated is for NICs the module cannot hook: each source
	// writes its active accesses into its own inbox at the target (RDMA
	// WRITE_WITH_IMM, within its credits) and the target's runtime
	// applies the pages' actions in software: it writes memory (W),
	// serves gets (R, else zeros) and logs for the handler, in the
	// order the source issued them. Plain accesses go straight to memory.
	ModeMediated Mode = 2
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case ModeTransparent:
		return "transparent"
	case ModeMediated:
		return "library-mediated"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Actions are the control bits of an active page (the paper's extended
// IOMMU PTE; docs/activeaccess.md has their exact semantics on rxe).
type Actions uint32

// Control bits. A page with none of WL, WLD, RL, RLD is never logged;
// Associate with W|R and nothing else makes a page behave as plain memory.
const (
	W   = Actions(kmod.W)   // incoming writes change memory
	R   = Actions(kmod.R)   // reads are served from memory (else the reader gets zeros)
	WL  = Actions(kmod.WL)  // each write is logged for the handler
	WLD = Actions(kmod.WLD) // ... with the data written
	RL  = Actions(kmod.RL)  // each read is logged for the handler
	RLD = Actions(kmod.RLD) // ... with the data served

	// Intercept: writes go to the handler only, never to memory (the
	// paper's active put, W=0 WL=1 WLD=1); reads are plain.
	Intercept = R | WL | WLD
	// Count: memory behaves as usual and every access is logged without
	// its data (the paper's access counter).
	Count = W | R | WL | RL
)

// String lists the bits, as W|R|WL.
func (a Actions) String() string { return kmod.Bits(a).String() }

// TargetOptions tune Listen. A nil *TargetOptions, like the zero value,
// means every default: 1 MiB logs, 4 sources, ModeTransparent.
type TargetOptions struct {
	// LogSize is the bytes of each domain's access log, a power of two
	// in [kmod.MinLogSize, kmod.MaxLogSize]; 0 means 1 MiB. It bounds
	// the credits: (LogSize - 4160) / MaxSources per source, which must
	// hold at least one entry of a header and a page (4160 bytes), else
	// Listen fails with ErrInvalid. In ModeMediated, LogSize is the size
	// of each source's inbox, and the credits it grants.
	LogSize int
	// MaxSources is how many sources may be connected at once (1 to
	// 1024); each gets an equal share of the log as credits. 0 means 4.
	MaxSources int
	// Mode is how accesses are made active; 0 means ModeTransparent
	// (which needs the rdmaplus kernel module).
	Mode Mode
}

// targetConfig is what Listen resolved: the options with their
// defaults, and the memory's size rounded to whole pages.
type targetConfig struct {
	TargetOptions
	Size int
}

// Target exposes memory to remote sources and runs handlers for the
// active accesses they make to it. Create it with Listen.
//
// A Target's memory is registered with the NIC and lives outside the Go
// heap; Memory returns it. Pages become active when a Domain associates
// them with actions (Domain.Associate); the Domain's handler then sees
// every logged access. Sources connect with Dial; the target sends each
// the memory's description and a share of the log (credits) when the
// connection is set up, so the application exchanges no keys.
type Target struct {
	cfg   targetConfig
	grant int64
	l     *verbs.CMID
	pd    *verbs.PD
	buf   *verbs.Buffer // the memory (shared anonymous mapping)
	mr    *verbs.MR
	dev   *kmod.Device
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup

	byQPN atomic.Pointer[map[uint32]*tconn] // copy on write, under mu

	mu      sync.Mutex
	closed  bool
	domains map[*Domain]struct{}
	conns   map[*tconn]struct{}
	plains  map[*PlainQP]struct{}
	slots   int // sources connected, or gone but with entries not processed yet
	nextID  uint32
	nextDom uint32
	markers []*pendingMarker
	errs    []error // accept failures, for Err

	// ModeMediated: the software page table (the module's, emulated).
	pgMu  sync.RWMutex
	pages []pageSlot
}

type pageSlot struct {
	d   *Domain
	act Actions
}

// Listen exposes size bytes of memory (rounded up to whole 4 KiB pages)
// and accepts sources on addr, which must name one of this host's
// RDMA-capable IP addresses and a port (rdma_cm binds the device from
// it). opts may be nil (see TargetOptions). ctx bounds the set-up only:
// once Listen returned, the target serves until Close, whatever becomes
// of ctx.
//
// Errors wrap ctx's error (when ctx is already done, before anything is
// set up), ErrInvalid (a bad address, size or option, an unknown mode),
// kmod.ErrNotLoaded or kmod.ErrNotSupported (ModeTransparent without a
// usable kernel module), or the verbs error of the failing step
// (rdma_bind_addr gives EADDRINUSE for a port in use; an address of no
// RDMA device fails too).
func Listen(ctx context.Context, addr netip.AddrPort, size int, opts *TargetOptions) (*Target, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("activeaccess: listen on %v: %w", addr, err)
	}
	c := targetConfig{Size: size}
	if opts != nil {
		c.TargetOptions = *opts
	}
	if c.LogSize == 0 {
		c.LogSize = 1 << 20
	}
	if c.MaxSources == 0 {
		c.MaxSources = 4
	}
	if c.Mode == 0 {
		c.Mode = ModeTransparent
	}
	switch {
	case !addr.Addr().IsValid() || addr.Addr().IsUnspecified() || addr.Port() == 0:
		return nil, fmt.Errorf("%w: listen address %v: need a specific IP address and port", ErrInvalid, addr)
	case c.Size <= 0:
		return nil, fmt.Errorf("%w: memory size %d", ErrInvalid, c.Size)
	case c.LogSize < kmod.MinLogSize || c.LogSize > kmod.MaxLogSize || c.LogSize&(c.LogSize-1) != 0:
		return nil, fmt.Errorf("%w: log size %d (a power of two in [%d, %d])", ErrInvalid, c.LogSize, kmod.MinLogSize, kmod.MaxLogSize)
	case c.MaxSources < 1 || c.MaxSources > 1024:
		return nil, fmt.Errorf("%w: %d sources", ErrInvalid, c.MaxSources)
	case c.Mode != ModeTransparent && c.Mode != ModeMediated:
		return nil, fmt.Errorf("%w: mode %v", ErrInvalid, c.Mode)
	}
	c.Size = (c.Size + pageSize - 1) &^ (pageSize - 1)
	g := int64(c.LogSize) // ModeMediated: the inbox
	if c.Mode == ModeTransparent {
		var err error
		if g, err = grantFor(c.LogSize, c.MaxSources); err != nil {
			return nil, err
		}
	}
	t := &Target{cfg: c, grant: g, domains: map[*Domain]struct{}{}, conns: map[*tconn]struct{}{},
		plains: map[*PlainQP]struct{}{}}
	t.byQPN.Store(&map[uint32]*tconn{})
	var err error
	if c.Mode == ModeMediated {
		t.pages = make([]pageSlot, c.Size/pageSize)
	} else {
		if t.dev, err = kmod.Open(); err != nil {
			return nil, fmt.Errorf("activeaccess: transparent mode needs the rdmaplus module: %w", err)
		}
		if !t.dev.Version().ActiveAccess {
			t.dev.Close()
			return nil, fmt.Errorf("activeaccess: %w", kmod.ErrNotSupported)
		}
	}
	fail := func(err error) (*Target, error) {
		t.release()
		return nil, err
	}
	if t.l, err = verbs.NewCMID(verbs.PSTCP); err != nil {
		return fail(fmt.Errorf("activeaccess: listen: %w", err))
	}
	if err := t.l.Listen(addr, 16); err != nil {
		return fail(fmt.Errorf("activeaccess: listen on %v: %w", addr, err))
	}
	vc, err := t.l.Context()
	if err != nil {
		return fail(fmt.Errorf("activeaccess: %v is not an RDMA device's address: %w", addr.Addr(), err))
	}
	if t.pd, err = vc.AllocPD(); err != nil {
		return fail(fmt.Errorf("activeaccess: %w", err))
	}
	// Shared, so that the soft-dirty bits of the registered (pinned)
	// pages can be cleared: local writes are then trackable (see
	// verbs.AllocShared and pkg/activeaccess/checkpoint).
	if t.buf, err = verbs.AllocShared(c.Size); err != nil {
		return fail(fmt.Errorf("activeaccess: target memory: %w", err))
	}
	if t.mr, err = t.pd.RegMR(t.buf.Bytes(), verbs.AccessAll); err != nil {
		return fail(fmt.Errorf("activeaccess: target memory: %w", err))
	}
	t.ctx, t.stop = context.WithCancel(context.Background())
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

// release frees what Listen built (Close after the loops stopped).
func (t *Target) release() {
	if t.l != nil {
		t.l.Close()
	}
	if t.pd != nil {
		t.pd.Close() // and the memory region
	}
	if t.buf != nil {
		t.buf.Close()
	}
	if t.dev != nil {
		t.dev.Close()
	}
}

// Memory returns the target's exposed memory, or nil after Close. The
// process may read and write it; remote sources address it by offset.
// Local stores are not seen by the module and never reach a handler; the
// memory is a shared anonymous mapping, so the kernel's soft-dirty bits
// can track them (pkg/activeaccess/checkpoint). Close unmaps it: a slice
// obtained before Close must not be used after it (the access faults).
func (t *Target) Memory() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	return t.mr.Bytes()
}

// Grant returns the credits each source receives: log bytes in
// ModeTransparent, inbox bytes in ModeMediated. It cannot fail.
func (t *Target) Grant() int64 { return t.grant }

// Mode returns the target's mode. It cannot fail.
func (t *Target) Mode() Mode { return t.cfg.Mode }

// Sources returns how many sources are connected (0 after Close). It
// cannot fail.
func (t *Target) Sources() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// Stats returns the kernel module's counters (kmod.Device.Stats:
// module-wide, not only this target's). Errors wrap ErrClosed after
// Close, kmod.ErrNotSupported in ModeMediated (no module involved), or
// the module's error.
func (t *Target) Stats() (kmod.Stats, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return kmod.Stats{}, fmt.Errorf("activeaccess: stats: %w", ErrClosed)
	}
	if t.dev == nil {
		return kmod.Stats{}, fmt.Errorf("activeaccess: stats: %w: a library-mediated target uses no kernel module", kmod.ErrNotSupported)
	}
	st, err := t.dev.Stats()
	if err != nil {
		return st, fmt.Errorf("activeaccess: stats: %w", err)
	}
	return st, nil
}

// Err returns the errors met serving sources (each cost that source its
// connection; the first 16 are kept) and a failed domain's error (which
// cost every source its connection), joined, or nil. A source that did
// not complete its connection within 30 s is reported wrapping
// ErrDisconnected, never context.DeadlineExceeded. Err still answers
// after Close.
func (t *Target) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return errors.Join(t.errs...)
}

// Close disconnects every source (their pending operations fail with
// ErrDisconnected) and closes every PlainQP, stops and closes every
// domain, and releases the memory (Memory's slice must not be used
// after it). It waits for running handlers to return, so a handler that
// never returns keeps it waiting. It returns the first error met
// releasing resources (a verbs or kmod error); a second Close returns
// nil.
func (t *Target) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conns := make([]*tconn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	doms := make([]*Domain, 0, len(t.domains))
	for d := range t.domains {
		doms = append(doms, d)
	}
	plains := make([]*PlainQP, 0, len(t.plains))
	for p := range t.plains {
		plains = append(plains, p)
	}
	t.plains = nil
	t.markers = nil
	t.mu.Unlock()
	t.stop()
	var err error
	for _, p := range plains {
		if e := p.release(); e != nil && err == nil {
			err = e
		}
	}
	if e := t.l.Close(); e != nil && err == nil {
		err = e
	}
	for _, c := range conns {
		c.teardown()
	}
	for _, d := range doms {
		if e := d.Close(); e != nil && err == nil {
			err = e
		}
	}
	t.wg.Wait()
	if e := t.pd.Close(); e != nil && err == nil {
		err = e
	}
	if e := t.buf.Close(); e != nil && err == nil {
		err = e // the memory is unmapped
	}
	if t.dev != nil {
		if e := t.dev.Close(); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return fmt.Errorf("activeaccess: closing the target: %w", err)
	}
	return nil
}

func (t *Target) recordErr(err error) {
	t.mu.Lock()
	if len(t.errs) < 16 {
		t.errs = append(t.errs, err)
	}
	t.mu.Unlock()
}

func (t *Target) connByQPN(qpn uint32) *tconn {
	if qpn == 0 {
		return nil
	}
	return (*t.byQPN.Load())[qpn]
}

// setQPN maps qpn to c (or removes the mapping when c is nil and the
// mapping is old); t.mu held.
func (t *Target) setQPN(qpn uint32, c, old *tconn) {
	cur := *t.byQPN.Load()
	m := make(map[uint32]*tconn, len(cur)+1)
	for k, v := range cur {
		m[k] = v
	}
	if c != nil {
		m[qpn] = c
	} else if m[qpn] == old {
		delete(m, qpn)
	}
	t.byQPN.Store(&m)
}

// ---- markers: flush and credit return ----------------------------------

// A pendingMarker waits until every domain's handler has processed the
// log up to where it stood when the marker arrived. RC delivers a
// source's WRITEs and READs before its later SEND, and the module logs
// an access before rxe completes it, so every entry of the source's
// earlier accesses lies below that snapshot.
type pendingMarker struct {
	c     *tconn
	epoch uint64
	snap  []headSnap
	then  func() // instead of acknowledging (a departed source's drain)
}

type headSnap struct {
	d   *Domain
	pos uint64
}

func (p *pendingMarker) satisfied() bool {
	for _, s := range p.snap {
		if !s.d.closed.Load() && s.d.failed.Load() == nil && s.d.done.Load() < s.pos {
			return false
		}
	}
	return true
}

// addMarker records a marker (or a drain) and checks it at once.
func (t *Target) addMarker(p *pendingMarker) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	for d := range t.domains {
		h := d.head()
		p.snap = append(p.snap, headSnap{d, h})
		if h > d.done.Load() && d.kd != nil && d.cfg.Notify == Event && d.cfg.Threshold != 1 {
			// Fewer entries than the threshold would wake the runtime
			// only when the interval ends, or (no interval) never: the
			// marker would wait for them that long.
			d.kd.Wake()
		}
	}
	t.markers = append(t.markers, p)
	t.mu.Unlock()
	t.checkMarkers()
}

// checkMarkers acknowledges, in arrival order, the markers whose snapshot
// the handlers have passed. A later marker of a source never passes
// before an earlier one (heads only grow), and acknowledgements are
// queued under t.mu, so they leave in epoch order.
func (t *Target) checkMarkers() {
	t.mu.Lock()
	if len(t.markers) == 0 {
		t.mu.Unlock()
		return
	}
	var drained []*pendingMarker
	keep := t.markers[:0]
	for _, p := range t.markers {
		switch {
		case !p.satisfied():
			keep = append(keep, p)
		case p.then != nil:
			drained = append(drained, p)
		default:
			p.c.enqueue(outItem{ack: p.epoch}) // c.mu inside t.mu: never the other way
		}
	}
	clear(t.markers[len(keep):])
	t.markers = keep
	t.mu.Unlock()
	for _, p := range drained {
		p.then()
	}
}

// ---- domains ---------------------------------------------------------

// Notification is how a domain's runtime learns of new log entries.
type Notification int

// Notification modes (the paper's AA-Poll and AA-Int).
const (
	// Event parks the handler goroutine on the domain's eventfd (through
	// Go's netpoller) until the module signals new entries.
	Event Notification = iota
	// Poll spins on the log's head; it answers fastest and costs a CPU
	// (see DomainOptions.PollIdle).
	Poll
)

// Handler processes one access. It runs on the domain's own goroutine,
// one access at a time, in log order; handlers of different domains run
// concurrently. a is valid during the call; a.Data may be kept. A handler
// that blocks stalls its domain (and the flushes of sources that wrote to
// it); a handler that panics crashes the process, as in any goroutine.
type Handler func(a *Access)

// DefaultInterval is the longest an Event domain's handler waits behind
// a busy log by default (DomainOptions): about what adaptive interrupt
// moderation allows a NIC's receive completions (net_dim's longest
// profile, 256 µs).
const DefaultInterval = 250 * time.Microsecond

// DomainOptions tune Target.NewDomain. A nil *DomainOptions, like the
// zero value, means an Event domain with adaptive wake-ups every
// DefaultInterval at most.
type DomainOptions struct {
	// Notify chooses event-driven (Event, the default) or polling (Poll)
	// operation.
	Notify Notification
	// Threshold, Interval and Adaptive (Event, ModeTransparent) say when
	// the module wakes the runtime (kmod.NotifyOptions): after Threshold
	// entries, at most Interval after the first entry since the last
	// wake-up, and with Adaptive at once after a quiet Interval. All
	// zero: adaptive with DefaultInterval, so an idle domain's handler
	// runs without delay and a busy one's at most every DefaultInterval.
	// Threshold 1 wakes on every entry. Negative values, or Adaptive
	// without an Interval, are ErrInvalid. A mediated domain wakes on
	// every access whatever they say.
	Threshold int
	Interval  time.Duration
	Adaptive  bool
	// PollIdle (Poll): after a thousand empty polls the runtime sleeps
	// this long between polls; 0 spins forever (one CPU). Negative is
	// ErrInvalid.
	PollIdle time.Duration
}

// Domain is a set of a target's pages with one access log and one
// handler (the paper's IUID with its log and handler). Create it with
// Target.NewDomain; it lives until its Close or the Target's.
type Domain struct {
	t      *Target
	id     uint32
	kd     *kmod.Domain // ModeTransparent
	sw     *swlog       // ModeMediated
	cfg    DomainOptions
	h      Handler
	stop   context.CancelFunc
	exited chan struct{}

	done      atomic.Uint64 // log position up to which the handler returned
	closed    atomic.Bool
	failed    atomic.Pointer[error]
	processed atomic.Uint64
	closeOnce sync.Once
}

// swlog is a mediated domain's access log: accesses the runtime applied,
// waiting for the handler. Positions count accesses.
type swlog struct {
	mu   sync.Mutex
	q    []Access
	head atomic.Uint64
	kick chan struct{}
}

func (l *swlog) push(a Access) {
	l.mu.Lock()
	a.Seq = l.head.Load() + 1
	l.q = append(l.q, a)
	l.head.Add(1)
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// take moves the queued accesses to dst.
func (l *swlog) take(dst []Access) []Access {
	l.mu.Lock()
	dst = append(dst, l.q...)
	clear(l.q)
	l.q = l.q[:0]
	l.mu.Unlock()
	return dst
}

// NewDomain creates a domain whose handler is h, with its access log
// (TargetOptions.LogSize bytes), and starts its runtime; associate pages
// with Associate. opts may be nil (see DomainOptions). Errors wrap
// ErrInvalid (a nil handler, a bad option), ErrClosed (after Close),
// kmod.ErrTooManyDomains, kmod.ErrNoMemory (RLIMIT_MEMLOCK), or the
// module's error.
func (t *Target) NewDomain(h Handler, opts *DomainOptions) (*Domain, error) {
	var cfg DomainOptions
	if opts != nil {
		cfg = *opts
	}
	if h == nil {
		return nil, fmt.Errorf("%w: domain without a handler", ErrInvalid)
	}
	if cfg.Notify != Event && cfg.Notify != Poll || cfg.Threshold < 0 || cfg.Interval < 0 || cfg.PollIdle < 0 ||
		cfg.Adaptive && cfg.Interval == 0 {
		return nil, fmt.Errorf("%w: domain options %+v", ErrInvalid, cfg)
	}
	if cfg.Notify == Event && cfg.Threshold == 0 && cfg.Interval == 0 {
		cfg.Interval, cfg.Adaptive = DefaultInterval, true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("activeaccess: new domain: %w", ErrClosed)
	}
	d := &Domain{t: t, cfg: cfg, h: h, exited: make(chan struct{})}
	if t.dev == nil {
		t.nextDom++
		d.id = t.nextDom
		d.sw = &swlog{kick: make(chan struct{}, 1)}
	} else {
		kd, err := t.dev.NewDomain(t.cfg.LogSize)
		if err != nil {
			return nil, fmt.Errorf("activeaccess: new domain: %w", err)
		}
		if cfg.Notify == Event {
			if err := kd.Notify(kmod.NotifyOptions{Threshold: cfg.Threshold, Interval: cfg.Interval, Adaptive: cfg.Adaptive}); err != nil {
				kd.Close()
				return nil, fmt.Errorf("activeaccess: domain notification: %w", err)
			}
		}
		d.kd, d.id = kd, kd.ID()
	}
	var ctx context.Context
	ctx, d.stop = context.WithCancel(t.ctx)
	t.domains[d] = struct{}{}
	t.wg.Add(1)
	go d.run(ctx)
	return d, nil
}

// ID returns the domain's id: the module's domain id (the paper's IUID)
// in ModeTransparent, a number of the target's own in ModeMediated. It
// cannot fail; after Close the module may give the id to a new domain.
func (d *Domain) ID() uint32 { return d.id }

// Processed returns how many accesses the handler has processed. It
// cannot fail, and keeps its last value after Close.
func (d *Domain) Processed() uint64 { return d.processed.Load() }

// Err returns the error that stopped the domain's runtime (a corrupt
// log; the target then disconnected every source, since their flushes
// could no longer be honoured), or nil while it runs or after a clean
// Close. (A failed eventfd wait does not stop it: it polls instead, and
// Target.Err reports it.)
func (d *Domain) Err() error {
	if p := d.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Refused returns how many accesses the module refused because this
// domain's log was full, and how many reads it served as zeros for the
// same reason. With credit-respecting sources both stay 0 (and always in
// ModeMediated). It cannot fail; after Close it returns 0, 0.
func (d *Domain) Refused() (refused, lost uint64) {
	if d.closed.Load() || d.kd == nil {
		return 0, 0
	}
	return d.kd.Refused()
}

// head is the log position of the newest entry.
func (d *Domain) head() uint64 {
	if d.kd != nil {
		pos, _ := d.kd.Head()
		return pos
	}
	return d.sw.head.Load()
}

// Associate gives the pages [off, off+length) of the target's memory the
// actions act and this domain's handler (the paper's assoc_page),
// replacing what they had (also another domain's association). off and
// length must be multiples of 4096. Errors wrap ErrInvalid (unaligned or
// empty pages, unknown action bits), ErrRange (pages beyond the
// memory), ErrClosed (the domain or its target was closed), or the
// module's error.
func (d *Domain) Associate(off, length int, act Actions) error {
	if err := d.pages("associate", off, length); err != nil {
		return err
	}
	if act&^0x3f != 0 {
		return fmt.Errorf("activeaccess: associate: %w: actions %v", ErrInvalid, act)
	}
	if d.kd == nil {
		d.t.pgMu.Lock()
		for p := off / pageSize; p < (off+length)/pageSize; p++ {
			d.t.pages[p] = pageSlot{d, act}
		}
		d.t.pgMu.Unlock()
		return nil
	}
	if err := d.kd.Arm(d.t.mr.RKey(), d.t.mr.Addr()+uint64(off), uint64(length), kmod.Bits(act)); err != nil {
		if errors.Is(err, kmod.ErrClosed) {
			return fmt.Errorf("activeaccess: associate: %w", ErrClosed)
		}
		return fmt.Errorf("activeaccess: associate [%d, +%d) with %v: %w", off, length, act, err)
	}
	return nil
}

// Dissociate makes the pages [off, off+length) that this domain holds
// plain memory again; pages of other domains in the range keep theirs.
// Errors as for Associate.
func (d *Domain) Dissociate(off, length int) error {
	if err := d.pages("dissociate", off, length); err != nil {
		return err
	}
	if d.kd == nil {
		d.dissociate(off/pageSize, (off+length)/pageSize)
		return nil
	}
	if err := d.kd.Disarm(d.t.mr.RKey(), d.t.mr.Addr()+uint64(off), uint64(length)); err != nil {
		if errors.Is(err, kmod.ErrClosed) {
			return fmt.Errorf("activeaccess: dissociate: %w", ErrClosed)
		}
		return fmt.Errorf("activeaccess: dissociate [%d, +%d): %w", off, length, err)
	}
	return nil
}

// dissociate clears this domain's pages in [from, to) of the software
// page table.
func (d *Domain) dissociate(from, to int) {
	d.t.pgMu.Lock()
	for p := from; p < to; p++ {
		if d.t.pages[p].d == d {
			d.t.pages[p] = pageSlot{}
		}
	}
	d.t.pgMu.Unlock()
}

// pages checks the arguments of call (associate, dissociate).
func (d *Domain) pages(call string, off, length int) error {
	if d.closed.Load() {
		return fmt.Errorf("activeaccess: %s: %w", call, ErrClosed)
	}
	if off < 0 || length <= 0 || off%pageSize != 0 || length%pageSize != 0 {
		return fmt.Errorf("activeaccess: %s: %w: pages [%d, +%d): need whole 4 KiB pages", call, ErrInvalid, off, length)
	}
	if off+length > d.t.cfg.Size || off+length < off {
		return fmt.Errorf("activeaccess: %s: %w: pages [%d, +%d) of %d bytes", call, ErrRange, off, length, d.t.cfg.Size)
	}
	return nil
}

// Close stops the domain's runtime (waiting for a running handler to
// return, so a handler that never returns keeps it waiting), makes its
// pages plain memory and frees its log. Entries not yet handled are
// dropped, and flushes that waited for them are acknowledged. Closing the
// Target closes its domains. Close returns the module's error freeing
// the log, if any; a second Close returns nil.
func (d *Domain) Close() error {
	var err error
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		d.stop()
		<-d.exited
		if d.kd != nil {
			if err = d.kd.Close(); err != nil {
				err = fmt.Errorf("activeaccess: closing domain %d: %w", d.id, err)
			}
		} else {
			d.dissociate(0, len(d.t.pages))
		}
		d.t.mu.Lock()
		delete(d.t.domains, d)
		d.t.mu.Unlock()
		d.t.checkMarkers()
	})
	return err
}

// fail stops the domain for good. Its unhandled entries will never
// reach the handler, so no flush may succeed any more: every source is
// disconnected (its operations fail with ErrDisconnected).
func (d *Domain) fail(err error) {
	err = fmt.Errorf("activeaccess: domain %d: %w", d.id, err)
	d.failed.Store(&err)
	t := d.t
	t.recordErr(err)
	t.mu.Lock()
	conns := make([]*tconn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		go c.teardown()
	}
	t.checkMarkers()
}

// handle runs the handler on one access and counts it.
func (d *Domain) handle(a *Access) {
	d.h(a)
	d.processed.Add(1)
	if a.c != nil {
		a.c.processed.Add(1)
	}
}

func (d *Domain) run(ctx context.Context) {
	defer d.t.wg.Done()
	defer close(d.exited)
	if d.kd != nil {
		d.runKmod(ctx)
	} else {
		d.runSoftware(ctx)
	}
}

// idle waits between polls of an empty log (Poll); false when ctx ended.
func (d *Domain) idle(ctx context.Context, n *int) bool {
	pause := d.cfg.PollIdle
	if d.cfg.Notify == Event {
		pause = time.Millisecond // an Event domain whose eventfd failed
	}
	if *n++; *n < 1000 || pause == 0 {
		runtime.Gosched()
		return true
	}
	tm := time.NewTimer(pause)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// runKmod is a transparent domain's runtime: read entries from the
// module's log, run the handler, publish progress, then wait (eventfd or
// polling) when the log is empty.
func (d *Domain) runKmod(ctx context.Context) {
	base := d.t.mr.Addr()
	var batch []kmod.Entry
	idle := 0
	waitBroken := false
	var lastSeq uint64
	for ctx.Err() == nil {
		var err error
		batch, err = d.kd.Read(batch[:0], 256)
		if err != nil {
			if !errors.Is(err, kmod.ErrClosed) {
				d.fail(err)
			}
			return
		}
		pos := d.kd.Tail()
		for i := range batch {
			e := &batch[i]
			if lastSeq != 0 && e.Seq != lastSeq+1 {
				d.t.recordErr(fmt.Errorf("activeaccess: domain %d: log sequence jumps from %d to %d", d.id, lastSeq, e.Seq))
			}
			lastSeq = e.Seq
			a := Access{Kind: Kind(e.Op), Offset: int(e.IOVA - base), Length: int(e.Length), Data: e.Data,
				Suppressed: e.Suppressed, Seq: e.Seq, Value: e.Value, Domain: d}
			if c := d.t.connByQPN(e.QPN); c != nil {
				a.Source, a.c = c.peer, c
			}
			d.handle(&a)
			batch[i] = kmod.Entry{}
		}
		if pos != d.done.Load() {
			d.done.Store(pos)
			d.t.checkMarkers()
		}
		if len(batch) > 0 {
			idle = 0
			continue
		}
		if d.cfg.Notify == Event && !waitBroken {
			if _, err := d.kd.Wait(ctx); err != nil {
				if ctx.Err() != nil || errors.Is(err, kmod.ErrClosed) {
					return
				}
				// The log is fine, only its eventfd is not: poll
				// instead of giving up the domain.
				waitBroken = true
				d.t.recordErr(fmt.Errorf("activeaccess: domain %d: waiting for the module (polling from now on): %w", d.id, err))
			}
			continue
		}
		if h, _ := d.kd.Head(); h != pos {
			continue
		}
		if !d.idle(ctx, &idle) {
			return
		}
	}
}

// runSoftware is a mediated domain's runtime: the same, over the
// accesses the connections' runtimes applied.
func (d *Domain) runSoftware(ctx context.Context) {
	var batch []Access
	idle := 0
	for ctx.Err() == nil {
		batch = d.sw.take(batch[:0])
		for i := range batch {
			a := batch[i]
			d.handle(&a)
			batch[i] = Access{}
		}
		if len(batch) > 0 {
			d.done.Add(uint64(len(batch)))
			d.t.checkMarkers()
			idle = 0
			continue
		}
		if d.cfg.Notify == Event {
			select {
			case <-ctx.Done():
				return
			case <-d.sw.kick:
			}
			continue
		}
		if d.sw.head.Load() != d.done.Load() {
			continue
		}
		if !d.idle(ctx, &idle) {
			return
		}
	}
}

// Kind is the kind of an access.
type Kind uint16

// Kinds of access a handler sees.
const (
	KindPut    = Kind(kmod.OpWrite)  // a remote write (Source.Put, or any RDMA WRITE)
	KindGet    = Kind(kmod.OpRead)   // a remote read served (Source.Get, or any RDMA READ)
	KindAtomic = Kind(kmod.OpAtomic) // a remote atomic (plain verbs sources only)
)

// String names the kind: put, get or atomic.
func (k Kind) String() string {
	switch k {
	case KindPut:
		return "put"
	case KindGet:
		return "get"
	case KindAtomic:
		return "atomic"
	}
	return fmt.Sprintf("Kind(%d)", uint16(k))
}

// Peer identifies a connected source at the target.
type Peer struct {
	ID   uint32 // assigned by the target, unique for its lifetime, from 1
	Name string // SourceOptions.Name of the source
	QPN  uint32 // the source's queue pair number
	// Addr is the source's IP address and rdma_cm port as the target's
	// rdma_cm saw it (the zero AddrPort if it could not tell).
	Addr netip.AddrPort
}

// Access is one logged access: the part of one packet (at most one path
// MTU) that falls in one page (ModeMediated: the part of an access in one
// page). A Put larger than the path MTU, or crossing a page boundary,
// reaches the handler as several Accesses, in order.
type Access struct {
	Kind       Kind
	Offset     int    // where the access starts in the target's memory
	Length     int    // bytes of the access (in this packet and page)
	Data       []byte // the bytes written or served, when the page logs data (WLD, RLD)
	Suppressed bool   // W=0 kept a write out of memory, or R=0 served zeros
	Seq        uint64 // the domain's log sequence number, from 1 without gaps
	Value      uint64 // KindAtomic: the target's value before the operation
	Source     *Peer  // nil when the access came from a QP this target did not accept (a PlainQP's source)
	Domain     *Domain
	c          *tconn
}

// Reply sends v back to the access's source, which reads it with
// Source.Reply; replies to one source arrive in the order they were
// sent, and before the acknowledgement of any flush issued after the
// access. It does not block: the reply is queued for the connection's
// sender. Errors wrap ErrNoSource when the source is not a Source of this
// package (a PlainQP's, or one the target no longer knows), ErrClosed
// when its connection is gone (the source left, or the Target closed).
func (a *Access) Reply(v uint64) error {
	if a.c == nil {
		return fmt.Errorf("activeaccess: reply: %w", ErrNoSource)
	}
	if !a.c.enqueue(outItem{reply: Reply{Offset: uint64(a.Offset), Value: v}, isReply: true}) {
		return fmt.Errorf("activeaccess: reply to source %d: %w", a.c.peer.ID, ErrClosed)
	}
	return nil
}
