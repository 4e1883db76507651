//go:build lab

package verbs_test

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// needPair fails the test unless the boot has two guests; it returns true
// on the server (guest 1). Guests beyond 2 sit the test out.
func needPair(t *testing.T) (server bool, skip bool) {
	t.Helper()
	labenv.Device(t)
	n, err := labenv.Guests()
	if err != nil || n < 2 {
		t.Fatalf("this test needs a boot with two guests (have %d): run it with -guests 2", n)
	}
	idx, _ := labenv.Index()
	return labenv.Role() == "server", idx > 2
}

type rcHello struct {
	info   verbs.QPInfo
	remote verbs.Remote
}

func (h rcHello) marshal() []byte {
	b, _ := h.info.MarshalBinary()
	b = binary.BigEndian.AppendUint64(b, h.remote.Addr)
	b = binary.BigEndian.AppendUint32(b, h.remote.RKey)
	return binary.BigEndian.AppendUint32(b, h.remote.Len)
}

func parseHello(t *testing.T, b []byte) rcHello {
	var h rcHello
	if err := h.info.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	b = b[verbs.QPInfoSize:]
	h.remote = verbs.Remote{Addr: binary.BigEndian.Uint64(b), RKey: binary.BigEndian.Uint32(b[8:]), Len: binary.BigEndian.Uint32(b[12:])}
	return h
}

