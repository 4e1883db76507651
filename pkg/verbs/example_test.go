package verbs_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// A failed work completion is a Go error carrying the verbs status.
func ExampleWCStatus() {
	wc := verbs.WC{ID: 7, Status: verbs.WCRemAccessErr, QPN: 17}
	err := wc.Err()
	fmt.Println(errors.Is(err, verbs.WCRemAccessErr))
	fmt.Println(verbs.WCRemAccessErr.Name())
	fmt.Println(err)
	// Output:
	// true
	// IBV_WC_REM_ACCESS_ERR
	// verbs: work request 7 on QP 17 completed with IBV_WC_REM_ACCESS_ERR (remote access error), vendor error 0x0
}

// Pick the RoCE v2 GID of an IP address from a GID table.
func ExamplePickRoCEv2GID() {
	v4, _ := verbs.GIDFromIP(net.ParseIP("10.77.0.1"))
	v6, _ := verbs.GIDFromIP(net.ParseIP("fe80::1"))
	table := []verbs.GIDEntry{
		{GID: v6, Index: 0, Port: 1, Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
		{GID: v4, Index: 1, Port: 1, Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
	}
	e, err := verbs.PickRoCEv2GID(table, 1, net.ParseIP("10.77.0.1"))
	fmt.Println(e.Index, e.Type, e.GID, e.Netdev, err)
	// Output: 1 RoCE v2 10.77.0.1 eth0 <nil>
}

// Memory the NIC touches lives outside the Go heap.
func ExampleAlloc() {
	buf, err := verbs.Alloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close()
	mem := buf.Bytes()
	copy(mem, "hello")
	fmt.Println(len(mem), string(mem[:5]), buf.Addr()%4096)
	// Output: 1048576 hello 0
}

// A complete ping-pong on one device: two RC queue pairs connected to each
// other (loopback), an RDMA WRITE, then a SEND the peer receives. Between two
// hosts, exchange the QPInfo and the Remote over any side channel instead.
func Example_pingPong() {
	ctx, err := verbs.Open("") // the first RDMA device, e.g. rxe0
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close() // closes everything below too

	gid, err := ctx.RoCEv2GID(1, nil) // index 1 on rxe: the IPv4 RoCE v2 GID
	if err != nil {
		log.Fatal(err)
	}
	type side struct {
		qp *verbs.QP
		cq *verbs.CQ
		mr *verbs.MR
	}
	mk := func() side {
		pd, err := ctx.AllocPD()
		if err != nil {
			log.Fatal(err)
		}
		ch, err := ctx.NewCompChannel()
		if err != nil {
			log.Fatal(err)
		}
		cq, err := ctx.NewCQ(64, &verbs.CQOptions{Channel: ch})
		if err != nil {
			log.Fatal(err)
		}
		qp, err := pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}})
		if err != nil {
			log.Fatal(err)
		}
		mr, err := pd.AllocMR(4096, verbs.AccessAll)
		if err != nil {
			log.Fatal(err)
		}
		return side{qp, cq, mr}
	}
	a, b := mk(), mk()
	ia := verbs.QPInfo{QPN: a.qp.QPN(), PSN: 100, GID: gid.GID}
	ib := verbs.QPInfo{QPN: b.qp.QPN(), PSN: 200, GID: gid.GID}
	opts := &verbs.ConnectOptions{GIDIndex: gid.Index}
	if err := a.qp.Connect(ia, ib, opts); err != nil {
		log.Fatal(err)
	}
	if err := b.qp.Connect(ib, ia, opts); err != nil {
		log.Fatal(err)
	}

	wait := func(s side) verbs.WC {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		wcs := make([]verbs.WC, 1)
		if _, err := s.cq.Wait(c, wcs); err != nil { // parks the goroutine
			log.Fatal(err)
		}
		if err := wcs[0].Err(); err != nil {
			log.Fatal(err)
		}
		return wcs[0]
	}

	// RDMA WRITE "ping" into b's memory.
	copy(a.mr.Bytes(), "ping")
	remote := b.mr.Remote()
	if err := a.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{a.mr.SGE(0, 4)}, RemoteAddr: remote.Addr, RKey: remote.RKey}); err != nil {
		log.Fatal(err)
	}
	wait(a)
	fmt.Println(string(b.mr.Bytes()[:4]))

	// SEND "pong" back, with immediate data.
	if err := a.qp.PostRecv(verbs.RecvWR{ID: 2, SGL: []verbs.SGE{a.mr.SGE(100, 100)}}); err != nil {
		log.Fatal(err)
	}
	copy(b.mr.Bytes()[200:], "pong")
	if err := b.qp.PostSend(verbs.SendWR{ID: 3, Op: verbs.OpSendImm, Imm: 42, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{b.mr.SGE(200, 4)}}); err != nil {
		log.Fatal(err)
	}
	wait(b)
	wc := wait(a)
	fmt.Println(string(a.mr.Bytes()[100:100+wc.ByteLen]), wc.Imm)
}

// Connection management: the passive side. Run Example_cmClient against it.
func Example_cmServer() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := verbs.NewCMID(verbs.PSTCP)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	if err := l.Listen(netipAddrPort("0.0.0.0:7471"), 8); err != nil {
		log.Fatal(err)
	}
	id, req, err := l.GetRequest(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer id.Close()
	dev, _ := id.Context()
	pd, _ := dev.AllocPD()
	defer pd.Close()
	cq, _ := dev.NewCQ(16, nil)
	defer cq.Close()
	if _, err := id.NewQP(pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8}}); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("request with %q\n", req.PrivateData)
	if err := id.Accept(ctx, &verbs.ConnParam{PrivateData: []byte("welcome")}); err != nil {
		log.Fatal(err)
	}
	ev, _ := id.WaitEvent(ctx) // CMDisconnected when the client leaves
	fmt.Println(ev.Type)
}

