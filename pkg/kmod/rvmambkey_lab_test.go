//go:build lab

package kmod_test

import (
	"errors"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// mbAddr is kmod.MailboxAddr for offsets a test knows to be valid.
func mbAddr(t *testing.T, gen, off uint64) uint64 {
	t.Helper()
	a, err := kmod.MailboxAddr(gen, off)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newMailboxWindow creates a window with a mailbox key and checks the key's
// form: rxe has no region or memory window with such a key.
func newMailboxWindow(t *testing.T, mb *kmod.Mailboxes, kind kmod.CountKind) (uint32, uint32) {
	t.Helper()
	id, key, err := mb.CreateMailboxWindow(kind)
	if err != nil {
		t.Fatalf("CreateMailboxWindow(%v): %v", kind, err)
	}
	if key&0xf0000000 != 0xf0000000 || key>>8&0xfffff == 0 {
		t.Fatalf("window %d: mailbox key %#x", id, key)
	}
	return id, key
}

// A window with a mailbox key is written to without any key or address of
// its buffers: the module translates the generation and offset a write
// names into the pending buffer of that generation. Messages of one and of
// several packets (the later packets follow the first one's translation),
// with and without immediate, are placed and counted; a write that names a
// completed, an unposted or a far generation, or that does not fit, is
// refused at the sender and leaves memory untouched, and so is a write with
// the buffer's region key (the region is guarded: only translated writes get
// in, anywhere in it, even with no buffer left) and a read with the mailbox
// key. Buffers of such a window must lie in guarded regions, those of other
// windows outside them. A destroyed window's key is no longer translated.
func TestLabMailboxMailboxKey(t *testing.T) {
	labenv.Device(t)
	d := openDev(t)
	before := mbStats(t)
	mb := newMailboxes(t, d, 3, 4)
	id, key := newMailboxWindow(t, mb, kmod.CountBytes)
	id2, key2 := newMailboxWindow(t, mb, kmod.CountOps)
	if key2 == key {
		t.Fatalf("two windows with mailbox key %#x", key)
	}
	p := mbPair(t, 4, verbs.MTU1024)
	clear(p.dst.mr.Bytes())
	post := kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: page, Gen: 0, Record: 0}
	if err := mb.Post(id, post); !errors.Is(err, kmod.ErrGuard) {
		t.Fatalf("a post into an unguarded region: %v, want ErrGuard", err)
	}
	if err := mb.Guard(p.key()); err != nil {
		t.Fatalf("Guard: %v", err)
	}
	if err := mb.Guard(p.key()); err != nil {
		t.Fatalf("Guard again: %v", err)
	}
	plain := newWindow(t, mb, kmod.CountBytes)
	if err := mb.Post(plain, post); !errors.Is(err, kmod.ErrGuard) {
		t.Fatalf("a window without a mailbox key, into a guarded region: %v, want ErrGuard", err)
	}
	if err := mb.Post(id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: page,
		Gen: 0, Record: 0, Keyed: true, RKey: p.key()}); !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("a keyed post into a window with a mailbox key: %v, want ErrInvalid", err)
	}
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: page, Gen: 0, Record: 0})
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(page), Length: page, Threshold: 100, Gen: 1, Record: 1})

	var refusals uint64
	refused := func(what string, raddr uint64, rkey uint32, n int) {
		t.Helper()
		if err := p.writeKey(0, raddr, rkey, pattern(n, 99)); !errors.Is(err, verbs.WCRemAccessErr) {
			t.Fatalf("%s: %v, want %v", what, err, verbs.WCRemAccessErr)
		}
		refusals++
		if r := mb.Refused(id); r != refusals {
			t.Fatalf("%s: window refused %d, want %d", what, r, refusals)
		}
		p.reconnect()
	}

	// Generation 0 in two messages, the first of three packets.
	data := pattern(page, 5)
	if err := p.writeKey(0, mbAddr(t, 0, 0), key, data[:3000]); err != nil {
		t.Fatalf("three packets to generation 0: %v", err)
	}
	unpublished(t, mb, 0)
	checkBytes(t, p, 0, append(data[:3000:3000], make([]byte, page-3000)...))
	refused("a message beyond the buffer's end", mbAddr(t, 0, 3000), key, page-3000+1)
	if err := p.writeKey(3000, mbAddr(t, 0, 3000), key, data[3000:]); err != nil {
		t.Fatalf("the rest of generation 0: %v", err)
	}
	wantDone(t, mb, id, 1)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: page, Ops: 2, Cap: page})
	checkBytes(t, p, 0, data)

	refused("one packet to the completed generation", mbAddr(t, 0, 0), key, 8)
	refused("two packets to the completed generation", mbAddr(t, 0, 0), key, 2000)
	refused("a generation not posted", mbAddr(t, 2, 0), key, 8)
	refused("a generation 2^23 ahead", mbAddr(t, 1+1<<23, 0), key, 8)
	checkBytes(t, p, 0, data)
	checkBytes(t, p, page, make([]byte, page))

	// The region's own key reaches the open buffer's address, but only
	// translated writes pass the gate: refused there, counted per packet.
	refused("the region's key at generation 1's buffer", p.addr(page), p.key(), 8)
	checkBytes(t, p, page, make([]byte, page))
	// Nor anywhere else in the guarded region.
	if err := p.writeKey(0, p.addr(3*page), p.key(), pattern(8, 98)); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("the region's key outside any buffer: %v, want %v", err, verbs.WCRemAccessErr)
	}
	p.reconnect()
	checkBytes(t, p, 3*page, make([]byte, page))
	// A read with the mailbox key is not translated: rxe refuses the key.
	wr := verbs.SendWR{Op: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.src.mr.SGE(0, 8)},
		RemoteAddr: mbAddr(t, 1, 0), RKey: key}
	if err := p.src.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if err := p.waitOne(p.src); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("a read with the mailbox key: %v, want %v", err, verbs.WCRemAccessErr)
	}
	p.reconnect()

	// Generation 1 by a WRITE WITH IMMEDIATE at an offset; generation
	// numbers are matched modulo 2^24.
	next := pattern(100, 6)
	if err := p.dst.qp.PostRecv(verbs.RecvWR{ID: 1}); err != nil {
		t.Fatal(err)
	}
	copy(p.src.mr.Bytes(), next)
	wr = verbs.SendWR{Op: verbs.OpWriteImm, Flags: verbs.SendSignaled, Imm: 7,
		SGL: []verbs.SGE{p.src.mr.SGE(0, len(next))}, RemoteAddr: mbAddr(t, 1+1<<24, 50), RKey: key}
	if err := p.src.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if err := p.waitOne(p.src); err != nil {
		t.Fatalf("WRITE WITH IMMEDIATE to generation 1: %v", err)
	}
	if err := p.waitOne(p.dst); err != nil {
		t.Fatalf("its receive completion: %v", err)
	}
	wantDone(t, mb, id, 2)
	checkRecord(t, mb, 1, kmod.MailboxRecord{Epoch: 1, Addr: p.addr(page), Len: 100, Ops: 1, Cap: page})
	checkBytes(t, p, page, append(append(make([]byte, 50), next...), make([]byte, page-150)...))

	// The other window's key reaches only its own buffers.
	mustPost(t, mb, id2, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(2 * page), Length: page, Threshold: 1, Gen: 0, Record: 2})
	if err := p.writeKey(0, mbAddr(t, 0, 0), key2, next); err != nil {
		t.Fatalf("the ops window: %v", err)
	}
	wantDone(t, mb, id2, 1)
	checkRecord(t, mb, 2, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(2 * page), Len: 100, Ops: 1, Cap: page})

	// A destroyed window's key is refused by rxe, uncounted.
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(3 * page), Length: page, Threshold: page, Gen: 2, Record: 3})
	if err := mb.End(id, 2, kmod.RecordClosed, true); err != nil {
		t.Fatal(err)
	}
	if err := mb.DestroyWindow(id); err != nil {
		t.Fatal(err)
	}
	if err := p.writeKey(0, mbAddr(t, 2, 0), key, next); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("a destroyed window's key: %v, want %v", err, verbs.WCRemAccessErr)
	}
	checkBytes(t, p, 3*page, make([]byte, page))
	p.reconnect()
	// The region stays guarded without buffers.
	if err := p.writeKey(0, p.addr(3*page), p.key(), pattern(8, 97)); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("the region's key with no buffer left: %v, want %v", err, verbs.WCRemAccessErr)
	}
	checkBytes(t, p, 3*page, make([]byte, page))

	after := mbStats(t)
	if got := after.Translated - before.Translated; got != 4 {
		t.Errorf("translated %d messages, want 4", got)
	}
	if got := after.Untranslated - before.Untranslated; got != 5 {
		t.Errorf("untranslated %d messages, want 5 (the destroyed window's is rxe's alone)", got)
	}
	if got := after.Refused - before.Refused; got != 3 {
		t.Errorf("the gate refused %d packets, want 3", got)
	}
	if after.Unparsed != before.Unparsed {
		t.Errorf("unparsed packets: %d before, %d after", before.Unparsed, after.Unparsed)
	}
}

