//go:build lab

package kmod_test

import (
	"encoding/binary"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// reconnect gives the pair two new connected QPs on its PDs and CQs: a
// refused write leaves both QPs of a connection in the error state. The
// target's region and the memory windows bound over it stay.
func (p *pair) reconnect() {
	p.t.Helper()
	newQP := func(s *side) *verbs.QP {
		qp, err := s.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: s.cq, RecvCQ: s.cq,
			Cap: verbs.QPCap{MaxSendWR: 512, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			p.t.Fatal(err)
		}
		return qp
	}
	gid, err := p.ctx.RoCEv2GID(1, nil)
	if err != nil {
		p.t.Fatal(err)
	}
	src, dst := newQP(p.src), newQP(p.dst)
	ia := verbs.QPInfo{QPN: src.QPN(), PSN: 100, GID: gid.GID}
	ib := verbs.QPInfo{QPN: dst.QPN(), PSN: 200, GID: gid.GID}
	opts := &verbs.ConnectOptions{GIDIndex: gid.Index, PathMTU: verbs.MTU1024}
	if err := src.Connect(ia, ib, opts); err != nil {
		p.t.Fatal(err)
	}
	if err := dst.Connect(ib, ia, opts); err != nil {
		p.t.Fatal(err)
	}
	p.src.keep, p.dst.keep = nil, nil
	p.src.qp, p.dst.qp = src, dst
}

// A keyed buffer lets in only the messages written with its generation's
// key: two memory windows bound over one buffer, generation 0 keyed to
// the first and generation 1 to the second. A write with the other,
// still bound, key is refused whether it is one packet or several, the
// buffer is untouched, and the refusals are counted; the right key's
// messages of one and of several packets (FIRST, MIDDLE, LAST: the later
// packets carry no key) are placed and counted.
func TestLabMailboxKeyed(t *testing.T) {
	labenv.Device(t)
	d := openDev(t)
	before := mbStats(t)
	mb := newMailboxes(t, d, 1, 2)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 2, verbs.MTU1024)
	keyA, keyB := p.bindMW(0, page), p.bindMW(0, page)
	if keyA == keyB {
		t.Fatalf("two windows with key %#x", keyA)
	}
	clear(p.dst.mr.Bytes())
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: page,
		Gen: 0, Record: 0, Keyed: true, RKey: keyA})

	refused := func(what string, n int, key uint32, want uint64) {
		t.Helper()
		if err := p.writeKey(0, p.addr(0), key, pattern(n, 99)); !errors.Is(err, verbs.WCRemAccessErr) {
			t.Fatalf("%s: %v, want %v", what, err, verbs.WCRemAccessErr)
		}
		if r := mb.Refused(id); r != want {
			t.Fatalf("%s: window refused %d, want %d", what, r, want)
		}
		p.reconnect()
	}
	refused("one packet with the other key", 100, keyB, 1)
	refused("three packets with the other key", 3000, keyB, 2)
	checkBytes(t, p, 0, make([]byte, page))

	data := pattern(page, 5)
	if err := p.writeKey(0, p.addr(0), keyA, data[:3000]); err != nil {
		t.Fatalf("three packets with the key: %v", err)
	}
	unpublished(t, mb, 0)
	if err := p.writeKey(3000, p.addr(3000), keyA, data[3000:]); err != nil {
		t.Fatalf("two packets with the key: %v", err)
	}
	wantDone(t, mb, id, 1)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: page, Ops: 2, Cap: page})
	checkBytes(t, p, 0, data)

	// Generation 1 of the same buffer: the first key, still bound, is
	// now an earlier generation's.
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: 1024,
		Gen: 1, Record: 1, Keyed: true, RKey: keyB})
	refused("one packet with the last generation's key", 8, keyA, 3)
	refused("two packets with the last generation's key", 2000, keyA, 4)
	checkBytes(t, p, 0, data)
	next := pattern(1024, 6)
	if err := p.writeKey(0, p.addr(0), keyB, next); err != nil {
		t.Fatalf("one packet with the new key: %v", err)
	}
	wantDone(t, mb, id, 2)
	checkRecord(t, mb, 1, kmod.MailboxRecord{Epoch: 1, Addr: p.addr(0), Len: 1024, Ops: 1, Cap: page})
	checkBytes(t, p, 0, append(next, data[1024:]...))

	// Key 0: a buffer posted only to be ended lets no write in.
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: page,
		Gen: 2, Record: 0, Keyed: true})
	refused("one packet into a buffer keyed to no key", 8, keyB, 5)
	checkBytes(t, p, 0, append(next, data[1024:]...))
	if err := mb.End(id, 2, kmod.RecordClosed, false); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, id, 3)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 2, Addr: p.addr(0), Cap: page, Flags: kmod.RecordClosed})

	after := mbStats(t)
	if after.Refused-before.Refused != 5 || after.Published-before.Published != 3 ||
		after.Packets-before.Packets != 6 || after.Unparsed != before.Unparsed {
		t.Fatalf("counters before %+v, after %+v", before, after)
	}
}

