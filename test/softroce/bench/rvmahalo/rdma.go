package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

const rdmaDepth = 64 // receives posted per connection

// conn is one ring connection: faces go out through it to one neighbour
// and come in from the same neighbour.
type conn struct {
	id     *verbs.CMID
	pd     *verbs.PD
	ch     *verbs.CompChannel // set when the CQ is waited on, not spun
	cq     *verbs.CQ
	mr     *verbs.MR // [0, 2·face): incoming faces by parity; [2·face, 4·face): outgoing; then 64 bytes for the SENDs
	buf    *verbs.Buffer
	remote verbs.Remote // the neighbour's incoming area for our faces
	from   int          // the neighbour's index
	got    int          // steps whose face arrived
	sent   int
	wcs    []verbs.WC
}

// runRDMA runs the exchange on plain verbs: rdma_cm connections to both
// neighbours (this guest dials its right neighbour and accepts its left
// one), buffers registered and advertised in the connection's private
// data (the setup), then per step a WRITE and a 1-byte SEND behind it to
// each neighbour, and a wait for both neighbours' SENDs: spinning on the
// CQ, or parked on its completion channel if wait is set.
func runRDMA(ctx context.Context, r *ring, face, steps int, wait bool) (res result, err error) {
	start := time.Now()
	l, err := verbs.NewCMID(verbs.PSTCP)
	if err != nil {
		return result{}, err
	}
	defer l.Close()
	if err := l.Listen(netip.AddrPortFrom(r.self, haloPort+1), 4); err != nil {
		return result{}, err
	}
	if err := r.barrier(ctx, "halo-rdma-listening"); err != nil {
		return result{}, err
	}
	type dialed struct {
		c   *conn
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		c, err := dial(ctx, netip.AddrPortFrom(r.addrs[r.right-1], haloPort+1), face, r.right, wait)
		ch <- dialed{c, err}
	}()
	leftConn, aerr := accept(ctx, l, face, r.left, wait)
	d := <-ch
	for _, c := range []*conn{leftConn, d.c} {
		if c != nil {
			defer c.close()
		}
	}
	if aerr != nil {
		return result{}, aerr
	}
	if d.err != nil {
		return result{}, d.err
	}
	conns := []*conn{d.c, leftConn} // faces: [0] to the right neighbour, [1] to the left
	setup := time.Since(start)
	if err := r.barrier(ctx, "halo-rdma-ready"); err != nil {
		return result{}, err
	}
	cpu0, err := readCPU()
	if err != nil {
		return result{}, err
	}
	t0 := time.Now()
	for s := 0; s < steps; s++ {
		parity := s % 2
		for _, c := range conns {
			if err := c.send(s, parity, face, r.index); err != nil {
				return result{}, fmt.Errorf("step %d to guest %d: %w", s, c.from, err)
			}
		}
		for _, c := range conns {
			for c.got <= s {
				if err := c.poll(ctx); err != nil {
					return result{}, fmt.Errorf("step %d from guest %d: %w", s, c.from, err)
				}
			}
			if err := check(c.mr.Bytes()[parity*face:(parity+1)*face], c.from, s); err != nil {
				return result{}, err
			}
		}
	}
	run := time.Since(t0)
	cpu := cpu0.since()
	return result{setup: setup, run: run, cpu: cpu}, r.barrier(ctx, "halo-rdma-done")
}