// Guard refuses regions it cannot guard and regions gated otherwise, and a
// guarded region is forgotten when it is deregistered: the memory takes
// writes again once registered anew.
func TestLabMailboxGuard(t *testing.T) {
	labenv.Device(t)
	d := openDev(t)
	mb := newMailboxes(t, d, 1, 1)
	p := mbPair(t, 1, verbs.MTU1024)
	local, err := p.dst.pd.AllocMR(page, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	if err := mb.Guard(local.LKey()); !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("Guard of a region without remote access: %v, want ErrInvalid", err)
	}
	if err := mb.Guard(0xf0000000); !errors.Is(err, kmod.ErrNotFound) {
		t.Fatalf("Guard of no region: %v, want ErrNotFound", err)
	}
	id := newWindow(t, mb, kmod.CountBytes)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: 100, Threshold: 100, Gen: 0, Record: 0})
	if err := mb.Guard(p.key()); !errors.Is(err, kmod.ErrBusy) {
		t.Fatalf("Guard of a region gated for a window without a mailbox key: %v, want ErrBusy", err)
	}
	other := newMailboxes(t, openDev(t), 1, 1)
	if err := other.Guard(p.key()); !errors.Is(err, kmod.ErrNotOwner) {
		t.Fatalf("Guard of a region another file gates: %v, want ErrNotOwner", err)
	}

	q := mbPair(t, 1, verbs.MTU1024)
	if err := mb.Guard(q.key()); err != nil {
		t.Fatal(err)
	}
	if err := q.writeKey(0, q.addr(0), q.key(), pattern(8, 1)); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("a write into a guarded region: %v, want %v", err, verbs.WCRemAccessErr)
	}
	q.reconnect()
	before := mbStats(t)
	if err := q.dst.mr.Close(); err != nil {
		t.Fatal(err)
	}
	if st := mbStats(t); st.MRs != before.MRs-1 {
		t.Fatalf("regions gated: %d before the deregistration, %d after", before.MRs, st.MRs)
	}
	mr, err := q.dst.pd.AllocMR(page, verbs.AccessAll|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mr.Close() })
	q.dst.mr = mr
	if err := q.writeKey(0, q.addr(0), q.key(), pattern(8, 2)); err != nil {
		t.Fatalf("a write into a region registered after the guarded one went: %v", err)
	}
}