// TestTwoGuestsRC runs every RC operation from guest 2 to guest 1 and
// checks the bytes on both sides.
func TestTwoGuestsRC(t *testing.T) {
	server, skip := needPair(t)
	if skip {
		return
	}
	ctx := openDev(t)
	e := newEnd(t, ctx, endOpts{inline: 64})
	m := e.mr.Bytes()
	le := binary.LittleEndian
	local := e.info(0x1000 + uint32(labenv.Role()[0]))
	peer := parseHello(t, sideChannel(t, 18701, rcHello{local, e.mr.Remote()}.marshal()))
	e.connect(local, peer.info, nil)
	if server {
		// Receives need INIT or later; the client sends only after
		// the rc-ready-server barrier below.
		for i, off := range []int{0, 8192, 16384, 24576} {
			if err := e.qp.PostRecv(verbs.RecvWR{ID: uint64(i + 1), SGL: []verbs.SGE{e.mr.SGE(off, 8192)}}); err != nil {
				t.Fatal(err)
			}
		}
		fill(m[32768:40960], 201)
		le.PutUint64(m[61440:], 1000)
	}
	want := func(n int, seed byte) []byte { b := make([]byte, n); fill(b, seed); return b }
	ctx60, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := labenv.Signal("rc-ready-" + labenv.Role()); err != nil {
		t.Fatal(err)
	}
	if server {
		w := e.ok(1)
		checkBytes(t, "send", m[0:w.ByteLen], want(4096, 11))
		w = e.ok(2)
		if !w.HasImm() || w.Imm != 0xabc {
			t.Fatalf("send with imm: %+v", w)
		}
		checkBytes(t, "send with imm", m[8192:8192+w.ByteLen], want(100, 12))
		w = e.ok(3)
		if w.Opcode != verbs.WCRecvRDMAWithImm || w.Imm != 7 || w.ByteLen != 16384 {
			t.Fatalf("write with imm: %+v", w)
		}
		checkBytes(t, "rdma write", m[40960:40960+16384], want(16384, 13))
		w = e.ok(4)
		checkBytes(t, "final send", m[24576:24576+w.ByteLen], []byte("finished"))
		// The chain's writes were placed before the final send (RC order).
		checkBytes(t, "rdma write of two SGEs", m[57344:57344+500], append(want(300, 14), want(200, 15)...))
		checkBytes(t, "inline rdma write", m[57344+512:57344+512+64], want(64, 16))
		if got := le.Uint64(m[61440:]); got != 77 {
			t.Fatalf("counter after FAA and CAS: %d, want 77", got)
		}
		if err := labenv.Wait(ctx60, "rc-done"); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := labenv.Wait(ctx60, "rc-ready-server"); err != nil {
		t.Fatal(err)
	}
	r := peer.remote
	post := func(wr verbs.SendWR) verbs.WC {
		t.Helper()
		wr.Flags |= verbs.SendSignaled
		if err := e.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		return e.ok(wr.ID)
	}
	fill(m[:4096], 11)
	post(verbs.SendWR{ID: 1, Op: verbs.OpSend, SGL: []verbs.SGE{e.mr.SGE(0, 4096)}})
	fill(m[4096:4196], 12)
	post(verbs.SendWR{ID: 2, Op: verbs.OpSendImm, Imm: 0xabc, SGL: []verbs.SGE{e.mr.SGE(4096, 100)}})
	fill(m[8192:8192+16384], 13)
	post(verbs.SendWR{ID: 3, Op: verbs.OpWriteImm, Imm: 7, SGL: []verbs.SGE{e.mr.SGE(8192, 16384)}, RemoteAddr: r.Addr + 40960, RKey: r.RKey})
	clear(m[32768:40960])
	post(verbs.SendWR{ID: 4, Op: verbs.OpRead, SGL: []verbs.SGE{e.mr.SGE(32768, 8192)}, RemoteAddr: r.Addr + 32768, RKey: r.RKey})
	checkBytes(t, "rdma read", m[32768:40960], want(8192, 201))
	post(verbs.SendWR{ID: 5, Op: verbs.OpAtomicFAA, CompareAdd: 5, SGL: []verbs.SGE{e.mr.SGE(0, 8)}, RemoteAddr: r.Addr + 61440, RKey: r.RKey})
	if got := le.Uint64(m[0:]); got != 1000 {
		t.Fatalf("fetch-add returned %d, want 1000", got)
	}
	post(verbs.SendWR{ID: 6, Op: verbs.OpAtomicCAS, CompareAdd: 1005, Swap: 77, SGL: []verbs.SGE{e.mr.SGE(8, 8)}, RemoteAddr: r.Addr + 61440, RKey: r.RKey})
	if got := le.Uint64(m[8:]); got != 1005 {
		t.Fatalf("compare-and-swap returned %d, want 1005", got)
	}
	// A chain in one post: a plain WRITE gathering two SGEs, an inline
	// WRITE (its source overwritten right after the post), signaled last.
	fill(m[20000:20300], 14)
	fill(m[30000:30200], 15)
	fill(m[31000:31064], 16)
	if err := e.qp.PostSend(
		verbs.SendWR{ID: 10, Op: verbs.OpWrite, SGL: []verbs.SGE{e.mr.SGE(20000, 300), e.mr.SGE(30000, 200)},
			RemoteAddr: r.Addr + 57344, RKey: r.RKey},
		verbs.SendWR{ID: 11, Op: verbs.OpWrite, Flags: verbs.SendInline | verbs.SendSignaled, SGL: []verbs.SGE{e.mr.SGE(31000, 64)},
			RemoteAddr: r.Addr + 57344 + 512, RKey: r.RKey}); err != nil {
		t.Fatal(err)
	}
	clear(m[31000:31064]) // inline: the data was copied at the post
	e.ok(11)
	copy(m[60000:], "finished")
	post(verbs.SendWR{ID: 8, Op: verbs.OpSend, SGL: []verbs.SGE{e.mr.SGE(60000, 8)}})
	// A bad rkey across the wire: an error completion, then the QP is in
	// the error state.
	if err := e.qp.PostSend(verbs.SendWR{ID: 9, Op: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{e.mr.SGE(0, 64)},
		RemoteAddr: r.Addr, RKey: r.RKey ^ 0x5500}); err != nil {
		t.Fatal(err)
	}
	isErr(t, "read with a bad rkey", e.wc(9).Err(), verbs.WCRemAccessErr)
	if err := labenv.Signal("rc-done"); err != nil {
		t.Fatal(err)
	}
}

// TestTwoGuestsUD exchanges datagrams both ways through address handles.
func TestTwoGuestsUD(t *testing.T) {
	server, skip := needPair(t)
	if skip {
		return
	}
	const qkey = 0x2222
	ctx := openDev(t)
	e := newEnd(t, ctx, endOpts{typ: verbs.QPTypeUD})
	if err := e.qp.Connect(verbs.QPInfo{PSN: 1}, verbs.QPInfo{}, &verbs.ConnectOptions{QKey: qkey}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if err := e.qp.PostRecv(verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{e.mr.SGE(8192+i*2048, 2048)}}); err != nil {
			t.Fatal(err)
		}
	}
	var peer verbs.QPInfo
	b, _ := e.info(0).MarshalBinary()
	if err := peer.UnmarshalBinary(sideChannel(t, 18702, b)); err != nil {
		t.Fatal(err)
	}
	ah, err := e.pd.NewAH(&verbs.AHAttr{Port: 1, IsGlobal: true, DGID: peer.GID, SGIDIndex: e.gid.Index})
	if err != nil {
		t.Fatal(err)
	}
	seed := byte(1)
	if server {
		seed = 101
	}
	for i := 0; i < 4; i++ {
		fill(e.mr.Bytes()[i*1024:i*1024+1000], seed+byte(i))
		if err := e.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{e.mr.SGE(i*1024, 1000)}, AH: ah, RemoteQPN: peer.QPN, RemoteQKey: qkey}); err != nil {
			t.Fatal(err)
		}
		e.ok(uint64(i))
	}
	peerSeed := byte(101)
	if server {
		peerSeed = 1
	}
	for i := 0; i < 4; i++ {
		w := e.ok(uint64(100 + i))
		if w.ByteLen != 1040 || w.SrcQP != peer.QPN {
			t.Fatalf("UD completion %+v", w)
		}
		want := make([]byte, 1000)
		fill(want, peerSeed+byte(i))
		off := 8192 + i*2048
		checkBytes(t, "UD datagram", e.mr.Bytes()[off+40:off+1040], want)
	}
	labenv.Signal("ud-done-" + labenv.Role())
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := "client"
	if !server {
		other = "server"
	}
	if err := labenv.Wait(wctx, "ud-done-"+other); err != nil {
		t.Fatal(err)
	}
}