// newConn creates the QP's resources on a CMID whose device is known, with
// a completion channel for the CQ if wait is set.
func newConn(id *verbs.CMID, face, from int, wait bool) (*conn, error) {
	dev, err := id.Context()
	if err != nil {
		return nil, err
	}
	c := &conn{id: id, from: from, wcs: make([]verbs.WC, 32)}
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	var opts *verbs.CQOptions
	if wait {
		if c.ch, err = dev.NewCompChannel(); err != nil {
			c.close()
			return nil, err
		}
		opts = &verbs.CQOptions{Channel: c.ch}
	}
	if c.cq, err = dev.NewCQ(4*rdmaDepth, opts); err != nil {
		c.close()
		return nil, err
	}
	if c.buf, err = verbs.Alloc(4*face + 64); err != nil {
		c.close()
		return nil, err
	}
	if c.mr, err = c.pd.RegMR(c.buf.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		c.close()
		return nil, err
	}
	if _, err = id.NewQP(c.pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: c.cq, RecvCQ: c.cq,
		Cap: verbs.QPCap{MaxSendWR: 2 * rdmaDepth, MaxRecvWR: rdmaDepth, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		c.close()
		return nil, err
	}
	if err := c.postRecvs(rdmaDepth); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// area is what a side advertises: where the neighbour writes its faces.
func (c *conn) area(face int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, c.mr.Addr())
	b = binary.LittleEndian.AppendUint32(b, c.mr.RKey())
	return binary.LittleEndian.AppendUint32(b, uint32(2*face))
}

func (c *conn) setRemote(b []byte, face int) error {
	if len(b) < 16 || binary.LittleEndian.Uint32(b[12:]) != uint32(2*face) {
		return fmt.Errorf("guest %d advertised no buffer of %d bytes (%d bytes of private data)", c.from, 2*face, len(b))
	}
	c.remote = verbs.Remote{Addr: binary.LittleEndian.Uint64(b), RKey: binary.LittleEndian.Uint32(b[8:]), Len: uint32(2 * face)}
	return nil
}

func dial(ctx context.Context, dst netip.AddrPort, face, from int, wait bool) (*conn, error) {
	for {
		c, err := dialOnce(ctx, dst, face, from, wait)
		if err == nil || ctx.Err() != nil {
			return c, err
		}
		time.Sleep(50 * time.Millisecond) // the neighbour's listener may not be up yet
	}
}

func dialOnce(ctx context.Context, dst netip.AddrPort, face, from int, wait bool) (*conn, error) {
	id, err := verbs.NewCMID(verbs.PSTCP)
	if err != nil {
		return nil, err
	}
	if err := id.ResolveAddr(ctx, netip.AddrPort{}, dst); err != nil {
		id.Close()
		return nil, err
	}
	if err := id.ResolveRoute(ctx); err != nil {
		id.Close()
		return nil, err
	}
	c, err := newConn(id, face, from, wait)
	if err != nil {
		id.Close()
		return nil, err
	}
	if err := id.Connect(ctx, &verbs.ConnParam{PrivateData: c.area(face)}); err != nil {
		c.close()
		return nil, fmt.Errorf("connecting to guest %d: %w", from, err)
	}
	if err := c.setRemote(id.AcceptData(), face); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func accept(ctx context.Context, l *verbs.CMID, face, from int, wait bool) (*conn, error) {
	id, req, err := l.GetRequest(ctx)
	if err != nil {
		return nil, err
	}
	c, err := newConn(id, face, from, wait)
	if err != nil {
		id.Reject(nil)
		id.Close()
		return nil, err
	}
	if err := c.setRemote(req.PrivateData, face); err != nil {
		id.Reject(nil)
		c.close()
		return nil, err
	}
	if err := id.Accept(ctx, &verbs.ConnParam{PrivateData: c.area(face)}); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *conn) postRecvs(n int) error {
	wrs := make([]verbs.RecvWR, n)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: 1, SGL: []verbs.SGE{c.mr.SGE(c.mr.Len()-64, 64)}}
	}
	return c.id.QP().PostRecv(wrs...)
}

// send writes this step's face into the neighbour's buffer for the step's
// parity and posts the 1-byte SEND that tells it the face is complete.
func (c *conn) send(step, parity, face, self int) error {
	out := c.mr.Bytes()[2*face+parity*face : 2*face+(parity+1)*face]
	fill(out, self, step)
	c.sent++
	f := verbs.SendFlags(0)
	if c.sent%32 == 0 {
		f = verbs.SendSignaled
	}
	return c.id.QP().PostSend(
		verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{c.mr.SGE(2*face+parity*face, face)},
			RemoteAddr: c.remote.Addr + uint64(parity*face), RKey: c.remote.RKey},
		verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: f, SGL: []verbs.SGE{c.mr.SGE(c.mr.Len()-128, 1)}},
	)
}

// poll spins on the connection's CQ (or waits on it, with a channel)
// until it returns completions, and counts arrived faces.
func (c *conn) poll(ctx context.Context) error {
	next := c.cq.Spin
	if c.ch != nil {
		next = c.cq.Wait
	}
	n, err := next(ctx, c.wcs)
	if err != nil {
		return err
	}
	recvs := 0
	for _, w := range c.wcs[:n] {
		if err := w.Err(); err != nil {
			return err
		}
		if w.ID == 1 {
			recvs++
		}
	}
	c.got += recvs
	if recvs > 0 {
		return c.postRecvs(recvs)
	}
	return nil
}

func (c *conn) close() {
	if c.id != nil {
		c.id.Close()
	}
	if c.mr != nil {
		c.mr.Close()
	}
	if c.buf != nil {
		c.buf.Close()
	}
	if c.cq != nil {
		c.cq.Close()
	}
	if c.ch != nil {
		c.ch.Close()
	}
	if c.pd != nil {
		c.pd.Close()
	}
}