// keyedPage posts one page keyed to a memory window bound over it, as the
// only buffer of a bytes window (threshold: the page), and sets the
// module's key store faults to faults until the test ends.
func keyedPage(t *testing.T, faults int) (*kmod.Mailboxes, uint32, *pair, uint32) {
	t.Helper()
	labenv.Device(t)
	mb := newMailboxes(t, openDev(t), 1, 1)
	id := newWindow(t, mb, kmod.CountBytes)
	p := mbPair(t, 1, verbs.MTU1024)
	key := p.bindMW(0, page)
	clear(p.dst.mr.Bytes())
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: page, Threshold: page,
		Gen: 0, Record: 0, Keyed: true, RKey: key})
	if err := labenv.SetKeyStoreFaults(faults); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { labenv.SetKeyStoreFaults(0) })
	return mb, id, p, key
}

// A keyed buffer whose module cannot keep a message's key (no memory in
// softirq) refuses the message at its first packet: nothing of it is
// placed or counted, the refusal and its cause are counted, and the
// sender sees a remote access error. A one-packet message needs no kept
// key and is not affected; the same message sent again is placed.
func TestLabMailboxKeyNoMemory(t *testing.T) {
	mb, id, p, key := keyedPage(t, 1)
	before := mbStats(t)

	data := pattern(page, 7)
	if err := p.writeKey(0, p.addr(0), key, data[:100]); err != nil {
		t.Fatalf("one packet: %v", err)
	}
	if err := p.writeKey(100, p.addr(100), key, data[100:3100]); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("three packets without memory for their key: %v, want %v", err, verbs.WCRemAccessErr)
	}
	if r := mb.Refused(id); r != 1 {
		t.Fatalf("window refused %d, want 1", r)
	}
	if n, err := labenv.KeyStoreFaults(); n != 0 || err != nil {
		t.Fatalf("key store faults left: %d %v, want 0", n, err)
	}
	checkBytes(t, p, 0, append(append([]byte(nil), data[:100]...), make([]byte, page-100)...))
	unpublished(t, mb, 0)

	p.reconnect()
	if err := p.writeKey(100, p.addr(100), key, data[100:3100]); err != nil {
		t.Fatalf("three packets sent again: %v", err)
	}
	if err := p.writeKey(3100, p.addr(3100), key, data[3100:]); err != nil {
		t.Fatalf("the rest: %v", err)
	}
	wantDone(t, mb, id, 1)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: page, Ops: 3, Cap: page})
	checkBytes(t, p, 0, data)

	after := mbStats(t)
	if after.Refused-before.Refused != 1 || after.NoMem-before.NoMem != 1 ||
		after.Packets-before.Packets != 1+3+1 || after.Unparsed != before.Unparsed {
		t.Fatalf("counters before %+v, after %+v", before, after)
	}
}

// A named QP's key is kept without memory taken on the data path: with
// every key store failing, messages of several packets on the named QP
// are placed and the fault knob is left untouched. Once the QP is
// forgotten, its next message needs memory again and is refused.
func TestLabMailboxNamedQP(t *testing.T) {
	mb, id, p, key := keyedPage(t, 2)
	before := mbStats(t)
	qpn := p.dst.qp.QPN()
	for range 2 { // naming twice is naming once
		if err := mb.NameQP(qpn); err != nil {
			t.Fatalf("NameQP(%#x): %v", qpn, err)
		}
	}

	data := pattern(page, 9)
	if err := p.writeKey(0, p.addr(0), key, data[:2500]); err != nil {
		t.Fatalf("three packets on a named QP: %v", err)
	}
	if err := p.writeKey(2500, p.addr(2500), key, data[2500:3000]); err != nil {
		t.Fatalf("one packet: %v", err)
	}
	if n, err := labenv.KeyStoreFaults(); n != 2 || err != nil {
		t.Fatalf("key store faults left: %d %v, want 2 (no store took memory)", n, err)
	}
	if err := mb.ForgetQP(qpn); err != nil {
		t.Fatalf("ForgetQP: %v", err)
	}
	if err := mb.ForgetQP(qpn); err != nil {
		t.Fatalf("ForgetQP twice: %v", err)
	}
	if err := p.writeKey(3000, p.addr(3000), key, data[3000:]); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("two packets on the forgotten QP without memory: %v, want %v", err, verbs.WCRemAccessErr)
	}
	if n, err := labenv.KeyStoreFaults(); n != 1 || err != nil {
		t.Fatalf("key store faults left: %d %v, want 1", n, err)
	}
	checkBytes(t, p, 0, append(append([]byte(nil), data[:3000]...), make([]byte, page-3000)...))
	unpublished(t, mb, 0)

	p.reconnect()
	if err := mb.NameQP(p.dst.qp.QPN()); err != nil {
		t.Fatal(err)
	}
	if err := p.writeKey(3000, p.addr(3000), key, data[3000:]); err != nil {
		t.Fatalf("the rest on a new named QP: %v", err)
	}
	wantDone(t, mb, id, 1)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: page, Ops: 3, Cap: page})
	checkBytes(t, p, 0, data)
	if n, err := labenv.KeyStoreFaults(); n != 1 || err != nil {
		t.Fatalf("key store faults left at the end: %d %v, want 1", n, err)
	}
	if err := mb.NameQP(1 << 24); !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("NameQP(1<<24): %v, want ErrInvalid", err)
	}

	after := mbStats(t)
	if after.Refused-before.Refused != 1 || after.NoMem-before.NoMem != 1 ||
		after.Packets-before.Packets != 3+1+2 {
		t.Fatalf("counters before %+v, after %+v", before, after)
	}
}

