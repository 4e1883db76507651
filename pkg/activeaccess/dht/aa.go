package dht

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
)

// Reply codes an AA target's handler sends (Access.Reply), only when an
// insert or delete could not be applied: code<<32 | key.
const (
	replyFull     = 1
	replyRejected = 2
)

// aaDepth is how many active puts a source keeps in flight: the AM
// table's window, so both pipeline alike.
const aaDepth = amWindow

// AATarget is the Active Access table's target (the paper's section 4.1,
// Listing 3): the cells' pages are intercepted (W=0, WL, WLD; reads plain),
// so a source's insert, an 8-byte active put of the element into its
// bucket's cell, reaches the handler instead of memory, and the handler
// inserts it locally (local_insert: the cell, or a heap cell linked into
// the bucket's chain). The delete page is intercepted too: a put of a
// key there deletes it. Lookups are plain RDMA READs of the cells. One
// domain holds both, so a source's inserts and deletes are applied in
// the order it issued them. Create it with ServeAA.
type AATarget struct {
	tg *activeaccess.Target
	d  *activeaccess.Domain
	v  *Volume
	g  layout.Layout // the volume's geometry

	inserted, deleted, full, rejected atomic.Uint64
}

// ServeAA lays a volume of layout l out in an activeaccess target's
// memory and serves it on addr (a specific IP address of an RDMA device,
// and a port). opts may be nil (see TargetOptions). ctx bounds the set-up
// only: once ServeAA returned, the target serves until Close. Errors wrap
// ctx's error (at once when ctx is already done), ErrInvalid (a bad
// layout), or the errors of activeaccess.Listen, NewDomain and Associate:
// activeaccess.ErrInvalid (a bad address or option), kmod.ErrNotLoaded
// (the transparent mode without the rdmaplus module), a verbs error
// (EADDRINUSE for a port in use).
func ServeAA(ctx context.Context, addr netip.AddrPort, l Layout, opts *TargetOptions) (*AATarget, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dht: serve: %w", err)
	}
	if err := l.Check(); err != nil {
		return nil, err
	}
	var cfg TargetOptions
	if opts != nil {
		cfg = *opts
	}
	tg, err := activeaccess.Listen(ctx, addr, l.Size(), &activeaccess.TargetOptions{LogSize: cfg.LogSize, MaxSources: cfg.MaxSources, Mode: cfg.Mode})
	if err != nil {
		return nil, fmt.Errorf("dht: %w", err)
	}
	t := &AATarget{tg: tg, v: newVolume(l, tg.Memory()), g: l.geo()}
	fail := func(err error) (*AATarget, error) {
		tg.Close()
		return nil, fmt.Errorf("dht: %w", err)
	}
	if cfg.Notify == activeaccess.Event && cfg.Threshold == 0 {
		cfg.Threshold, cfg.Interval = 10, time.Millisecond
	}
	if t.d, err = tg.NewDomain(t.handle, &activeaccess.DomainOptions{Notify: cfg.Notify, Threshold: cfg.Threshold, Interval: cfg.Interval}); err != nil {
		return fail(err)
	}
	off, n := t.g.TableSpan()
	if err := t.d.Associate(off, n, activeaccess.Intercept); err != nil {
		return fail(err)
	}
	if err := t.d.Associate(t.g.DeleteOff(), pageSize, activeaccess.Intercept); err != nil {
		return fail(err)
	}
	return t, nil
}

