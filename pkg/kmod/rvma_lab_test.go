//go:build lab

package kmod_test

// Counted mailboxes (RVMA) in the kernel, on one guest in loopback on rxe0:
// plain RDMA WRITEs into posted buffers, through type 1 memory windows and
// through the region's rkey, are placed and counted by the module, which
// publishes each buffer's record in generation order once its threshold is
// reached. Every test checks the bytes that arrived.
//
// Run: go run ./test/softroce gotest ./pkg/kmod -test.run 'TestLabMailbox' -test.v

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// newMailboxes sets up Mailboxes, armed for their first publication.
func newMailboxes(t *testing.T, d *kmod.Device, windows, records int) *kmod.Mailboxes {
	t.Helper()
	mb, err := d.Mailboxes(windows, records)
	if err != nil {
		t.Fatalf("Mailboxes(%d, %d): %v", windows, records, err)
	}
	t.Cleanup(func() { mb.Close() })
	mustArm(t, mb)
	return mb
}

func mustArm(t *testing.T, mb *kmod.Mailboxes) {
	t.Helper()
	if err := mb.Arm(); err != nil {
		t.Fatalf("Arm: %v", err)
	}
}

func newWindow(t *testing.T, mb *kmod.Mailboxes, kind kmod.CountKind) uint32 {
	t.Helper()
	id, err := mb.CreateWindow(kind)
	if err != nil {
		t.Fatalf("CreateWindow(%v): %v", kind, err)
	}
	return id
}

func mustPost(t *testing.T, mb *kmod.Mailboxes, id uint32, p kmod.MailboxPost) {
	t.Helper()
	if err := mb.Post(id, p); err != nil {
		t.Fatalf("Post(%d, %+v): %v", id, p, err)
	}
}

// mbPair is a loopback pair whose regions allow memory window binds.
func mbPair(t *testing.T, pages int, mtu verbs.MTU) *pair {
	t.Helper()
	return newPairWith(t, pages, verbs.AccessAll|verbs.AccessMWBind, mtu)
}

// writeKey writes data from the source's buffer at soff to raddr with
// rkey and returns the completion's error.
func (p *pair) writeKey(soff int, raddr uint64, rkey uint32, data []byte) error {
	p.t.Helper()
	copy(p.src.mr.Bytes()[soff:], data)
	wr := verbs.SendWR{ID: raddr, Op: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{p.src.mr.SGE(soff, len(data))}, RemoteAddr: raddr, RKey: rkey}
	if err := p.src.qp.PostSend(wr); err != nil {
		p.t.Fatalf("PostSend: %v", err)
	}
	return p.waitOne(p.src)
}

// bindMW binds a type 1 memory window over n bytes at off of the target
// region, with remote write and read, and returns its rkey.
func (p *pair) bindMW(off, n int) uint32 {
	p.t.Helper()
	mw, err := p.dst.pd.AllocMW(verbs.MWType1)
	if err != nil {
		p.t.Fatalf("AllocMW: %v", err)
	}
	p.t.Cleanup(func() { mw.Close() })
	key, err := p.dst.qp.BindMW(mw, p.dst.mr, p.addr(off), uint64(n),
		verbs.AccessRemoteWrite|verbs.AccessRemoteRead, 1, verbs.SendSignaled)
	if err != nil {
		p.t.Fatalf("BindMW: %v", err)
	}
	if err := p.waitOne(p.dst); err != nil {
		p.t.Fatalf("bind completion: %v", err)
	}
	return key
}