// A QP forgotten while one of its messages is in progress keeps that
// message's key to its last packet: a 1 MiB write (4096 packets of 256
// bytes) is caught between its first and last packet by a thread on the
// other vCPU, which forgets the QP there, and the rest of the message is
// still placed and counted. Its last packet drops the entry: with every
// key store failing, the QP's next message of several packets needs
// memory and is refused. The forget must land inside the message; a try
// where the message ended first is repeated (the write then counts as one
// more put).
func TestLabMailboxForgetMidMessage(t *testing.T) {
	const msg = 1 << 20
	labenv.Device(t)
	mb := newMailboxes(t, openDev(t), 1, 1)
	id := newWindow(t, mb, kmod.CountOps)
	p := mbPair(t, msg/page+1, verbs.MTU256)
	key := p.bindMW(0, msg+page)
	clear(p.dst.mr.Bytes())
	mustPost(t, mb, id, kmod.MailboxPost{Key: p.key(), IOVA: p.addr(0), Length: msg + page, Threshold: 1000,
		Gen: 0, Record: 0, Keyed: true, RKey: key})
	qpn := p.dst.qp.QPN()
	data := pattern(msg, 3)
	copy(p.src.mr.Bytes(), data)
	dst := p.dst.mr.Bytes()
	word := func(off int) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&dst[off]))) }
	last := binary.LittleEndian.Uint64(data[msg-8:])

	// forget, on a thread of its own, waits for the message's first
	// packet, forgets the QP and reports whether the last was placed.
	type result struct {
		caught bool
		err    error
	}
	forget := func(ready chan<- struct{}, res chan<- result) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		close(ready)
		deadline := time.Now().Add(20 * time.Second)
		for word(0) == 0 {
			if time.Now().After(deadline) {
				res <- result{err: errors.New("the message's first packet never arrived")}
				return
			}
		}
		err := mb.ForgetQP(qpn)
		res <- result{caught: word(msg-8) != last, err: err}
	}

	puts, caught := 0, false
	for try := 0; try < 20 && !caught; try++ {
		if err := mb.NameQP(qpn); err != nil {
			t.Fatalf("NameQP: %v", err)
		}
		clear(dst[:msg])
		ready, res := make(chan struct{}), make(chan result, 1)
		go forget(ready, res)
		<-ready
		wr := verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{p.src.mr.SGE(0, msg)}, RemoteAddr: p.addr(0), RKey: key}
		if err := p.src.qp.PostSend(wr); err != nil {
			t.Fatalf("PostSend: %v", err)
		}
		werr := p.waitOne(p.src)
		r := <-res
		if r.err != nil {
			t.Fatalf("try %d: %v", try, r.err)
		}
		caught = r.caught
		if werr != nil && caught {
			t.Fatalf("try %d, forgotten mid-message: %v", try, werr)
		} else if werr != nil {
			t.Fatalf("try %d, forgotten after the message: %v", try, werr)
		}
		puts++
		checkBytes(t, p, 0, append(append([]byte(nil), data...), make([]byte, page)...))
	}
	if !caught {
		t.Fatalf("the forget never landed inside the message in %d tries", puts)
	}
	t.Logf("caught mid-message at try %d", puts)
	unpublished(t, mb, 0)

	if err := labenv.SetKeyStoreFaults(1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { labenv.SetKeyStoreFaults(0) })
	tail := pattern(page, 4)
	if err := p.writeKey(msg, p.addr(msg), key, tail[:2048]); !errors.Is(err, verbs.WCRemAccessErr) {
		t.Fatalf("eight packets after the forgotten message, without memory: %v, want %v", err, verbs.WCRemAccessErr)
	}
	if n, err := labenv.KeyStoreFaults(); n != 0 || err != nil {
		t.Fatalf("key store faults left: %d %v, want 0 (the entry was dropped)", n, err)
	}
	p.reconnect()
	if err := p.writeKey(msg, p.addr(msg), key, tail); err != nil {
		t.Fatalf("the tail on a new QP: %v", err)
	}
	if err := mb.End(id, 0, kmod.RecordPartial, false); err != nil {
		t.Fatal(err)
	}
	wantDone(t, mb, id, 1)
	checkRecord(t, mb, 0, kmod.MailboxRecord{Epoch: 0, Addr: p.addr(0), Len: uint64(puts*msg + page),
		Ops: uint64(puts + 1), Cap: msg + page, Flags: kmod.RecordPartial})
	checkBytes(t, p, 0, append(append([]byte(nil), data...), tail...))
}