// handle is the handler: an insert or a delete per logged put.
func (t *AATarget) handle(a *activeaccess.Access) {
	if a.Kind != activeaccess.KindPut {
		return
	}
	l := t.g
	if a.Offset >= l.DeleteOff() && a.Offset < l.DeleteOff()+pageSize {
		if len(a.Data) == 0 || len(a.Data)%8 != 0 {
			t.reject(a, 0)
			return
		}
		for b := a.Data; len(b) > 0; b = b[8:] {
			k := binary.LittleEndian.Uint64(b)
			if k == 0 || k > 1<<32-1 {
				t.reject(a, 0)
			} else if t.v.remove(uint32(k)) {
				t.deleted.Add(1)
			}
		}
		return
	}
	i, ok := l.CellAt(a.Offset)
	if !ok || i >= l.Buckets || len(a.Data) != 8 {
		t.reject(a, 0)
		return
	}
	e := binary.LittleEndian.Uint64(a.Data)
	key, _ := layout.Split(e)
	if key == 0 || l.Bucket(key) != i {
		t.reject(a, key)
		return
	}
	if err := t.v.insert(e); err != nil {
		t.full.Add(1)
		a.Reply(replyFull<<32 | uint64(key)) // no known source: nobody to tell
		return
	}
	t.inserted.Add(1)
}

func (t *AATarget) reject(a *activeaccess.Access, key uint32) {
	t.rejected.Add(1)
	a.Reply(replyRejected<<32 | uint64(key))
}

// AAStats count what an AA target's handler did: inserts and deletes
// applied, inserts that found the heap full, requests rejected.
type AAStats struct{ Inserted, Deleted, Full, Rejected uint64 }

// Stats returns the handler's counters. It cannot fail, and keeps its
// last values after Close.
func (t *AATarget) Stats() AAStats {
	return AAStats{t.inserted.Load(), t.deleted.Load(), t.full.Load(), t.rejected.Load()}
}

// Volume is the target's view of the table (valid until Close). It
// cannot fail.
func (t *AATarget) Volume() *Volume { return t.v }

// Target is the activeaccess target underneath (its Err, Stats, Grant).
// It cannot fail.
func (t *AATarget) Target() *activeaccess.Target { return t.tg }

// Err reports failures of the activeaccess runtime (Target.Err), or nil
// when all went well.
func (t *AATarget) Err() error { return t.tg.Err() }

// Close stops the handler, disconnects every source and frees the
// volume (the Volume is unusable after it). It returns the error of
// activeaccess.Target.Close; a second Close returns nil.
func (t *AATarget) Close() error { return t.tg.Close() }

// AATable is a source of the Active Access table: Insert is one active
// put (Listing 3's insert), Delete an active put of the key to the delete
// page, Lookup plain gets of the cells, Flush the active flush plus the
// handler's replies (sent only for inserts it could not apply). Safe for
// concurrent use.
type AATable struct {
	s *activeaccess.Source
	l Layout
	g layout.Layout // l's geometry
}

// DialAA connects to an AA target. opts may be nil (see SourceOptions).
// ctx bounds the connection set-up only. Errors wrap ctx's error (at once
// when ctx is already done), ErrProtocol (no AA DHT target there: also
// when the target refused the connection) or the errors of
// activeaccess.Dial (activeaccess.ErrInvalid for a bad address or name, a
// verbs error).
func DialAA(ctx context.Context, addr netip.AddrPort, opts *SourceOptions) (*AATable, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dht: dial: %w", err)
	}
	var name string
	if opts != nil {
		name = opts.Name
	}
	s, err := activeaccess.Dial(ctx, addr, &activeaccess.SourceOptions{Name: name, Depth: aaDepth})
	if err != nil {
		return nil, fmt.Errorf("dht: %w", aaErr(err))
	}
	b := make([]byte, layout.HeaderLen)
	op, err := s.GetPlain(ctx, 0, b)
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("dht: reading the volume header: %w", aaErr(err))
	}
	l, err := parseHeader(b, s.Size())
	if err != nil {
		s.Close()
		return nil, err
	}
	return &AATable{s: s, l: l, g: l.geo()}, nil
}