// Writes to a window's mailbox key count against the window only from QPs
// of its buffers' protection domain: another PD's QP (another user's, say)
// writing to a generation never posted is refused by rxe all the same,
// counted in the module's untranslated, and leaves the owner's refused
// count alone.
func TestLabMailboxForeignPD(t *testing.T) {
	labenv.Device(t)
	d := openDev(t)
	mb := newMailboxes(t, d, 1, 2)
	id, key := newMailboxWindow(t, mb, kmod.CountBytes)
	own := mbPair(t, 2, verbs.MTU1024)
	foreign := mbPair(t, 2, verbs.MTU1024)
	if err := mb.Guard(own.key()); err != nil {
		t.Fatal(err)
	}
	mustPost(t, mb, id, kmod.MailboxPost{Key: own.key(), IOVA: own.addr(0), Length: page, Threshold: page, Gen: 0, Record: 0})
	before := mbStats(t)
	if err := foreign.writeKey(0, mbAddr(t, 5, 0), key, pattern(8, 1)); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("another PD's write to the mailbox key: %v, want %v", err, verbs.WCRemAccessErr)
	}
	if r := mb.Refused(id); r != 0 {
		t.Fatalf("another PD's write counted against the window: refused %d", r)
	}
	if st := mbStats(t); st.Untranslated != before.Untranslated+1 {
		t.Fatalf("untranslated %d, want %d", st.Untranslated, before.Untranslated+1)
	}
	foreign.reconnect()
	// another PD's write to the open generation is not translated either
	if err := foreign.writeKey(0, mbAddr(t, 0, 0), key, pattern(8, 1)); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("another PD's write to the open generation: %v, want %v", err, verbs.WCRemAccessErr)
	}
	foreign.reconnect()
	checkBytes(t, own, 0, make([]byte, page))
	if err := own.writeKey(0, mbAddr(t, 5, 0), key, pattern(8, 1)); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("the owner's write to a generation not posted: %v, want %v", err, verbs.WCRemAccessErr)
	}
	if r := mb.Refused(id); r != 1 {
		t.Fatalf("the owner's refused write: window refused %d, want 1", r)
	}
}

