package rvma

import (
	"errors"
	"math"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// maxLateQueue bounds the reports one link holds while its control sends
// are backed up; past it, reports are counted as lost notices.
const maxLateQueue = 4096

// late reports to the sender of the put wc that it arrived late into the
// window in slot (engine callback): after epoch's threshold, or after
// epoch was handed over (stale). The report names the sender's view slot
// of the window, so the sender finds the mailbox without a search.
func (ep *Endpoint) late(wc verbs.WC, slot uint32, epoch uint64, stale bool) {
	ep.mu.Lock()
	var (
		view uint32
		ok   bool
	)
	l := ep.linkOf(wc.QPN)
	if l != nil {
		for _, s := range ep.subs[slot] {
			if s.l == l {
				view, ok = s.viewSlot, true // the newest subscription wins
			}
		}
	}
	ep.mu.Unlock()
	if !ok {
		ep.lostNotices.Add(1) // a put without a subscription: not from this library
		return
	}
	l.reportLate(wire.Ctrl{Type: wire.CtrlLate, ViewSlot: view, Slot: slot, Epoch: epoch, Count: 1, Len: wc.ByteLen, Stale: stale})
}

// reportLate queues m, a LATE or a REFUSED report, merged into the last
// queued report if that is of the same type, window, view and epoch, and
// sends what the control share of the send queue takes. Reports are sent
// again after a stripe failure and numbered, so that the peer takes each
// once (lateReport, refusedReport).
func (l *link) reportLate(m wire.Ctrl) {
	l.lateMu.Lock()
	if n := len(l.lateQ); n > 0 {
		q := &l.lateQ[n-1]
		if q.Type == m.Type && q.ViewSlot == m.ViewSlot && q.Slot == m.Slot && q.Incarnation == m.Incarnation &&
			q.Epoch == m.Epoch && q.Stale == m.Stale &&
			q.Count < math.MaxUint16 && uint64(q.Len)+uint64(m.Len) <= math.MaxUint32 {
			q.Count++
			q.Len += m.Len
			m.Count = 0
		}
	}
	if m.Count != 0 {
		if len(l.lateQ) >= maxLateQueue {
			l.lateMu.Unlock()
			l.ep.lostNotices.Add(1)
			return
		}
		m.Seq = l.lateNum // the sender takes each number once (seqWindow)
		l.lateNum++
		l.lateQ = append(l.lateQ, m)
	}
	l.lateMu.Unlock()
	l.flushLate()
}

// lateWRMask bounds the work request IDs of LATE sends (below ctrlTag
// and readTag).
const lateWRMask = 1<<40 - 1

// flushLate sends queued late reports until the control share of the
// send queue is full (the next control completion calls it again) or no
// stripe can send (a replacement calls it again once it can). On a failed
// link the reports are dropped and counted as lost notices: the sender is
// gone.
func (l *link) flushLate() {
	ep := l.ep
	l.lateMu.Lock()
	defer l.lateMu.Unlock()
	for len(l.lateAgain)+len(l.lateQ) > 0 {
		q := &l.lateAgain
		if len(*q) == 0 {
			q = &l.lateQ
		}
		m := (*q)[0]
		// Recorded before the post: the completion may be handled first.
		ep.lateMu.Lock()
		ep.lateWR = ep.lateWR%lateWRMask + 1
		id := ep.lateWR
		ep.lateOut[id] = lateSend{l: l, m: m}
		ep.lateMu.Unlock()
		err := l.sendCtrlID(m, id)
		if err != nil {
			ep.lateMu.Lock()
			delete(ep.lateOut, id)
			ep.lateMu.Unlock()
			if errors.Is(err, verbs.ErrQueueFull) || errors.Is(err, verbs.ErrWrongState) || errors.Is(err, errNoStripe) && l.failure() == nil {
				return
			}
			ep.lostNotices.Add(uint64(len(l.lateAgain) + len(l.lateQ)))
			l.lateAgain, l.lateQ = nil, nil
			return
		}
		*q = (*q)[1:]
	}
	l.lateAgain, l.lateQ = nil, nil // let the backing arrays go
}

// lateSend is a LATE report posted on l, until its send completes.
type lateSend struct {
	l *link
	m wire.Ctrl
}

// lateSent is the completion of the LATE send with work request ID id
// (also when its stripe was replaced meanwhile). A report whose send
// failed (flushed when a put the NIC refused broke the stripe: the usual
// company of late puts) is queued again for a live stripe. It may have
// been delivered before its stripe failed (the acknowledgement was lost
// with the stripe): the sender takes each report number once.
func (ep *Endpoint) lateSent(id uint64, ok bool) {
	ep.lateMu.Lock()
	s, found := ep.lateOut[id]
	delete(ep.lateOut, id)
	ep.lateMu.Unlock()
	if !found || ok {
		return
	}
	s.l.lateMu.Lock()
	s.l.lateAgain = append(s.l.lateAgain, s.m)
	s.l.lateMu.Unlock()
	s.l.flushLate()
}

// dropLate forgets the reports of a failed link: those posted (whether
// they were delivered is unknown) and those queued, which are counted as
// lost notices. Their sender is gone, or resolves again on a new link.
func (ep *Endpoint) dropLate(l *link) {
	ep.lateMu.Lock()
	for id, s := range ep.lateOut {
		if s.l == l {
			delete(ep.lateOut, id)
		}
	}
	ep.lateMu.Unlock()
	l.lateMu.Lock()
	n := len(l.lateAgain) + len(l.lateQ)
	l.lateAgain, l.lateQ = nil, nil
	l.lateMu.Unlock()
	ep.lostNotices.Add(uint64(n))
}

// lateReport handles a receiver's report that puts from this endpoint
// arrived late (a LATE control message on l).
func (ep *Endpoint) lateReport(l *link, m wire.Ctrl) {
	if !l.takeReport(m.Seq) {
		return // delivered before its stripe failed, then sent again
	}
	v := ep.view(m.ViewSlot)
	if v == nil || v.l != l {
		ep.e.prog.unknown.Add(1) // the view was released meanwhile
		return
	}
	v.mu.Lock()
	match := v.sv != nil && v.slot == m.Slot
	v.mu.Unlock()
	if !match {
		ep.e.prog.unknown.Add(1)
		return
	}
	ep.latePuts.Add(uint64(m.Count))
	if f := ep.opts.OnLate; f != nil {
		f(LateReport{Peer: l.peer, Mailbox: v.mb, Epoch: m.Epoch, Puts: int(m.Count), Bytes: uint64(m.Len), Stale: m.Stale})
	}
}

// takeReport reports whether report number seq from l's peer (LATE or
// REFUSED) is new, and records it.
func (l *link) takeReport(seq uint32) bool {
	l.lateMu.Lock()
	defer l.lateMu.Unlock()
	return l.lateTaken.take(seq)
}

// refusedReport handles a sender's report that the kernel module refused
// puts of its into a counted window of this endpoint as stale (a REFUSED
// control message on l): the module counts packets, not puts, and sees
// none of the puts the NIC refused for a dead key, so the window counts
// what its senders report (WindowStats.Stale).
func (ep *Endpoint) refusedReport(l *link, m wire.Ctrl) {
	if !l.takeReport(m.Seq) {
		return // delivered before its stripe failed, then sent again
	}
	_, inc, w, ok := ep.e.table.Slot(m.Slot)
	if !ok || w == nil || inc != m.Incarnation {
		ep.e.prog.unknown.Add(1) // the window was freed meanwhile
		return
	}
	w.knock(wire.KnockStale, uint64(m.Count))
}

// maxLateGap bounds the report numbers a sender remembers above a gap.
// A gap stays open only if a report was lost for good (the receiver's
// queue overflowed); past the bound the sender gives up on it.
const maxLateGap = 1024

// seqWindow is the set of report numbers a sender has taken: every number
// below next, and those in above. Numbers are compared modulo 2^32, so
// they may wrap. The zero value is ready: numbers start at 0.
type seqWindow struct {
	next  uint32
	above map[uint32]struct{}
}

// take records s and reports whether it is new.
func (w *seqWindow) take(s uint32) bool {
	if int32(s-w.next) < 0 {
		return false
	}
	if _, dup := w.above[s]; dup {
		return false
	}
	if s != w.next {
		if w.above == nil {
			w.above = map[uint32]struct{}{}
		}
		w.above[s] = struct{}{}
		if len(w.above) <= maxLateGap {
			return true
		}
		// Give up on the gap: move next to the lowest number taken.
		low := s
		for a := range w.above {
			if int32(a-low) < 0 {
				low = a
			}
		}
		delete(w.above, low)
		s = low
	}
	w.next = s + 1
	for {
		if _, ok := w.above[w.next]; !ok {
			return true
		}
		delete(w.above, w.next)
		w.next++
	}
}