func mbStats(t *testing.T) kmod.MailboxStats {
	t.Helper()
	st, err := kmod.MailboxStatsFromSysfs("")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkRecord checks record i against want (Seq ignored).
func checkRecord(t *testing.T, mb *kmod.Mailboxes, i int, want kmod.MailboxRecord) {
	t.Helper()
	r, ok := mb.LoadRecord(i)
	if !ok {
		t.Fatalf("record %d: never published, want %+v", i, want)
	}
	if r.Seq%2 != 0 || r.Seq == 0 {
		t.Errorf("record %d: seq %d", i, r.Seq)
	}
	r.Seq = 0
	if r != want {
		t.Fatalf("record %d: %+v, want %+v", i, r, want)
	}
}

func unpublished(t *testing.T, mb *kmod.Mailboxes, i int) {
	t.Helper()
	if r, ok := mb.LoadRecord(i); ok {
		t.Fatalf("record %d published early: %+v", i, r)
	}
}

func wantDone(t *testing.T, mb *kmod.Mailboxes, id uint32, want uint64) {
	t.Helper()
	if got := mb.Done(id); got != want {
		t.Fatalf("window %d: done %d, want %d", id, got, want)
	}
}

// waitSignal checks that Wait returns at once (a publication signalled
// it) and that no further signal is pending, then arms again.
func waitSignal(t *testing.T, mb *kmod.Mailboxes) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := mb.Wait(ctx); err != nil {
		t.Fatalf("Wait after a publication: %v", err)
	}
	noSignal(t, mb, "second Wait (the signal was consumed)")
	mustArm(t, mb)
}

// noSignal checks that no signal is pending.
func noSignal(t *testing.T, mb *kmod.Mailboxes, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := mb.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s: %v, want the deadline", what, err)
	}
}

// The eventfd is signalled only when armed, once per Arm: publications
// with nobody armed (a process polling its records) wake nobody.
func TestLabMailboxArm(t *testing.T) {
	d := openDev(t)
	mb, err := d.Mailboxes(1, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	for g := 0; g < 4; g++ {
		mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(g * 1024), Length: 1024, Threshold: 1024,
			Gen: uint64(g), Record: uint32(g)})
	}
	data := pattern(4096, 9)
	put := func(g int) {
		t.Helper()
		if err := p.write(g*1024, g*1024, data[g*1024:(g+1)*1024]); err != nil {
			t.Fatalf("put %d: %v", g, err)
		}
		wantDone(t, mb, id, uint64(g+1))
	}
	put(0) // unarmed
	noSignal(t, mb, "Wait after an unarmed publication")
	mustArm(t, mb)
	mustArm(t, mb) // arming twice still signals once
	put(1)
	waitSignal(t, mb) // and arms again
	put(2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := mb.Wait(ctx); err != nil {
		t.Fatalf("Wait after an armed publication: %v", err)
	}
	put(3) // not armed since
	noSignal(t, mb, "Wait after a publication past the armed one")
	checkBytes(t, p, 0, data)
}

func checkBytes(t *testing.T, p *pair, off int, want []byte) {
	t.Helper()
	if got := p.dst.mr.Bytes()[off : off+len(want)]; !bytes.Equal(got, want) {
		t.Fatalf("target bytes at %d differ from what was written", off)
	}
}

// A bytes window with two buffers in one region: gen 0 filled through a
// memory window bound over it, gen 1 through the region's rkey, each by
// puts in reverse offset order. A record appears only after the last put.
func TestLabMailboxBytes(t *testing.T) {
	d := openDev(t)
	if !d.Version().Mailboxes {
		t.Fatalf("module version %+v: no mailboxes", d.Version())
	}
	before := mbStats(t)
	mb := newMailboxes(t, d, 4, 8)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 2, verbs.MTU1024)
	key := p.dst.mr.RKey()
	mustPost(t, mb, id, kmod.MailboxPost{Key: key, IOVA: p.addr(0), Length: page, Threshold: page, Gen: 0, Record: 3})
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.dst.mr.LKey(), IOVA: p.addr(page), Length: page, Threshold: page,
		Gen: 1, Record: 5, OneTime: true})
	wantDone(t, mb, id, 0)

	mwKey := p.bindMW(0, page)
	data := pattern(2*page, 11)
	for i := 3; i >= 0; i-- {
		if err := p.writeKey(i*1024, p.addr(i*1024), mwKey, data[i*1024:(i+1)*1024]); err != nil {
			t.Fatalf("put %d through the memory window: %v", i, err)
		}
		if i > 0 {
			unpublished(t, mb, 3)
			wantDone(t, mb, id, 0)
		}
	}
	wantDone(t, mb, id, 1)
	checkRecord(t, mb, 3, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: page, Ops: 4, Cap: page})
	checkBytes(t, p, 0, data[:page])
	waitSignal(t, mb)

	for i := 3; i >= 0; i-- {
		off := page + i*1024
		if err := p.writeKey(off, p.addr(off), key, data[off:off+1024]); err != nil {
			t.Fatalf("put %d through the region's rkey: %v", i, err)
		}
		if i > 0 {
			unpublished(t, mb, 5)
		}
	}
	wantDone(t, mb, id, 2)
	checkRecord(t, mb, 5, kmod.MailboxRecord{Epoch: 1, Addr: p.addr(page), Len: page, Ops: 4, Cap: page,
		Flags: kmod.RecordOneTime})
	checkBytes(t, p, 0, data)
	waitSignal(t, mb)
	if r := mb.Refused(id); r != 0 {
		t.Fatalf("refused %d", r)
	}
	after := mbStats(t)
	if after.Packets-before.Packets != 8 || after.Bytes-before.Bytes != 2*page ||
		after.Published-before.Published != 2 || after.Unparsed != 0 {
		t.Fatalf("counters before %+v, after %+v", before, after)
	}
}