// Connection management: the active side.
func Example_cmClient() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := verbs.NewCMID(verbs.PSTCP)
	if err != nil {
		log.Fatal(err)
	}
	defer id.Close()
	if err := id.ResolveAddr(ctx, netipAddrPort(""), netipAddrPort("10.77.0.1:7471")); err != nil {
		log.Fatal(err)
	}
	if err := id.ResolveRoute(ctx); err != nil {
		log.Fatal(err)
	}
	dev, _ := id.Context()
	pd, _ := dev.AllocPD()
	defer pd.Close()
	cq, _ := dev.NewCQ(16, nil)
	defer cq.Close()
	if _, err := id.NewQP(pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8}}); err != nil {
		log.Fatal(err)
	}
	var rej *verbs.RejectError
	switch err := id.Connect(ctx, &verbs.ConnParam{PrivateData: []byte("hello")}); {
	case errors.As(err, &rej):
		log.Fatalf("rejected: %q", rej.PrivateData)
	case err != nil:
		log.Fatal(err)
	}
	// ... post work requests on id.QP() ...
	if err := id.Disconnect(ctx); err != nil {
		log.Fatal(err)
	}
}

// A send plan is a chain of work requests built once and posted again and
// again with one cgo call each time: here 1000 RDMA WRITEs of a counter
// into a ring, every 100th one signaled (on a QP connected to itself, so
// the example needs one device and nothing else).
func ExampleSendPlan() {
	ctx, err := verbs.Open("")
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	gid, err := ctx.RoCEv2GID(1, nil)
	if err != nil {
		log.Fatal(err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	cq, err := ctx.NewCQ(64, nil)
	if err != nil {
		log.Fatal(err)
	}
	qp, err := pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 128, MaxRecvWR: 1, MaxInlineData: 64}})
	if err != nil {
		log.Fatal(err)
	}
	me := verbs.QPInfo{QPN: qp.QPN(), PSN: 1, GID: gid.GID}
	if err := qp.Connect(me, me, &verbs.ConnectOptions{GIDIndex: gid.Index}); err != nil {
		log.Fatal(err)
	}
	mr, err := pd.AllocMR(8+8*16, verbs.AccessAll) // a counter, then a ring of 16 slots
	if err != nil {
		log.Fatal(err)
	}
	mem, ring := mr.Bytes(), mr.Remote()

	write := verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.SendInline, SGL: []verbs.SGE{mr.SGE(0, 8)},
		RemoteAddr: ring.Addr + 8, RKey: ring.RKey}
	plan, err := qp.NewSendPlan(write)
	if err != nil {
		log.Fatal(err)
	}
	defer plan.Close()
	wcs := make([]verbs.WC, 1)
	for i := 1; i <= 1000; i++ {
		binary.LittleEndian.PutUint64(mem, uint64(i)) // inline: copied at post time
		slot := uint64(i % 16)
		if err := plan.SetRemote(0, ring.Addr+8+8*slot, ring.RKey); err != nil {
			log.Fatal(err)
		}
		flags := verbs.SendInline
		if i%100 == 0 {
			flags |= verbs.SendSignaled // keeps the send queue from filling up
		}
		if err := plan.SetFlags(0, flags); err != nil {
			log.Fatal(err)
		}
		if err := plan.Post(); err != nil {
			log.Fatal(err)
		}
		if i%100 == 0 {
			if _, err := cq.Spin(context.Background(), wcs); err != nil || wcs[0].Err() != nil {
				log.Fatal(err, wcs[0].Err())
			}
		}
	}
	fmt.Println(binary.LittleEndian.Uint64(mem[8+8*(1000%16):]), binary.LittleEndian.Uint64(mem[8+8*(999%16):]))
}

// A connection in one call: Listen and Accept on one side, Dial on the
// other (here both in one process, on the lab guest's address). Each Conn
// has its QP in RTS, a PD to register memory on, and a CQ sized so that it
// cannot overrun; when the peer goes, Wait returns ErrPeerGone.
func ExampleDial() {
	addr := netip.MustParseAddrPort("10.77.0.1:7490")
	l, err := verbs.Listen(addr, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { // the server: receive one message, print it, hang up
		c, err := l.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close()
		mr, _ := c.PD.AllocMR(64, verbs.AccessLocalWrite)
		c.QP.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{mr.SGE(0, 64)}})
		wcs := make([]verbs.WC, 1)
		if _, err := c.Wait(ctx, wcs); err != nil || wcs[0].Err() != nil {
			log.Fatal(err, wcs[0].Err())
		}
		fmt.Println(string(mr.Bytes()[:wcs[0].ByteLen]))
	}()

	c, err := verbs.Dial(ctx, addr, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	mr, _ := c.PD.AllocMR(64, verbs.AccessLocalWrite)
	n := copy(mr.Bytes(), "ping")
	c.QP.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(0, n)}})
	wcs := make([]verbs.WC, 4)
	for { // the send's completion, then the server's hang-up
		if _, err := c.Wait(ctx, wcs); errors.Is(err, verbs.ErrPeerGone) {
			fmt.Println("peer gone")
			return
		} else if err != nil {
			log.Fatal(err)
		}
	}
}
