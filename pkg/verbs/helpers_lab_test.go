//go:build lab

package verbs_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// end is one side of an RC or UD connection: its own PD, CQ (with a
// completion channel), QP and a registered buffer.
type end struct {
	t   testing.TB
	ctx *verbs.Context
	pd  *verbs.PD
	ch  *verbs.CompChannel
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
	gid verbs.GIDEntry

	pending []verbs.WC // completions polled while waiting for another
}

func openDev(t testing.TB) *verbs.Context {
	t.Helper()
	name := labenv.Device(t)
	ctx, err := verbs.Open(name)
	if err != nil {
		t.Fatalf("Open(%q): %v", name, err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

type endOpts struct {
	typ    verbs.QPType
	size   int
	sendWR int
	recvWR int
	sge    int
	inline int
	srq    *verbs.SRQ
	pd     *verbs.PD

	access verbs.Access // of the region; AccessAll if zero
}

func newEnd(t testing.TB, ctx *verbs.Context, o endOpts) *end {
	t.Helper()
	if o.typ == 0 {
		o.typ = verbs.QPTypeRC
	}
	if o.size == 0 {
		o.size = 1 << 16
	}
	if o.sendWR == 0 {
		o.sendWR = 64
	}
	if o.recvWR == 0 {
		o.recvWR = 64
	}
	if o.sge == 0 {
		o.sge = 4
	}
	e := &end{t: t, ctx: ctx}
	var err error
	e.pd = o.pd
	if e.pd == nil {
		if e.pd, err = ctx.AllocPD(); err != nil {
			t.Fatal(err)
		}
	}
	if e.ch, err = ctx.NewCompChannel(); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = ctx.NewCQ(256, &verbs.CQOptions{Channel: e.ch}); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.NewQP(&verbs.QPInitAttr{Type: o.typ, SendCQ: e.cq, RecvCQ: e.cq, SRQ: o.srq,
		Cap: verbs.QPCap{MaxSendWR: o.sendWR, MaxRecvWR: o.recvWR, MaxSendSGE: o.sge, MaxRecvSGE: o.sge, MaxInlineData: o.inline}}); err != nil {
		t.Fatal(err)
	}
	if o.access == 0 {
		o.access = verbs.AccessAll
	}
	if e.mr, err = e.pd.AllocMR(o.size, o.access); err != nil {
		t.Fatal(err)
	}
	if e.gid, err = ctx.RoCEv2GID(1, net.ParseIP(labenv.Addr())); err != nil {
		t.Fatalf("RoCEv2GID(%s): %v", labenv.Addr(), err)
	}
	return e
}

func (e *end) info(psn uint32) verbs.QPInfo {
	return verbs.QPInfo{QPN: e.qp.QPN(), PSN: psn, GID: e.gid.GID}
}

func gidIndexOpt(i int) int {
	if i == 0 {
		return -1
	}
	return i
}

func (e *end) connect(local, remote verbs.QPInfo, o *verbs.ConnectOptions) {
	e.t.Helper()
	var opts verbs.ConnectOptions
	if o != nil {
		opts = *o
	}
	opts.GIDIndex = gidIndexOpt(e.gid.Index)
	if err := e.qp.Connect(local, remote, &opts); err != nil {
		e.t.Fatalf("Connect: %v", err)
	}
	if st := e.qp.State(); st != verbs.QPStateRTS {
		e.t.Fatalf("state after Connect: %v", st)
	}
}

// pair returns two connected RC ends on one device (loopback).
func pair(t testing.TB, ctx *verbs.Context, o endOpts, co *verbs.ConnectOptions) (*end, *end) {
	a, b := newEnd(t, ctx, o), newEnd(t, ctx, o)
	ia, ib := a.info(0x111), b.info(0x222)
	a.connect(ia, ib, co)
	b.connect(ib, ia, co)
	return a, b
}

// wc waits (on the netpoller) for the completion of work request id and
// returns it, keeping other completions for later calls.
func (e *end) wc(id uint64) verbs.WC {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		for i, w := range e.pending {
			if w.ID == id {
				e.pending = append(e.pending[:i], e.pending[i+1:]...)
				return w
			}
		}
		buf := make([]verbs.WC, 16)
		n, err := e.cq.Wait(ctx, buf)
		if err != nil {
			e.t.Fatalf("waiting for completion %d: %v (pending %+v)", id, err, e.pending)
		}
		e.pending = append(e.pending, buf[:n]...)
	}
}

// ok waits for id and fails the test unless it succeeded.
// write128 fills the first 128 bytes of e's region with id and writes them
// to addr with rkey, signaled, and returns the completion.
func (e *end) write128(id uint64, rkey uint32, addr uint64) verbs.WC {
	e.t.Helper()
	fill(e.mr.Bytes()[:128], byte(id))
	if err := e.qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{e.mr.SGE(0, 128)}, RemoteAddr: addr, RKey: rkey}); err != nil {
		e.t.Fatal(err)
	}
	return e.wc(id)
}

func (e *end) ok(id uint64) verbs.WC {
	e.t.Helper()
	w := e.wc(id)
	if err := w.Err(); err != nil {
		e.t.Fatalf("completion %d: %v", id, err)
	}
	return w
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func checkBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: byte %d is %#x, want %#x", what, i, got[i], want[i])
		}
	}
}

// sideChannel exchanges one message between guest 1 (server) and the
// calling client guest over TCP.
func sideChannel(t testing.TB, port int, msg []byte) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var c net.Conn
	var err error
	if labenv.Role() == "server" {
		var l net.Listener
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := labenv.Signal(fmt.Sprintf("listen-%d", port)); err != nil {
			t.Fatal(err)
		}
		go func() { <-ctx.Done(); l.Close() }()
		c, err = l.Accept()
	} else {
		if err := labenv.Wait(ctx, fmt.Sprintf("listen-%d", port)); err != nil {
			t.Fatal(err)
		}
		srv, _ := labenv.AddrOf(1)
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", fmt.Sprintf("%s:%d", srv, port))
	}
	if err != nil {
		t.Fatalf("side channel: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(msg)))
	if _, err := c.Write(append(hdr[:], msg...)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(c, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func isErr(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want an error wrapping %v", what, err, target)
	}
	t.Logf("%s: %v", what, err)
}
