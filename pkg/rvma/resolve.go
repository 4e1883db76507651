package rvma

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// remoteView is a sender's resolved view of a peer's window: the window's
// slot and incarnation (from RESOLVED) and the entry the peer pushes into
// view slot viewSlot of this endpoint's view table.
type remoteView struct {
	l        *link
	mb       Mailbox
	viewSlot uint32
	seq      uint32 // the Seq of its RESOLVEs: the view slot and a generation (resolveSeq)

	mu       sync.Mutex
	resolved chan struct{} // closed on RESOLVED or NACK
	err      error         // the NACK
	slot     uint32
	sv       *senderView
	changed  chan struct{} // closed and replaced on every update
}

// wake wakes every put waiting for the view to change.
func (v *remoteView) wake() {
	v.mu.Lock()
	close(v.changed)
	v.changed = make(chan struct{})
	v.mu.Unlock()
}

// newView takes a free view slot for mailbox mb on l. The caller holds
// ep.mu.
func (ep *Endpoint) newView(l *link, mb Mailbox) (*remoteView, error) {
	if len(ep.freeViews) == 0 {
		return nil, invalidf("all %d view slots are in use", viewSlots)
	}
	s := ep.freeViews[len(ep.freeViews)-1]
	ep.freeViews = ep.freeViews[:len(ep.freeViews)-1]
	ep.viewGen++
	v := &remoteView{l: l, mb: mb, viewSlot: s, seq: resolveSeq(s, ep.viewGen), resolved: make(chan struct{}), changed: make(chan struct{})}
	ep.views[s] = v
	return v, nil
}

// resolveSeq is the Seq of the RESOLVEs of the view in slot s, taken as
// the gen-th view of its endpoint: the slot in the low bits, gen above it,
// bit 31 clear (GetSeqBit). A late answer to a RESOLVE of an earlier view
// in the same slot (resent, then answered twice) then matches no view
// instead of the slot's next one.
func resolveSeq(s, gen uint32) uint32 {
	return (gen<<viewSlotBits | s) &^ wire.GetSeqBit
}

// view returns the view in view slot s, or nil if the slot is free or
// beyond the table.
func (ep *Endpoint) view(s uint32) *remoteView {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if s >= uint32(len(ep.views)) {
		return nil
	}
	return ep.views[s]
}

// freeView returns a view's slot. The caller holds ep.mu.
func (ep *Endpoint) freeView(v *remoteView) {
	if ep.views[v.viewSlot] == v {
		ep.views[v.viewSlot] = nil
		clear(ep.viewMR.Bytes()[int(v.viewSlot)*wire.EntrySize : int(v.viewSlot+1)*wire.EntrySize])
		ep.freeViews = append(ep.freeViews, v.viewSlot)
	}
}

// resolve returns l's view of mailbox mb, sending RESOLVE the first time,
// and waits for the answer. Errors wrap ErrNoMailbox, ErrPeerGone or
// ctx's error.
func (ep *Endpoint) resolve(ctx context.Context, l *link, mb Mailbox) (*remoteView, error) {
	ep.mu.Lock()
	l.mu.Lock()
	v := l.views[mb]
	fresh := v == nil && l.err == nil
	var err error
	if fresh {
		if v, err = ep.newView(l, mb); err == nil {
			l.views[mb] = v
		}
	}
	lerr := l.err
	l.mu.Unlock()
	ep.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, lerr
	}
	// Every goroutine waiting for the view keeps asking (the first one
	// sends at once): if the first gives up, the others still re-send a
	// RESOLVE lost with a failed stripe. The receiver subscribes a view
	// slot once however often it asks.
	ep.e.waitBegin()
	err = l.exchange(ctx, wire.Ctrl{Type: wire.CtrlResolve, Seq: v.seq, Mailbox: uint64(mb), ViewSlot: v.viewSlot}, v.resolved, fresh)
	ep.e.waitEnd()
	if err != nil {
		if fresh && !errors.Is(err, ctx.Err()) {
			ep.dropView(l, v)
		}
		return nil, fmt.Errorf("resolving mailbox %v: %w", mb, err)
	}
	v.mu.Lock()
	err = v.err
	v.mu.Unlock()
	if err != nil {
		ep.dropView(l, v) // a later put asks again: the window may exist by then
		return nil, err
	}
	return v, nil
}

