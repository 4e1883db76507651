package rvma

import "fmt"

// errDropped is returned by senderView.target for a window closed
// silently: the put must be reported as done to the application, and
// knocked (KnockDrop) so that the receiver counts it.
var errDropped = fmt.Errorf("rvma: put dropped by a silently closed mailbox")

// senderView is a sender's cached view of one remote window: the last
// entry the receiver pushed (or the sender read), and the sender's own
// contributions to each generation. It chooses the generation a put
// targets without a round trip (docs/rvma.md, section 5):
//
//   - the oldest generation, from the entry's head on, to which this sender
//     has not itself contributed the threshold;
//   - a generation is left behind when this sender's own contributions
//     reach its threshold (it then certainly completes: other senders can
//     only add), when an entry shows a later head, or when a put to it was
//     refused as stale.
//
// It is not safe for concurrent use.
type senderView struct {
	mailbox     Mailbox
	incarnation uint32
	entry       Entry
	valid       bool
	cursor      uint64
	mine        map[uint64]contrib
}

type contrib struct{ bytes, ops uint64 }

func newSenderView(mb Mailbox, incarnation uint32) *senderView {
	return &senderView{mailbox: mb, incarnation: incarnation, mine: map[uint64]contrib{}}
}

// update offers an entry (pushed or read). It is taken only if it belongs
// to the same window incarnation and is newer than the one held; an older
// or duplicate entry is ignored, so updates may arrive twice or out of
// order. It reports whether the entry was taken.
func (v *senderView) update(e Entry) bool {
	if e.Mailbox != v.mailbox || e.Incarnation != v.incarnation {
		return false
	}
	if v.valid && e.Seq <= v.entry.Seq {
		return false
	}
	v.entry, v.valid = e, true
	if e.Head > v.cursor {
		v.cursor = e.Head
	}
	for g := range v.mine {
		if g < e.Head {
			delete(v.mine, g)
		}
	}
	return true
}

// target returns the generation and descriptor a put of n bytes at offset
// off must use. Errors: ErrMailboxClosed (closed with NACK), errDropped
// (closed silently), ErrNoBuffer (no descriptor yet for the generation:
// wait for an update), ErrTooLarge (the put does not fit the buffer).
func (v *senderView) target(off, n uint64) (uint64, Desc, error) {
	if !v.valid {
		return 0, Desc{}, ErrNoBuffer
	}
	switch v.entry.State {
	case StateClosedNack:
		return 0, Desc{}, ErrMailboxClosed
	case StateClosedSilent:
		return 0, Desc{}, errDropped
	}
	d, ok := v.entry.Desc(v.cursor)
	if !ok {
		return v.cursor, Desc{}, ErrNoBuffer
	}
	if off > uint64(d.Len) || n > uint64(d.Len)-off {
		return v.cursor, d, fmt.Errorf("%d bytes at offset %d into a buffer of %d: %w", n, off, d.Len, ErrTooLarge)
	}
	return v.cursor, d, nil
}

// commit records a put of n bytes issued to generation gen, and moves on
// when this sender's own contributions reach the generation's threshold.
func (v *senderView) commit(gen, n uint64) {
	c := v.mine[gen]
	c.bytes += n
	c.ops++
	v.mine[gen] = c
	d, ok := v.entry.Desc(gen)
	if !ok {
		return
	}
	full := c.bytes >= d.Threshold
	if v.entry.Kind == EpochOps {
		full = c.ops >= d.Threshold
	}
	if full && gen >= v.cursor {
		v.cursor = gen + 1
	}
}

// abort takes back a put that failed for another reason than staleness (it
// was never counted by the receiver). The cursor is not moved back: puts
// issued after it may already target a later generation.
func (v *senderView) abort(gen, n uint64) {
	c, ok := v.mine[gen]
	if !ok {
		return
	}
	c.bytes -= min(c.bytes, n)
	if c.ops > 0 {
		c.ops--
	}
	v.mine[gen] = c
}

// stale records that a put to gen was refused because gen had completed.
func (v *senderView) stale(gen uint64) {
	if gen+1 > v.cursor {
		v.cursor = gen + 1
	}
	delete(v.mine, gen)
}