// A mailbox window with many pending buffers: a write names its
// generation by the low 24 bits, and the module finds that buffer in a
// tree by generation (not a walk of the pending list with interrupts off),
// whichever it is: the newest, one in the middle, the oldest. Pending
// generations of such a window may not span more than 2^24 (two would then
// share the low bits a write names): such a post is refused.
func TestLabMailboxManyPending(t *testing.T) {
	labenv.Device(t)
	d := openDev(t)
	const n, size = 400, 8 // buffers (gens 0..n-1), bytes each
	mb := newMailboxes(t, d, 1, n+1)
	id, key := newMailboxWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	clear(p.dst.mr.Bytes())
	if err := mb.Guard(p.key()); err != nil {
		t.Fatalf("Guard: %v", err)
	}
	for g := 0; g < n; g++ {
		mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(g * size), Length: size, Threshold: size,
			Gen: uint64(g), Record: uint32(g)})
	}
	for _, g := range []int{n - 1, n / 2, 0, 1} {
		data := pattern(size, byte(g))
		if err := p.writeKey(0, mbAddr(t, uint64(g)+1<<24, 0), key, data); err != nil {
			t.Fatalf("a write to generation %d of %d pending: %v", g, n, err)
		}
		checkBytes(t, p, g*size, data)
	}
	wantDone(t, mb, id, 2) // 0 and 1 published; n/2 and n-1 wait for 2
	far := kmod.MailboxPost{Key: p.key(), IOVA: p.addr(n * size), Length: size, Threshold: size, Record: n}
	far.Gen = 2 + 1<<24 // oldest pending 2: a span of 2^24
	if err := mb.Post(id, far); !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("a post 2^24 generations past the oldest pending: %v, want ErrInvalid", err)
	}
	far.Gen = 1 + 1<<24
	mustPost(t, mb, id, far)
	data := pattern(size, 0xee)
	if err := p.writeKey(0, mbAddr(t, far.Gen, 0), key, data); err != nil {
		t.Fatalf("a write to generation %d: %v", far.Gen, err)
	}
	checkBytes(t, p, n*size, data)
	if err := mb.End(id, 0, kmod.RecordClosed, true); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, id, far.Gen+1)
}