// Generation 1 filled before generation 0: nothing is published until
// generation 0 completes, then both, in order.
func TestLabMailboxOrder(t *testing.T) {
	d := openDev(t)
	mb := newMailboxes(t, d, 1, 2)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: 2048, Threshold: 2048, Gen: 7, Record: 0})
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(2048), Length: 2048, Threshold: 2000, Gen: 8, Record: 1})
	data := pattern(page, 3)
	for _, off := range []int{3072, 2048} {
		if err := p.write(off, off, data[off:off+1024]); err != nil {
			t.Fatal(err)
		}
	}
	unpublished(t, mb, 1)
	unpublished(t, mb, 0)
	wantDone(t, mb, id, 0)
	if err := p.write(0, 0, data[:1024]); err != nil {
		t.Fatal(err)
	}
	unpublished(t, mb, 0)
	if err := p.write(1024, 1024, data[1024:2048]); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, id, 9)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 7, Addr: p.addr(0), Len: 2048, Ops: 2, Cap: 2048})
	// 2048 bytes counted against a threshold of 2000: late.
	checkRecord(t, mb, 1, kmod.MailboxRecord{Epoch: 8, Addr: p.addr(2048), Len: 2048, Ops: 2, Cap: 2048,
		Flags: kmod.RecordLate})
	checkBytes(t, p, 0, data)
	waitSignal(t, mb)
}

// PostMany registers several buffers in one call, in order: each is
// counted and published as if posted alone. A call whose second post is
// refused registers the first and reports it.
func TestLabMailboxPostMany(t *testing.T) {
	d := openDev(t)
	mb := newMailboxes(t, d, 1, 4)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	posts := make([]kmod.MailboxPost, 3)
	for g := range posts {
		posts[g] = kmod.MailboxPost{Key: p.key(), IOVA: p.addr(g * 1024), Length: 1024, Threshold: 1024,
			Gen: uint64(g), Record: uint32(g)}
	}
	if n, err := mb.PostMany(id, posts); n != 3 || err != nil {
		t.Fatalf("PostMany: %d, %v", n, err)
	}
	data := pattern(3*1024, 9)
	for _, g := range []int{2, 0, 1} {
		if err := p.write(g*1024, g*1024, data[g*1024:(g+1)*1024]); err != nil {
			t.Fatal(err)
		}
	}
	wantDone(t, mb, id, 3)
	for g := range posts {
		checkRecord(t, mb, g, kmod.MailboxRecord{Epoch: uint64(g), Addr: p.addr(g * 1024), Len: 1024, Ops: 1, Cap: 1024})
	}
	checkBytes(t, p, 0, data)

	// The second post's threshold exceeds its buffer: the first stays.
	bad := []kmod.MailboxPost{
		{Key: p.key(), IOVA: p.addr(3072), Length: 512, Threshold: 512, Gen: 3, Record: 3},
		{Key: p.key(), IOVA: p.addr(3584), Length: 512, Threshold: 513, Gen: 4, Record: 0},
	}
	n, err := mb.PostMany(id, bad)
	if n != 1 || !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("PostMany with a bad second post: %d, %v; want 1, ErrInvalid", n, err)
	}
	tail := pattern(512, 4)
	if err := p.write(3072, 3072, tail); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, id, 4)
	checkRecord(t, mb, 3, kmod.MailboxRecord{Epoch: 3, Addr: p.addr(3072), Len: 512, Ops: 1, Cap: 512})
	if n, err := mb.PostMany(id, nil); n != 0 || err != nil {
		t.Fatalf("PostMany of nothing: %d, %v", n, err)
	}
}