// TestTwoGuestsCM runs the rdma_cm scenario (reject, accept, echo,
// disconnect) between the guests.
func TestTwoGuestsCM(t *testing.T) {
	server, skip := needPair(t)
	if skip {
		return
	}
	srv, _ := labenv.AddrOf(1)
	side := "client"
	if server {
		side = "server"
	}
	cmPingPong(t, netip.MustParseAddr(srv), 7472, side)
}

// TestTwoGuestsPeerGone: the server's process state vanishes (its context is
// closed) while the client streams writes; the client gets a retry-exceeded
// completion, not a hang.
func TestTwoGuestsPeerGone(t *testing.T) {
	server, skip := needPair(t)
	if skip {
		return
	}
	ctx := openDev(t)
	e := newEnd(t, ctx, endOpts{})
	local := e.info(0x77)
	peer := parseHello(t, sideChannel(t, 18703, rcHello{local, e.mr.Remote()}.marshal()))
	e.connect(local, peer.info, &verbs.ConnectOptions{Timeout: 14, RetryCount: 2})
	wctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if server {
		if err := labenv.Wait(wctx, "gone-streaming"); err != nil {
			t.Fatal(err)
		}
		if err := ctx.Close(); err != nil {
			t.Fatal(err)
		}
		labenv.Signal("gone-closed")
		if err := labenv.Wait(wctx, "gone-done"); err != nil {
			t.Fatal(err)
		}
		return
	}
	fill(e.mr.Bytes()[:32768], 5)
	var failed error
	ok := 0
	start := time.Now()
	for i := 0; failed == nil && time.Since(start) < 60*time.Second; i++ {
		if err := e.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{e.mr.SGE(0, 32768)}, RemoteAddr: peer.remote.Addr, RKey: peer.remote.RKey}); err != nil {
			t.Fatal(err)
		}
		failed = e.wc(uint64(i)).Err()
		if failed == nil {
			ok++
		}
		if ok == 20 {
			labenv.Signal("gone-streaming")
		}
	}
	labenv.Signal("gone-done")
	t.Logf("%d writes completed before the peer vanished; then after %v: %v", ok, time.Since(start), failed)
	if ok < 20 {
		t.Fatalf("only %d writes succeeded", ok)
	}
	isErr(t, "write to a vanished peer", failed, verbs.WCRetryExcErr)
}
