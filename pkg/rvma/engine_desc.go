package rvma

import (
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// descTable is the descriptor table senders read (an RDMA READ, or the
// copy a push carries): one entry of wire.EntrySize bytes per slot,
// written by the receiver's CPU under the entry's own checksum, and the
// pushes of entries deferred to the next idle poll. The engine publishes
// through it (entryChanged, flushPushes): it knows which window holds a
// slot and which senders subscribe to it.
//
// Lock order: a window's dispatch lock, then mu (shared by the writers of
// entries and the pushes; Close alone takes it exclusively), then the
// mailbox table's lock, the links' (pushEntry) and pushMu. pushMu is a
// leaf, also taken under the endpoint's mu (deferPush).
type descTable struct {
	mr   *verbs.MR   // the table, remote read
	fail func(error) // engine.fail

	// mu guards the table's memory against Close: writers of entries
	// hold it shared and skip the write once gone is set, which Close
	// does before it releases the MR.
	mu   sync.RWMutex
	gone bool

	// While the progress loop is parked (progress.parked), pushSoon
	// pushes are deferred to the next idle poll (pushes), so that a
	// notice does not go out between an arrival and the application's
	// answer to it; so are pushes that could not reach every subscriber.
	pushMu sync.Mutex
	pushes map[uint32]pendingPush
}

// entry returns the table's bytes of slot.
func (d *descTable) entry(slot uint32) []byte {
	off := int(slot) * wire.EntrySize
	return d.mr.Bytes()[off : off+wire.EntrySize]
}

// close makes every later write skip the table: what the windows do from
// now on publishes nothing. The engine calls it before it releases the MR.
func (d *descTable) close() {
	d.mu.Lock()
	d.gone = true
	d.mu.Unlock()
}

// entryChanged writes the window's entry into the descriptor table and,
// unless push is pushNone, to the window's subscribers: a pushSoon waits
// for the next idle poll while the progress loop is parked. A window
// already freed (engine.free) publishes nothing: its slot may belong to
// another one; nor does any window once Close released the table.
func (e *engine) entryChanged(w *Window, en wire.Entry, push pushMode) {
	e.desc.mu.RLock()
	defer e.desc.mu.RUnlock()
	if e.desc.gone {
		return
	}
	if _, inc, cur, ok := e.table.Slot(w.slot); !ok || cur != w || inc != w.incarnation {
		return
	}
	mem := e.desc.write(w.slot, &en)
	if mem == nil || push == pushNone || e.links == nil {
		return
	}
	if push == pushSoon && en.State == wire.StateOpen {
		e.desc.pushMu.Lock()
		e.desc.pushes[w.slot] = pendingPush{w: w, all: true}
		e.desc.pushMu.Unlock()
		if e.prog.parked.Load() {
			return // the spinner's next idle poll, or the loop when it wakes, pushes it
		}
	}
	// Pushed now: a deferred push of the same window is done by this one.
	e.desc.pushMu.Lock()
	if p, ok := e.desc.pushes[w.slot]; ok && p.w == w {
		delete(e.desc.pushes, w.slot)
	}
	e.desc.pushMu.Unlock()
	if !e.links.pushEntry(w.slot, mem, true) {
		e.desc.deferPush(w)
	}
}

// pendingPush is an entry push deferred to the next idle poll: to every
// subscriber (all), or only to those a push could not reach.
type pendingPush struct {
	w   *Window
	all bool
}

// deferPush makes the next idle poll (flushPushes) push w's entry to the
// subscribers a push could not reach (linkHandler.pushEntry).
func (d *descTable) deferPush(w *Window) {
	d.pushMu.Lock()
	if p, ok := d.pushes[w.slot]; !ok || p.w != w {
		d.pushes[w.slot] = pendingPush{w: w}
	}
	d.pushMu.Unlock()
}

// write writes en into slot of the descriptor table under the
// entry's own checksum (readers retry on a torn read) and returns the
// table's bytes of the slot (nil if en does not encode). The caller holds
// the window's dispatch lock.
func (d *descTable) write(slot uint32, en *wire.Entry) []byte {
	mem := d.entry(slot)
	var tmp [wire.EntrySize]byte
	if err := wire.MarshalEntry(tmp[:], en); err != nil {
		d.fail(err)
		return nil
	}
	mem[0] |= 1 // odd: being written
	copy(mem[8:], tmp[8:])
	copy(mem[:8], tmp[:8])
	return mem
}

// subscribers is the number of senders holding a view of slot.
func (e *engine) subscribers(slot uint32) int {
	if e.links == nil {
		return 0
	}
	return e.links.subscribers(slot)
}

// flushPushes pushes the deferred entries. The caller holds no window's
// dispatch lock.
func (e *engine) flushPushes() {
	e.desc.pushMu.Lock()
	if len(e.desc.pushes) == 0 {
		e.desc.pushMu.Unlock()
		return
	}
	pending := e.desc.pushes
	e.desc.pushes = make(map[uint32]pendingPush, len(pending))
	e.desc.pushMu.Unlock()
	for slot, p := range pending {
		w := p.w
		w.dispatch.Lock()
		e.desc.mu.RLock() // after dispatch, as in entryChanged
		if _, _, cur, ok := e.table.Slot(slot); ok && cur == w && !e.desc.gone {
			if !e.links.pushEntry(slot, e.desc.entry(slot), p.all) {
				e.desc.deferPush(w)
			}
		}
		e.desc.mu.RUnlock()
		w.dispatch.Unlock()
	}
}
