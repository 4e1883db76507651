package rvma

import (
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// errDropped is returned by senderView.target for a window closed
// silently: the put must be reported as done to the application, and
// knocked (KnockDrop) so that the receiver counts it.
var errDropped = fmt.Errorf("rvma: put dropped by a silently closed mailbox")

// errGone is returned by senderView.target once the receiver freed the
// window's mailbox: the view is dead and the mailbox must be resolved
// again (it may have a new window, or none).
var errGone = fmt.Errorf("rvma: the window behind the view is gone")

// senderView is a sender's cached view of one remote window: the last
// entry the receiver pushed (or the sender read), and the sender's own
// contributions to each generation. It chooses the generation a put
// targets without a round trip (docs/rvma.md, section 5): the oldest
// generation, from the entry's head (or past a generation refused as
// stale) on, to which this sender has not itself contributed the
// threshold. A generation whose threshold this sender reached alone
// certainly completes (other senders can only add), so it is never
// targeted again; nor is one to which it put its share, when the window
// promises one (Entry.Share: every sender puts that much into every
// epoch, so the others complete it). A put taken back (abort: it failed
// before being placed) removes its contribution, so its generation is
// targeted again — that is what keeps an epoch from being abandoned when
// a put to it is flushed.
//
// It is not safe for concurrent use.
type senderView struct {
	mailbox     Mailbox
	incarnation uint32
	entry       wire.Entry
	valid       bool
	floor       uint64 // no generation below it is targeted: max(entry head, last stale + 1)
	cursor      uint64 // next(): the first generation from floor on that mine does not mark full
	mine        map[uint64]contrib
}

type contrib struct {
	bytes, ops uint64
	full       bool // this sender alone reached the generation's threshold, or put its share
}

func newSenderView(mb Mailbox, incarnation uint32) *senderView {
	return &senderView{mailbox: mb, incarnation: incarnation, mine: map[uint64]contrib{}}
}

// update offers an entry (pushed or read). It is taken only if it belongs
// to the same window incarnation and is newer than the one held; an older
// or duplicate entry is ignored, so updates may arrive twice or out of
// order. It reports whether the entry was taken.
func (v *senderView) update(e wire.Entry) bool {
	if e.Mailbox != uint64(v.mailbox) || e.Incarnation != v.incarnation {
		return false
	}
	if v.valid && e.Seq <= v.entry.Seq {
		return false
	}
	v.entry, v.valid = e, true
	v.raise(e.Head)
	return true
}

func (v *senderView) raise(floor uint64) {
	if floor <= v.floor {
		return
	}
	v.floor = floor
	for g := range v.mine {
		if g < floor {
			delete(v.mine, g)
		}
	}
	if v.cursor < floor {
		v.cursor = floor
		v.advance()
	}
}

// next returns the generation the next put targets. It is kept as a
// cursor rather than found by a walk from floor, which would cost a map
// lookup per generation this sender filled since the last entry it took
// (with derived descriptors, up to MaxThrough).
func (v *senderView) next() uint64 { return v.cursor }

// advance moves the cursor past the generations this sender filled.
func (v *senderView) advance() {
	for v.mine[v.cursor].full {
		v.cursor++
	}
}

// set records contribution c to gen and keeps the cursor on the first
// generation from floor on that is not full.
func (v *senderView) set(gen uint64, c contrib) {
	v.mine[gen] = c
	switch {
	case c.full && gen == v.cursor:
		v.advance()
	case !c.full && gen >= v.floor && gen < v.cursor:
		v.cursor = gen
	}
}

// revisits reports whether the next put goes to a generation this sender
// already put to without reaching its threshold alone: only other senders
// can have completed it since, and only the receiver's next entry says so.
func (v *senderView) revisits() bool {
	c := v.mine[v.next()]
	return c.bytes > 0 || c.ops > 0
}

// target returns the generation and descriptor a put of n bytes at offset
// off must use. Errors: ErrMailboxClosed (closed with NACK), errDropped
// (closed silently), errGone (freed: resolve again), ErrNoBuffer (no descriptor yet for the generation:
// wait for an update), ErrTooLarge (the put does not fit the buffer).
func (v *senderView) target(off, n uint64) (uint64, wire.Desc, error) {
	if !v.valid {
		return 0, wire.Desc{}, ErrNoBuffer
	}
	switch v.entry.State {
	case wire.StateClosedNack:
		return 0, wire.Desc{}, ErrMailboxClosed
	case wire.StateClosedSilent:
		return 0, wire.Desc{}, errDropped
	case wire.StateGone:
		return 0, wire.Desc{}, errGone
	}
	g := v.next()
	d, ok := v.entry.Desc(g)
	if !ok {
		return g, wire.Desc{}, ErrNoBuffer
	}
	if off > uint64(d.Len) || n > uint64(d.Len)-off {
		return g, d, fmt.Errorf("%d bytes at offset %d into a buffer of %d: %w", n, off, d.Len, ErrTooLarge)
	}
	return g, d, nil
}

// commit records a put of n bytes issued to generation gen (which target
// returned, with its descriptor's threshold).
func (v *senderView) commit(gen, n uint64) {
	c := v.mine[gen]
	c.bytes += n
	c.ops++
	c.full = v.filled(gen, c)
	v.set(gen, c)
}

// filled reports whether contribution c alone completes this sender's
// part of generation gen: its threshold, or the window's Share when the
// receiver promised one (each sender then moves on by its own count).
func (v *senderView) filled(gen uint64, c contrib) bool {
	d, ok := v.entry.Desc(gen)
	if !ok {
		return false
	}
	limit := d.Threshold
	if s := v.entry.Share; s > 0 && s < limit {
		limit = s
	}
	if v.entry.Kind == wire.EpochOps {
		return c.ops >= limit
	}
	return c.bytes >= limit
}

// abort takes back a put that failed before being placed (flushed behind
// a refused put, or its link failed): its generation is targeted again if
// this sender's contribution no longer reaches the threshold.
func (v *senderView) abort(gen, n uint64) {
	c, ok := v.mine[gen]
	if !ok {
		return
	}
	c.bytes -= min(c.bytes, n)
	if c.ops > 0 {
		c.ops--
	}
	c.full = v.filled(gen, c)
	v.set(gen, c)
}

// stale records that a put to gen was refused because gen had completed:
// no generation up to gen is targeted again.
func (v *senderView) stale(gen uint64) { v.raise(gen + 1) }