// A buffer re-posted over its own closed range (how a window's buffers
// rotate) takes the module's short path: no region lookup, no allocation.
// It must keep every rule of a first post: the generation order and busy
// record checks, refusal while the range is pending, and a move to
// another window, whose counting it then joins while the first window
// sees nothing more. The module's range count does not grow.
func TestLabMailboxRepost(t *testing.T) {
	d := openDev(t)
	mb := newMailboxes(t, d, 2, 4)
	a, b := newWindow(t, mb, kmod.CountBytes), newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	buf := func(gen uint64, rec uint32) kmod.MailboxPost {
		return kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: 1024, Threshold: 1024, Gen: gen, Record: rec}
	}
	mustPost(t, mb, a, buf(0, 0))
	ranges := mbStats(t).Ranges
	data := pattern(4*1024, 21)
	put := func(i int) {
		t.Helper()
		if err := p.write(i*1024, 0, data[i*1024:(i+1)*1024]); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	put(0)
	wantDone(t, mb, a, 1)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: 1024, Ops: 1, Cap: 1024})

	if err := mb.Post(a, buf(0, 1)); !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("re-post for an earlier generation: %v, want ErrInvalid", err)
	}
	mustPost(t, mb, a, buf(1, 2))
	if err := mb.Post(b, buf(0, 1)); !errors.Is(err, kmod.ErrBusy) {
		t.Fatalf("post of a pending range into another window: %v, want ErrBusy", err)
	}
	put(1)
	wantDone(t, mb, a, 2)
	checkRecord(t, mb, 2, kmod.MailboxRecord{Epoch: 1, Addr: p.addr(0), Len: 1024, Ops: 1, Cap: 1024})

	// The closed range moves to window b, behind a first post there.
	mustPost(t, mb, b, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(2048), Length: 1024, Threshold: 1024, Gen: 0, Record: 3})
	if err := mb.Post(b, buf(1, 3)); !errors.Is(err, kmod.ErrBusy) {
		t.Fatalf("re-post with a record still pending: %v, want ErrBusy", err)
	}
	mustPost(t, mb, b, buf(1, 1))
	if got := mbStats(t).Ranges; got != ranges+1 {
		t.Fatalf("ranges %d after re-posts, want %d (one first post since)", got, ranges+1)
	}
	put(2) // into window b's generation 1, behind its generation 0
	wantDone(t, mb, b, 0)
	if err := p.write(3*1024, 2048, data[3*1024:]); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, b, 2)
	wantDone(t, mb, a, 2)
	checkRecord(t, mb, 1, kmod.MailboxRecord{Epoch: 1, Addr: p.addr(0), Len: 1024, Ops: 1, Cap: 1024})
	checkRecord(t, mb, 3, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(2048), Len: 1024, Ops: 1, Cap: 1024})
	checkBytes(t, p, 0, data[2*1024:3*1024])
	checkBytes(t, p, 2048, data[3*1024:])
	if r := mb.Refused(a) + mb.Refused(b); r != 0 {
		t.Fatalf("refused %d", r)
	}

	// A range that only starts where a closed one starts is no re-post:
	// the first post's rules apply (the closed range is replaced).
	mustPost(t, mb, a, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: 512, Threshold: 512, Gen: 2, Record: 0})
	if err := p.write(0, 0, data[:512]); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, a, 3)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 2, Addr: p.addr(0), Len: 512, Ops: 1, Cap: 512})
}