func (ep *Endpoint) dropView(l *link, v *remoteView) {
	ep.mu.Lock()
	l.mu.Lock()
	if l.views[v.mb] == v {
		delete(l.views, v.mb)
		ep.freeView(v)
	}
	l.mu.Unlock()
	ep.mu.Unlock()
}

// answerResolve subscribes l to the window of m.Mailbox and answers with
// RESOLVED and the current entry, or NACK.
func (ep *Endpoint) answerResolve(l *link, m wire.Ctrl) {
	var (
		slot, inc uint32
		w         *Window
	)
	for {
		var ok bool
		slot, inc, w, ok = ep.e.table.Lookup(Mailbox(m.Mailbox))
		if !ok || w == nil {
			l.sendCtrl(wire.Ctrl{Type: wire.CtrlNack, Seq: m.Seq, Reason: wire.NackNoMailbox})
			return
		}
		// Under the dispatch lock no entry change is pushed meanwhile, so
		// the subscriber sees RESOLVED, then this entry, then every later
		// one. The window may have been freed (engine.free, under the
		// same lock) since the lookup: then look again.
		w.dispatch.Lock()
		if _, cur, v, ok := ep.e.table.Slot(slot); ok && cur == inc && v == w {
			break
		}
		w.dispatch.Unlock()
	}
	defer w.dispatch.Unlock()
	ep.mu.Lock()
	sub := subscriber{l: l, viewSlot: m.ViewSlot}
	if !slices.Contains(ep.subs[slot], sub) { // a sender resolving again (after a stale view) is one subscriber
		ep.subs[slot] = append(ep.subs[slot], sub)
	}
	only := len(ep.subs[slot]) == 1
	ep.mu.Unlock()
	if err := l.sendCtrl(wire.Ctrl{Type: wire.CtrlResolved, Seq: m.Seq, Slot: slot, Incarnation: inc}); err != nil {
		// Not a lost notice: the sender asks again (RESOLVE is sent again
		// when a stripe is replaced and on a timeout) and is answered
		// then. Every stripe of the link being replaced at once is how
		// this happens, after refused puts.
		return
	}
	cur := ep.e.desc.entry(slot)
	if err := ep.noticeLink(sub).notify(m.ViewSlot, cur); err != nil {
		if errors.Is(err, ErrInvalid) {
			ep.lostNotices.Add(1)
			return
		}
		// No live stripe, or the control share of the send queue full:
		// the entry is owed and pushed later, as by pushEntry.
		if !ep.owe(slot, []subscriber{sub}) {
			ep.e.desc.deferPush(w)
		}
		return
	}
	ep.notices.Add(1)
	if en, err := wire.UnmarshalEntry(cur); err == nil && only {
		// The one subscriber holds this entry: later pushes are judged
		// against it (Window.flush). With more, pushed stays the entry
		// the others were last sent.
		w.mu.Lock()
		w.pushed = en
		w.mu.Unlock()
	}
}

// reread refreshes v from its view slot and reports whether it took a
// newer entry.
func (ep *Endpoint) reread(v *remoteView) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sv == nil {
		return false
	}
	seq := v.sv.entry.Seq
	ep.refreshView(v)
	return v.sv.entry.Seq != seq
}

// notice handles a pushed entry update (engine callback).
func (ep *Endpoint) notice(wc verbs.WC, viewSlot uint32) {
	v := ep.view(viewSlot)
	if v == nil {
		return // released meanwhile
	}
	v.mu.Lock()
	if v.sv != nil {
		ep.refreshView(v)
	}
	v.mu.Unlock()
}

// refreshView re-reads v's view slot and wakes waiting puts if the entry
// is newer. The caller holds v.mu. A torn read (an update landing while it
// is read) is ignored: that update's own notice follows.
func (ep *Endpoint) refreshView(v *remoteView) {
	var buf [wire.EntrySize]byte
	off := int(v.viewSlot) * wire.EntrySize
	copy(buf[:], ep.viewMR.Bytes()[off:off+wire.EntrySize])
	e, err := wire.UnmarshalEntry(buf[:])
	if err != nil || !v.sv.update(e) {
		return
	}
	close(v.changed)
	v.changed = make(chan struct{})
}