// aaErr adds this package's sentinel to an activeaccess error.
func aaErr(err error) error {
	switch {
	case errors.Is(err, activeaccess.ErrDisconnected):
		return fmt.Errorf("%w: %w", ErrDisconnected, err)
	case errors.Is(err, activeaccess.ErrClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	case errors.Is(err, activeaccess.ErrRejected), errors.Is(err, activeaccess.ErrProtocol):
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return err
}

// Layout returns the target's volume layout. It cannot fail.
func (a *AATable) Layout() Layout { return a.l }

// Source is the activeaccess source underneath (its Stats). It cannot
// fail.
func (a *AATable) Source() *activeaccess.Source { return a.s }

// Insert issues the active put of key and value into the bucket's cell
// and returns once it is posted (it waits only for credits). Flush
// reports inserts the target could not store. Errors: ErrInvalid (key
// 0), ErrDisconnected, ErrClosed, ctx's (see Table).
func (a *AATable) Insert(ctx context.Context, key, value uint32) error {
	if key == 0 { // Put checks ctx first on the others
		return a.invalidKey(ctx, "insert")
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], layout.Elem(key, value))
	if _, err := a.s.Put(ctx, a.g.CellOff(a.g.Bucket(key)), b[:]); err != nil {
		return fmt.Errorf("dht: insert: %w", aaErr(err))
	}
	return nil
}

// Delete issues the active put of key to the delete page. Errors as for
// Insert.
func (a *AATable) Delete(ctx context.Context, key uint32) error {
	if key == 0 {
		return a.invalidKey(ctx, "delete")
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(key))
	if _, err := a.s.Put(ctx, a.g.DeleteOff(), b[:]); err != nil {
		return fmt.Errorf("dht: delete: %w", aaErr(err))
	}
	return nil
}

// invalidKey is the error of a call with key 0: ctx's if it is done
// (a done context comes first), else ErrInvalid.
func (a *AATable) invalidKey(ctx context.Context, call string) error {
	if err := ctx.Err(); err != nil {
		return callErr(call, err)
	}
	return callErr(call, checkKey(0))
}

// Flush is the active flush: it returns once the handler processed every
// earlier insert and delete. Errors: ErrFull (that many inserts were not
// stored: the heap was full), ErrRejected, ErrDisconnected, ErrClosed,
// ctx's (see Table).
func (a *AATable) Flush(ctx context.Context) error {
	if err := a.s.Flush(ctx); err != nil {
		return fmt.Errorf("dht: flush: %w", aaErr(err))
	}
	var full, rejected uint64
	for a.s.Replies() > 0 {
		r, err := a.s.Reply(ctx)
		if err != nil {
			return fmt.Errorf("dht: flush: %w", aaErr(err))
		}
		switch r.Value >> 32 {
		case replyFull:
			full++
		default:
			rejected++
		}
	}
	return flushErr(full, rejected)
}

// flushErr is Flush's report of full inserts and rejected requests.
func flushErr(full, rejected uint64) error {
	var errs []error
	if full > 0 {
		errs = append(errs, fmt.Errorf("%w: %d inserts not stored", ErrFull, full))
	}
	if rejected > 0 {
		errs = append(errs, fmt.Errorf("%w: %d requests", ErrRejected, rejected))
	}
	if len(errs) == 0 {
		return nil
	}
	return callErr("flush", errors.Join(errs...))
}

// Lookup returns key's value with plain gets of the cells (the cells'
// pages serve reads without logging them). Errors: ErrInvalid,
// ErrProtocol (a corrupt chain), ErrDisconnected, ErrClosed, ctx's (see
// Table).
func (a *AATable) Lookup(ctx context.Context, key uint32) (uint32, bool, error) {
	if key == 0 {
		return 0, false, a.invalidKey(ctx, "lookup")
	}
	read := func(ctx context.Context, i int, b []byte) error {
		op, err := a.s.GetPlain(ctx, a.g.CellOff(i), b)
		if err == nil {
			err = op.Wait(ctx)
		}
		return aaErr(err)
	}
	_, e, ok, err := findRemote(ctx, a.g, read, key)
	if err != nil {
		return 0, false, callErr("lookup", err)
	}
	_, v := layout.Split(e)
	return v, ok, nil
}

// Close disconnects: it returns the error of activeaccess.Source.Close
// (a failed disconnect); a second Close returns nil.
func (a *AATable) Close() error { return a.s.Close() }
