package rvma

import (
	"errors"
	"slices"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Notices: a window's entry, mirrored into the view slot of every sender
// that resolved it (its subscribers) with an RDMA WRITE WITH IMMEDIATE.
//
// A subscriber resolved the window over the link it dialled, and its
// notices start there. When this endpoint has dialled a link of its own to
// the same peer (it puts to that peer too), the notices move to that link
// (noticeLink): there they precede, on one QP, the puts this endpoint
// sends the peer after them (the first put after a notice takes the
// notice's stripe: link.putStripe), so the peer has the entry before a
// put of this side's can make it put back. Over the peer's link instead,
// a notice and the put after it travel on different QPs, which a NIC that
// processes QPs in parallel may place in either order, and a put back to
// an epoch that completed meanwhile is refused and costs a stripe
// (docs/rvma.md, section 5; the peer reads the entry from its view slot,
// Endpoint.reread, so it needs only the entry to have landed).
//
// The notices of one subscriber travel on one link at a time: two on
// different QPs could land out of order, and the older entry would
// overwrite the newer one in the peer's view slot. So a subscriber moves
// to another link only once every notice sent on its current one has
// completed (the peer's NIC placed it), or the current link failed.

// pushEntry mirrors a changed descriptor entry into the view slots of
// slot's subscribers (WRITE WITH IMMEDIATE, inline from the table): all of
// them, or (all false) only those an earlier push could not reach. The
// engine calls it under the window's dispatch lock, so the entry does not
// change while it is copied. It reports false when a subscriber could not
// be sent the entry for now (every stripe of its link is being replaced,
// or the control share of the send queue is full): it is owed the entry,
// and the engine pushes again later, to the owed ones only (a sender that
// moves on by its own count may be waiting for exactly this entry, and
// the others need not be sent it twice).
func (ep *Endpoint) pushEntry(slot uint32, entry []byte, all bool) bool {
	if ep.holdNotices.Load() {
		return true
	}
	ep.mu.Lock()
	subs := ep.owed[slot]
	delete(ep.owed, slot)
	if all {
		subs = append([]subscriber(nil), ep.subs[slot]...)
	}
	ep.mu.Unlock()
	failed := ep.notifyAll(subs, entry)
	if len(failed) == 0 {
		return true
	}
	return ep.owe(slot, failed)
}

// owe records that the subscribers in failed, those still subscribed, are
// owed slot's current entry, and reports whether none is (else the engine
// pushes again later: deferPush).
func (ep *Endpoint) owe(slot uint32, failed []subscriber) bool {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	for _, s := range failed {
		if slices.Contains(ep.subs[slot], s) { // not dropped with its link meanwhile
			ep.oweLocked(slot, s)
		}
	}
	return len(ep.owed[slot]) == 0
}

// oweLocked records that s is owed slot's current entry. The caller holds
// ep.mu.
func (ep *Endpoint) oweLocked(slot uint32, s subscriber) {
	if !slices.Contains(ep.owed[slot], s) {
		ep.owed[slot] = append(ep.owed[slot], s)
	}
}

// notifyAll writes entry into every subscriber's view slot, counting the
// notices sent and lost, and returns those that could not be sent for now
// (see pushEntry).
func (ep *Endpoint) notifyAll(subs []subscriber, entry []byte) []subscriber {
	var failed []subscriber
	for _, s := range subs {
		switch err := ep.noticeLink(s).notify(s.viewSlot, entry); {
		case err == nil:
			ep.notices.Add(1)
		case errors.Is(err, ErrInvalid):
			ep.lostNotices.Add(1)
		default:
			// No live stripe, the control share of the send queue full,
			// or a stripe that failed under the post (it is being
			// replaced; a failed link drops its subscribers).
			failed = append(failed, s)
		}
	}
	return failed
}

// dropSubscribers forgets every subscriber of slot after pushing them
// entry, the window's last (StateGone), so that they resolve the mailbox
// again. The engine calls it under the window's dispatch lock, before
// the slot is freed.
func (ep *Endpoint) dropSubscribers(slot uint32, entry []byte) {
	ep.mu.Lock()
	subs := ep.subs[slot]
	delete(ep.subs, slot)
	delete(ep.owed, slot)
	ep.mu.Unlock()
	if !ep.holdNotices.Load() {
		ep.notifyAll(subs, entry)
	}
}

// repush pushes the current entry of every window whose notices travel
// on l once more, to those subscribers only: the notices in flight on a
// stripe that failed were lost with it, and a sender that moves on by its
// own count may wait for exactly one of them. A repeated entry changes
// nothing at a sender (views take only newer entries).
func (ep *Endpoint) repush(l *link) {
	ep.mu.Lock()
	for slot, subs := range ep.subs {
		for _, s := range subs {
			if s.l != l && ep.noticeVia[s] != l {
				continue
			}
			if _, _, w, ok := ep.e.table.Slot(slot); ok && w != nil {
				ep.oweLocked(slot, s)
				ep.e.desc.deferPush(w)
			}
		}
	}
	ep.mu.Unlock()
	ep.e.flushPushes()
	l.flushLate()
}

// subscribers is the number of links whose peers mirror slot.
func (ep *Endpoint) subscribers(slot uint32) int {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return len(ep.subs[slot])
}

func (l *link) notify(viewSlot uint32, entry []byte) error {
	imm, err := wire.Imm{Kind: wire.KindNotice, Slot: viewSlot}.Encode()
	if err != nil {
		return wireErr(err)
	}
	l.mu.Lock()
	pv := l.peerViews
	l.mu.Unlock()
	if viewSlot >= pv.Slots {
		return invalidf("view slot %d beyond the peer's %d", viewSlot, pv.Slots)
	}
	err = l.postCtrl(verbs.SendWR{Op: verbs.OpWriteImm, Imm: imm, RemoteAddr: pv.Addr + uint64(viewSlot)*wire.EntrySize,
		RKey: pv.RKey}, entry)
	if err == nil {
		l.noticed.Store(true)
	}
	return err
}

// noticeLink returns the link s's next notice travels on (see the top of
// this file): this endpoint's own dialled link to s's peer once it mirrors
// the same view table, else the link s resolved over; a subscriber
// changes links only when its current one has no notice in flight, or
// failed.
func (ep *Endpoint) noticeLink(s subscriber) *link {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	cur := ep.noticeVia[s]
	if cur == nil {
		cur = s.l
	}
	want := s.l
	if d := ep.links[s.l.peer]; d != nil && d.sharesViews(s.l) {
		want = d
	}
	if want != cur && (cur.failure() != nil || cur.ctrlIdle()) {
		cur = want
		if cur == s.l {
			delete(ep.noticeVia, s)
		} else {
			ep.noticeVia[s] = cur
		}
	}
	return cur
}

// reroutedLocked forgets the routes through l, which failed, and reports
// whether a subscriber of another link had its notices on l: it is owed
// its windows' entries (the notices in flight were lost) and gets them
// over its own link. The caller holds ep.mu and has the deferred entries
// pushed once it released it. (A subscriber's route outlives its
// subscriptions until one of its two links fails: it stays the route of
// the peer's view slot if the peer subscribes it again.)
func (ep *Endpoint) reroutedLocked(l *link) bool {
	owed := false
	for s, via := range ep.noticeVia {
		if via != l && s.l != l {
			continue
		}
		delete(ep.noticeVia, s)
		if s.l == l {
			continue // dropped with l
		}
		for slot, subs := range ep.subs {
			if !slices.Contains(subs, s) {
				continue
			}
			if _, _, w, ok := ep.e.table.Slot(slot); ok && w != nil {
				ep.oweLocked(slot, s)
				ep.e.desc.deferPush(w)
				owed = true
			}
		}
	}
	return owed
}

// sharesViews reports whether l and o write into the same view table of
// the same peer (a peer that restarted has another).
func (l *link) sharesViews(o *link) bool {
	l.mu.Lock()
	a := l.peerViews
	l.mu.Unlock()
	o.mu.Lock()
	b := o.peerViews
	o.mu.Unlock()
	return a.valid() && a == b
}

// ctrlIdle reports whether no control message or notice sent on l is
// waiting for its completion: every one was placed at the peer.
func (l *link) ctrlIdle() bool {
	for i := range l.stripes {
		if st := l.stripes[i].Load(); st != nil && st.ctrlOut.Load() != 0 {
			return false
		}
	}
	return true
}