// An ops window counts WRITE messages, not packets: three 10000-byte
// WRITEs of 10 packets each (MTU 1024), and of 3 packets each (MTU 4096).
func TestLabMailboxOps(t *testing.T) {
	for _, mtu := range []verbs.MTU{verbs.MTU1024, verbs.MTU4096} {
		d := openDev(t)
		before := mbStats(t)
		mb := newMailboxes(t, d, 1, 1)
		id := newWindow(t, mb, kmod.CountOps)
		p := mbPair(t, 8, mtu)
		const msg = 10000
		mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(100), Length: 3 * msg, Threshold: 3, Gen: 0, Record: 0})
		data := pattern(3*msg, 5)
		for i := 0; i < 3; i++ {
			if err := p.write(i*msg, 100+i*msg, data[i*msg:(i+1)*msg]); err != nil {
				t.Fatalf("MTU %v, WRITE %d: %v", mtu, i, err)
			}
			if i < 2 {
				unpublished(t, mb, 0)
			}
		}
		wantDone(t, mb, id, 1)
		checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(100), Len: 3 * msg, Ops: 3, Cap: 3 * msg})
		checkBytes(t, p, 100, data)
		after := mbStats(t)
		per := 10
		if mtu == verbs.MTU4096 {
			per = 3
		}
		if after.Packets-before.Packets != uint64(3*per) || after.Unparsed != 0 {
			t.Fatalf("MTU %v: counters before %+v, after %+v", mtu, before, after)
		}
		waitSignal(t, mb)
		mb.Close()
		d.Close()
	}
}

// A write after the buffer completed is refused: the sender's WRITE fails
// with a remote access error, the bytes stay as they were.
func TestLabMailboxLateWrite(t *testing.T) {
	d := openDev(t)
	before := mbStats(t)
	mb := newMailboxes(t, d, 1, 1)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: 1024, Threshold: 1024, Gen: 0, Record: 0})
	data := pattern(1024, 9)
	if err := p.write(0, 0, data); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, id, 1)
	err := p.write(2048, 0, pattern(512, 77))
	if !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("write after completion: %v, want %v", err, verbs.WCRemAccessErr)
	}
	checkBytes(t, p, 0, data)
	if r := mb.Refused(id); r != 1 {
		t.Fatalf("window refused %d, want 1", r)
	}
	if after := mbStats(t); after.Refused-before.Refused != 1 {
		t.Fatalf("module refused %d -> %d", before.Refused, after.Refused)
	}
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: 1024, Ops: 1, Cap: 1024})
}

// A write straddling a buffer's edge is refused too.
func TestLabMailboxStraddle(t *testing.T) {
	d := openDev(t)
	mb := newMailboxes(t, d, 1, 1)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(1024), Length: 1024, Threshold: 1024, Gen: 0, Record: 0})
	clear(p.dst.mr.Bytes())
	if err := p.write(0, 512, pattern(1024, 1)); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("write into the buffer's start from before it: %v, want %v", err, verbs.WCRemAccessErr)
	}
	checkBytes(t, p, 0, make([]byte, 4096))
	if r := mb.Refused(id); r != 1 {
		t.Fatalf("window refused %d, want 1", r)
	}
	unpublished(t, mb, 0)
}

