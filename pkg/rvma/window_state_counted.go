package rvma

import "github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"

// The part of the window state machine (windowState) that only windows
// the kernel module counts use (windowState.counted; docs/rvma.md,
// section 6): their buffers are registered with the module and shown at
// their mailbox addresses instead of being bound, ended in the module
// instead of unbound, and handed over once the module published their
// records.

// regAction asks the counter (the module) to register b for generation
// gen (the values are copied: b changes when it is re-posted).
type regAction struct {
	b              *buffer
	gen, threshold uint64
}

// endAction asks the counter (the module) to end generation gen (b's) now,
// with flags (partial or closed) in its record.
type endAction struct {
	b     *buffer
	gen   uint64
	flags Flags
}

// showCounted registers with the module, in generation order, the pending
// buffers of a counted window (up to MaxThrough generations from the
// head), and shows each to senders at once as the window's mailbox key at
// its generation's address: registered buffers are always a prefix of
// pending. A buffer ended before it was registered (IncEpoch, Close) is
// registered and ended there at once, so that the module publishes every
// generation's record, in order.
func (w *windowState) showCounted() {
	for i, b := range w.pending {
		if i >= wire.MaxThrough {
			return
		}
		if b.registered {
			continue
		}
		if b.state != bufQueued {
			b.registered = true
			w.toRegister = append(w.toRegister, regAction{b: b, gen: b.gen, threshold: b.threshold})
			w.toEnd = append(w.toEnd, endAction{b: b, gen: b.gen, flags: b.flags & (FlagPartial | FlagClosed)})
			continue
		}
		b.registered, b.bound = true, true
		b.desc = wire.Desc{Addr: wire.MailboxAddr(b.gen), RKey: w.mbkey, Len: uint32(b.cap), Threshold: b.threshold}
		w.toRegister = append(w.toRegister, regAction{b: b, gen: b.gen, threshold: b.threshold})
		w.changed()
	}
}

// endCounted ends a queued buffer of a counted window (its flags hold f
// already): the module closes it and publishes it (countedUpTo), now if
// it knows the buffer, or once registered (showCounted).
func (w *windowState) endCounted(b *buffer, f Flags) {
	b.state = bufCompleting
	if b.registered {
		w.toEnd = append(w.toEnd, endAction{b: b, gen: b.gen, flags: f})
	} else {
		w.showCounted()
	}
}

// headPublished reports whether the module published the record of the
// head buffer's current epoch (a counted window).
func (w *windowState) headPublished() bool {
	if len(w.pending) == 0 {
		return false
	}
	b := w.pending[0]
	if !b.registered || b.state == bufReady || b.comp == nil {
		return false
	}
	rec, seq := b.comp.load()
	return isOwnRecord(rec, seq, b.armedSeq, b.gen)
}

// countedUpTo takes the epochs the module published: done is the module's
// count of them, so the pending buffers of generations below done are
// over. Their counts come from their records. The module refuses writes
// to their generations from now on.
func (w *windowState) countedUpTo(done uint64) {
	for len(w.pending) > 0 && w.head < done {
		b := w.pending[0]
		if !b.registered || b.state == bufReady {
			return // cannot happen: the module publishes registered buffers only, in order
		}
		rec, _ := b.comp.load()
		if rec.Epoch != b.gen {
			return // not yet visible (cannot happen: done is released after the record)
		}
		b.bytes, b.ops = rec.Len, rec.Ops
		// The record is the truth: an IncEpoch or a Close that raced with
		// the threshold lost, and the epoch completed whole.
		const moduleFlags = FlagPartial | FlagClosed | FlagLate
		b.flags = b.flags&^moduleFlags | rec.Flags&moduleFlags
		w.stats.Puts += rec.Ops
		w.stats.Bytes += rec.Len
		if rec.Flags&FlagLate != 0 {
			w.stats.Late++
		}
		b.state, b.bound = bufReady, false
		w.handOver()
	}
	w.showCounted()
}

// takeModuleActions returns and clears the counted window's outbox:
// registrations first, then ends.
func (w *windowState) takeModuleActions() (register []regAction, end []endAction) {
	register, end = w.toRegister, w.toEnd
	w.toRegister, w.toEnd = nil, nil
	return
}
