package rvma

import (
	"fmt"
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// Mailbox is an RVMA mailbox address: a 64-bit number the receiving
// application chooses and senders name in puts. It is not a memory address;
// the buffers behind it rotate without it changing.
type Mailbox uint64

// String formats the address in hexadecimal, as the paper writes them.
func (m Mailbox) String() string { return fmt.Sprintf("%#x", uint64(m)) }

// MaxWindows is the number of windows one endpoint can have open (or
// lingering after close) at a time: InitWindow fails with ErrInvalid
// beyond it.
const MaxWindows = 4096

// mailboxTable maps mailbox addresses to slots, the small integers the
// wire carries, and slots back to their window. A slot keeps its mailbox
// while the window is open and while it lingers after Close (so that late
// senders get a NACK); Free releases it and bumps its incarnation, so a
// sender's cached (slot, incarnation) pair never reaches another window.
// It is safe for concurrent use.
type mailboxTable[V any] struct {
	mu     sync.RWMutex
	byAddr map[Mailbox]uint32
	slots  []tableSlot[V]
	free   []uint32 // freed slots, reused last-in first-out
	max    int
}

type tableSlot[V any] struct {
	used        bool
	mailbox     Mailbox
	incarnation uint32
	val         V
}

// newMailboxTable returns a table of at most max slots (wire.MaxSlots if max <= 0
// or larger).
func newMailboxTable[V any](max int) *mailboxTable[V] {
	if max <= 0 || max > wire.MaxSlots {
		max = wire.MaxSlots
	}
	return &mailboxTable[V]{byAddr: make(map[Mailbox]uint32), max: max}
}

// Add binds mb to a slot holding v. It fails with ErrInvalid when mb is
// already bound (open or lingering: Free it first) or when every slot is
// taken.
func (t *mailboxTable[V]) Add(mb Mailbox, v V) (slot, incarnation uint32, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.byAddr[mb]; ok {
		return 0, 0, invalidf("mailbox %v already has a window (slot %d)", mb, s)
	}
	switch {
	case len(t.free) > 0:
		slot = t.free[len(t.free)-1]
		t.free = t.free[:len(t.free)-1]
	case len(t.slots) < t.max:
		slot = uint32(len(t.slots))
		t.slots = append(t.slots, tableSlot[V]{})
	default:
		return 0, 0, invalidf("all %d mailbox slots are in use", t.max)
	}
	s := &t.slots[slot]
	s.used, s.mailbox, s.val = true, mb, v
	t.byAddr[mb] = slot
	return slot, s.incarnation, nil
}

// Lookup returns the slot, incarnation and value bound to mb.
func (t *mailboxTable[V]) Lookup(mb Mailbox) (slot, incarnation uint32, v V, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	slot, ok = t.byAddr[mb]
	if !ok {
		return 0, 0, v, false
	}
	s := &t.slots[slot]
	return slot, s.incarnation, s.val, true
}

// Slot returns the mailbox, incarnation and value of a slot in use.
func (t *mailboxTable[V]) Slot(slot uint32) (mb Mailbox, incarnation uint32, v V, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if int(slot) >= len(t.slots) || !t.slots[slot].used {
		return 0, 0, v, false
	}
	s := &t.slots[slot]
	return s.mailbox, s.incarnation, s.val, true
}

// Free releases a slot: its mailbox becomes unbound and its incarnation is
// bumped. Freeing a slot not in use, or with another incarnation than the
// caller holds, does nothing and returns false.
func (t *mailboxTable[V]) Free(slot, incarnation uint32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if int(slot) >= len(t.slots) {
		return false
	}
	s := &t.slots[slot]
	if !s.used || s.incarnation != incarnation {
		return false
	}
	delete(t.byAddr, s.mailbox)
	var zero V
	s.used, s.mailbox, s.val = false, 0, zero
	s.incarnation++
	t.free = append(t.free, slot)
	return true
}

// Values returns the values of the slots in use, in slot order.
func (t *mailboxTable[V]) Values() []V {
	t.mu.RLock()
	defer t.mu.RUnlock()
	vs := make([]V, 0, len(t.byAddr))
	for i := range t.slots {
		if t.slots[i].used {
			vs = append(vs, t.slots[i].val)
		}
	}
	return vs
}

// Len returns the number of slots in use.
func (t *mailboxTable[V]) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.byAddr)
}