// END: PARTIAL publishes the true counts; END_F_ALL with CLOSED ends every
// later pending generation; a published generation is not pending.
func TestLabMailboxEnd(t *testing.T) {
	d := openDev(t)
	mb := newMailboxes(t, d, 1, 4)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 3, verbs.MTU1024)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: page, Gen: 0, Record: 0})
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(page), Length: page, Threshold: page, Gen: 1, Record: 1})
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(2 * page), Length: page, Threshold: page, Gen: 2, Record: 2})
	data := pattern(1000, 4)
	if err := p.write(0, 0, data); err != nil {
		t.Fatal(err)
	}
	if err := p.write(0, 2*page, data[:100]); err != nil {
		t.Fatal(err)
	}
	if err := mb.End(id, 0, kmod.RecordPartial, false); err != nil {
		t.Fatalf("End(0, partial): %v", err)
	}
	wantDone(t, mb, id, 1)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: 1000, Ops: 1, Cap: page, Flags: kmod.RecordPartial})
	waitSignal(t, mb)
	if err := mb.End(id, 1, kmod.RecordClosed, true); err != nil {
		t.Fatalf("End(1.., closed, all): %v", err)
	}
	wantDone(t, mb, id, 3)
	checkRecord(t, mb, 1, kmod.MailboxRecord{Epoch: 1, Addr: p.addr(page), Cap: page, Flags: kmod.RecordClosed})
	checkRecord(t, mb, 2, kmod.MailboxRecord{Epoch: 2, Addr: p.addr(2 * page), Len: 100, Ops: 1, Cap: page, Flags: kmod.RecordClosed})
	checkBytes(t, p, 0, data)
	checkBytes(t, p, 2*page, data[:100])
	waitSignal(t, mb)
	for _, c := range []struct {
		gen uint64
		all bool
	}{{0, false}, {2, false}, {0, true}, {9, false}} {
		if err := mb.End(id, c.gen, kmod.RecordPartial, c.all); !errors.Is(err, kmod.ErrNotFound) {
			t.Errorf("End(%d, all %v) with nothing pending: %v, want ErrNotFound", c.gen, c.all, err)
		}
	}
	if err := mb.End(id, 0, kmod.RecordLate, false); !errors.Is(err, kmod.ErrInvalid) {
		t.Errorf("End with the late flag: %v, want ErrInvalid", err)
	}
	// A new buffer over the published one replaces it.
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: 2 * page, Threshold: 10, Gen: 3, Record: 0})
	if err := p.write(0, 0, data[:10]); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, id, 4)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 3, Addr: p.addr(0), Len: 10, Ops: 1, Cap: 2 * page})
}

// A READ of a gated range is served from memory, and counts nothing.
func TestLabMailboxRead(t *testing.T) {
	d := openDev(t)
	mb := newMailboxes(t, d, 1, 1)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 2, verbs.MTU1024)
	data := pattern(2*page, 21)
	copy(p.dst.mr.Bytes(), data)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: 2 * page, Threshold: 2 * page, Gen: 0, Record: 0})
	got, err := p.read(0, 0, 2*page)
	if err != nil {
		t.Fatalf("READ of a gated range: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("READ of a gated range returned other bytes")
	}
	unpublished(t, mb, 0)
	wantDone(t, mb, id, 0)
	if err := p.write(0, 0, data[:2*page]); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, id, 1)
	mwKey := p.bindMW(0, 2*page)
	clear(p.src.mr.Bytes())
	wr := verbs.SendWR{ID: 9, Op: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.src.mr.SGE(0, 2*page)},
		RemoteAddr: p.addr(0), RKey: mwKey}
	if err := p.src.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if err := p.waitOne(p.src); err != nil {
		t.Fatalf("READ of a published range through a memory window: %v", err)
	}
	if !bytes.Equal(p.src.mr.Bytes()[:2*page], data) {
		t.Fatal("READ through the memory window returned other bytes")
	}
}

// Closing the file with pending ranges forgets them: writes go through
// ungated afterwards, the module gates nothing and, with Active Access
// idle, its hooks are unregistered.
func TestLabMailboxCloseUngates(t *testing.T) {
	d := openDev(t)
	d2, err := kmod.Open()
	if err != nil {
		t.Fatal(err)
	}
	mb := newMailboxes(t, d2, 2, 2)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 2, verbs.MTU1024)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: page, Gen: 0, Record: 0})
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(page), Length: page, Threshold: 1, Gen: 1, Record: 1})
	if err := p.write(0, 0, pattern(100, 1)); err != nil {
		t.Fatal(err)
	}
	if st := mbStats(t); st.Ranges < 2 || st.MRs < 1 || st.Windows < 1 {
		t.Fatalf("while gated: %+v", st)
	}
	if st, err := d.Stats(); err != nil || !st.HooksArmed {
		t.Fatalf("while gated: hooks armed %v (%v)", st.HooksArmed, err)
	}
	// The raw file goes away with its ranges pending (the kernel's
	// release, not Mailboxes.Close).
	kmod.DropFileForTest(d2, mb)
	data := pattern(2*page, 2)
	if err := p.write(0, 0, data); err != nil {
		t.Fatalf("write after the close: %v", err)
	}
	if err := p.write(0, 0, data); err != nil {
		t.Fatalf("second write after the close: %v", err)
	}
	checkBytes(t, p, 0, data)
	var st kmod.MailboxStats
	for i := 0; i < 100; i++ {
		if st = mbStats(t); st.Ranges == 0 && st.MRs == 0 && st.Windows == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Ranges != 0 || st.MRs != 0 || st.Windows != 0 || st.Unparsed != 0 {
		t.Fatalf("after the close: %+v", st)
	}
	idle(t, d)
}

// Mailboxes.Close forgets its windows too, and the Device keeps working;
// a second Mailboxes on the same Device is refused.
func TestLabMailboxClose(t *testing.T) {
	d := openDev(t)
	mb := newMailboxes(t, d, 1, 1)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: 1, Gen: 0, Record: 0})
	done := make(chan error, 1)
	go func() { done <- mb.Wait(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	if err := mb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, kmod.ErrClosed) {
			t.Fatalf("Wait across Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after Close")
	}
	if err := mb.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if mb.Record(0) != nil || mb.Done(id) != 0 {
		t.Fatal("the mapping is still readable after Close")
	}
	if _, err := mb.CreateWindow(kmod.CountBytes); !errors.Is(err, kmod.ErrClosed) {
		t.Fatalf("CreateWindow after Close: %v", err)
	}
	if err := p.write(0, 0, pattern(page, 8)); err != nil {
		t.Fatalf("write after Close: %v", err)
	}
	checkBytes(t, p, 0, pattern(page, 8))
	if _, err := d.Mailboxes(1, 1); !errors.Is(err, kmod.ErrBusy) {
		t.Fatalf("second Mailboxes: %v, want ErrBusy", err)
	}
	if _, err := d.Mailboxes(0, 1); !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("Mailboxes(0, 1): %v, want ErrInvalid", err)
	}
	idle(t, d)
}

// WRITE_WITH_IMM messages (ONLY_WITH_IMMEDIATE, and FIRST, MIDDLE,
// LAST_WITH_IMMEDIATE across packets) are placed and counted like plain
// WRITEs: the parse finds the immediate's header too.
func TestLabMailboxWriteImm(t *testing.T) {
	d := openDev(t)
	before := mbStats(t)
	mb := newMailboxes(t, d, 1, 1)
	id := newWindow(t, mb, kmod.CountOps)
	p := mbPair(t, 2, verbs.MTU1024)
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: 2 * page, Threshold: 2, Gen: 0, Record: 0})
	data := pattern(2*page, 6)
	for i, r := range [][2]int{{0, 1000}, {1000, 2*page - 1000}} {
		if err := p.dst.qp.PostRecv(verbs.RecvWR{ID: uint64(i)}); err != nil {
			t.Fatalf("PostRecv: %v", err)
		}
		copy(p.src.mr.Bytes()[r[0]:], data[r[0]:r[0]+r[1]])
		wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpWriteImm, Flags: verbs.SendSignaled, Imm: uint32(i),
			SGL: []verbs.SGE{p.src.mr.SGE(r[0], r[1])}, RemoteAddr: p.addr(r[0]), RKey: p.key()}
		if err := p.src.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if err := p.waitOne(p.src); err != nil {
			t.Fatalf("WRITE_WITH_IMM %d: %v", i, err)
		}
		if err := p.waitOne(p.dst); err != nil {
			t.Fatalf("its receive completion: %v", err)
		}
		if i == 0 {
			unpublished(t, mb, 0)
		}
	}
	wantDone(t, mb, id, 1)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: 2 * page, Ops: 2, Cap: 2 * page})
	checkBytes(t, p, 0, data)
	if after := mbStats(t); after.Unparsed != 0 || after.Packets-before.Packets != 1+8 {
		t.Fatalf("counters before %+v, after %+v", before, after)
	}
}
