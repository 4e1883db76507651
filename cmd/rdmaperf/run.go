package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// bench is one side of a benchmark connection.
type bench struct {
	cfg    config
	client bool
	conn   net.Conn
	dev    *verbs.Context
	scq    *verbs.CQ
	rcq    *verbs.CQ
	qp     *verbs.QP
	mr     *verbs.MR
	max    int // size of the send area and of the receive area
	peer   verbs.Remote
	wcs    []verbs.WC

	recvChain []verbs.RecvWR // preallocated receive requests
	recvSize  int
}

const rxDepth = 64

func run(ctx context.Context, conn net.Conn, devName string, gidIdx int, client bool, cfg config, out io.Writer) error {
	b, mtu, err := newBench(conn, devName, gidIdx, client, cfg)
	if err != nil {
		return err
	}
	defer b.dev.Close()
	if client {
		printHeader(out, cfg, b.dev.Name(), b.qp, mtu)
	}
	for _, size := range sizes(cfg.Size, cfg.MaxSize, cfg.All) {
		if cfg.Test == "write_lat" && size < 2 {
			continue
		}
		if err := b.runSize(ctx, size, out); err != nil {
			return fmt.Errorf("%s, %d bytes: %w", cfg.Test, size, err)
		}
	}
	if client {
		fmt.Fprintln(out, "---------------------------------------------------------------------------------------")
	}
	return sync(conn)
}

// newBench opens the device, connects a QP to the peer's (exchanging
// their numbers, addresses and keys over conn) and posts the receives
// cfg.Test needs; it returns after both sides are ready, with the path
// MTU it chose. Closing b.dev releases everything.
func newBench(conn net.Conn, devName string, gidIdx int, client bool, cfg config) (b *bench, mtu verbs.MTU, err error) {
	calibrate()
	dev, err := verbs.Open(devName)
	if err != nil {
		return nil, 0, err
	}
	defer func() {
		if err != nil {
			dev.Close()
		}
	}()
	b = &bench{cfg: cfg, client: client, conn: conn, dev: dev, wcs: make([]verbs.WC, 64)}
	b.max = max(cfg.MaxSize, 64)
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, 0, err
	}
	if b.scq, err = dev.NewCQ(cfg.TxDepth*2+16, nil); err != nil {
		return nil, 0, err
	}
	if b.rcq, err = dev.NewCQ(rxDepth*2, nil); err != nil {
		return nil, 0, err
	}
	if b.qp, err = pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: b.scq, RecvCQ: b.rcq,
		Cap: verbs.QPCap{MaxSendWR: cfg.TxDepth + 1, MaxRecvWR: rxDepth, MaxInlineData: cfg.Inline}}); err != nil {
		return nil, 0, fmt.Errorf("creating the QP (inline %d): %w", cfg.Inline, err)
	}
	if b.mr, err = pd.AllocMR(2*b.max+128, verbs.AccessAll); err != nil {
		return nil, 0, err
	}
	gids, err := dev.GIDs()
	if err != nil {
		return nil, 0, err
	}
	var gid verbs.GID
	for _, g := range gids {
		if g.Index == gidIdx && g.Port == 1 {
			gid = g.GID
		}
	}
	local := verbs.QPInfo{QPN: b.qp.QPN(), PSN: uint32(os.Getpid()) & 0xffffff, GID: gid}
	li, _ := local.MarshalBinary()
	li = binary.BigEndian.AppendUint64(li, b.mr.Addr()+uint64(b.max))
	li = binary.BigEndian.AppendUint32(li, b.mr.RKey())
	if err := writeMsg(conn, li); err != nil {
		return nil, 0, err
	}
	pi, err := readMsg(conn)
	if err != nil {
		return nil, 0, err
	}
	var remote verbs.QPInfo
	if err := remote.UnmarshalBinary(pi); err != nil {
		return nil, 0, err
	}
	b.peer = verbs.Remote{Addr: binary.BigEndian.Uint64(pi[verbs.QPInfoSize:]), RKey: binary.BigEndian.Uint32(pi[verbs.QPInfoSize+8:])}
	gi := gidIdx
	if gi == 0 {
		gi = -1
	}
	mtu = verbs.MTU1024
	if pa, err := dev.QueryPort(1); err == nil {
		mtu = pa.ActiveMTU
	}
	if cfg.MTU != 0 {
		mtu = verbs.MTUFromBytes(cfg.MTU)
	}
	if err := b.qp.Connect(local, remote, &verbs.ConnectOptions{GIDIndex: gi, PathMTU: mtu, Timeout: cfg.QPTimeout}); err != nil {
		return nil, 0, err
	}
	switch cfg.Test {
	case "send_lat":
		if err := b.postRecvs(rxDepth, 0); err != nil {
			return nil, 0, err
		}
	case "write_send_lat", "write_wait_send_lat", "write_imm_lat", "setup_lat":
		if err := b.postNotifyRecvs(rxDepth); err != nil {
			return nil, 0, err
		}
	}
	if err := sync(conn); err != nil {
		return nil, 0, err
	}
	return b, mtu, nil
}

func printHeader(out io.Writer, cfg config, dev string, qp *verbs.QP, mtu verbs.MTU) {
	title := map[string]string{"write_lat": "RDMA_Write Latency Test", "read_lat": "RDMA_Read Latency Test",
		"write_send_lat":      "RDMA_Write + Send completion Latency Test (Send behind the Write)",
		"write_wait_send_lat": "RDMA_Write + Send completion Latency Test (Send after the Write's completion)",
		"write_imm_lat":       "RDMA_Write_with_Immediate Latency Test (receive completion)",
		"setup_lat":           "RDMA buffer setup Latency Test (register, send address and key, answer)",
		"send_lat":            "Send Latency Test", "write_bw": "RDMA_Write BW Test", "read_bw": "RDMA_Read BW Test"}[cfg.Test]
	fmt.Fprintln(out, "---------------------------------------------------------------------------------------")
	loop := "Go loop over the pkg/verbs API"
	switch {
	case isBW(cfg.Test):
	case cfg.Loop == loopC:
		loop = "C loop on pkg/verbs objects"
	case cfg.Loop == loopPostSend:
		loop = "Go loop over the pkg/verbs API, QP.PostSend per post"
	case cfg.Test == "write_lat" || cfg.Test == "send_lat" || cfg.Test == "read_lat":
		loop = "Go loop over the pkg/verbs API, send plans"
	}
	fmt.Fprintf(out, "                    %s (rdmaperf, %s)\n", title, loop)
	fmt.Fprintf(out, " Device         : %s\n Connection type: RC\n Mtu            : %d[B]\n", dev, mtu.Bytes())
	fmt.Fprintf(out, " TX depth       : %d\n CQ Moderation  : %d\n Max inline data: %d[B]\n", cfg.TxDepth, cfg.CQMod, qp.Cap().MaxInlineData)
	fmt.Fprintln(out, "---------------------------------------------------------------------------------------")
	if isBW(cfg.Test) {
		fmt.Fprint(out, bwHeader)
	} else {
		fmt.Fprint(out, latHeader)
	}
}

func (b *bench) runSize(ctx context.Context, size int, out io.Writer) error {
	mem := b.mr.Bytes()
	clear(mem)
	fillPattern(mem[:size], size, b.client)
	if err := sync(b.conn); err != nil {
		return err
	}
	var sw *procStat
	if showSwitches {
		sw = readProcStat()
	}
	var err error
	switch b.cfg.Test {
	case "write_lat":
		if b.cfg.Warmup > 0 {
			if _, err := b.writeLat(ctx, size, b.cfg.Warmup); err != nil {
				return err
			}
			clear(mem[b.max : b.max+size])
			if err := sync(b.conn); err != nil {
				return err
			}
		}
		var samples []time.Duration
		if b.cfg.Loop == loopC {
			samples, err = b.cWriteLat(size, b.cfg.Iters)
		} else {
			samples, err = b.writeLat(ctx, size, b.cfg.Iters)
		}
		if err == nil && b.client {
			printLat(out, size, latStats(samples, 2))
		}
		if err == nil {
			err = b.checkPeerData(size-1, size)
		}
	case "send_lat":
		var samples []time.Duration
		if b.cfg.Loop == loopC {
			samples, err = b.cSendLat(size, b.cfg.Iters)
		} else {
			samples, err = b.sendLat(ctx, size)
		}
		if err == nil && b.client {
			printLat(out, size, latStats(samples, 2))
		}
		if err == nil {
			err = b.checkPeerData(size, size)
		}
	case "write_send_lat", "write_wait_send_lat", "write_imm_lat":
		var samples []time.Duration
		samples, err = b.notifyLat(ctx, size, b.cfg.Iters, b.cfg.Test == "write_wait_send_lat", b.cfg.Test == "write_imm_lat")
		if err == nil && b.client {
			printLat(out, size, latStats(samples, 2))
		}
		if err == nil {
			err = b.checkPeerData(size-1, size)
		}
	case "setup_lat":
		var samples []time.Duration
		if samples, err = b.setupLat(ctx, size); err == nil && b.client {
			printLat(out, size, latStats(samples, 1))
		}
	case "read_lat":
		if b.client {
			var samples []time.Duration
			if b.cfg.Loop == loopC {
				samples, err = b.cReadLat(size, b.cfg.Iters)
			} else {
				samples, err = b.readLat(ctx, size)
			}
			if err == nil {
				printLat(out, size, latStats(samples, 1))
				err = b.checkRead(size)
			}
		}
	case "write_bw", "read_bw":
		if b.client {
			var st BWStats
			if st, err = b.bw(ctx, size, b.cfg.Test == "read_bw"); err == nil {
				printBW(out, size, st)
				if b.cfg.Test == "read_bw" {
					err = b.checkRead(size)
				}
			}
		}
	}
	if err != nil {
		return err
	}
	if sw != nil {
		printProcStat(out, sw, readProcStat(), b.cfg.Iters)
	}
	if err := sync(b.conn); err != nil {
		return err
	}
	// The server checks what the client wrote in bandwidth tests.
	if b.cfg.Test == "write_bw" && !b.client {
		return b.checkPeerData(size, size)
	}
	return nil
}

// fillPattern fills mem with the pattern of a side's messages of size
// bytes, which checkPeerData and rvmaBench.checkData expect: seeded with
// the size, plus one on the client.
func fillPattern(mem []byte, size int, client bool) {
	seed := byte(size)
	if client {
		seed++
	}
	for i := range mem {
		mem[i] = seed + byte(i*13)
	}
}

// checkPeerData verifies that the first n bytes of the receive area hold
// the pattern the peer filled its send area with.
func (b *bench) checkPeerData(n, size int) error {
	peerSeed := byte(size) // the server's seed
	if !b.client {
		peerSeed++ // the client's
	}
	mem := b.mr.Bytes()[b.max:]
	for i := 0; i < n; i++ {
		if mem[i] != peerSeed+byte(i*13) {
			return fmt.Errorf("received byte %d is %#x, want %#x", i, mem[i], peerSeed+byte(i*13))
		}
	}
	return nil
}

// checkRead verifies the bytes RDMA READs brought from the server's send
// area into the client's receive area.
func (b *bench) checkRead(size int) error {
	mem := b.mr.Bytes()[b.max:]
	seed := byte(size)
	for i := 0; i < size; i++ {
		if mem[i] != seed+byte(i*13) {
			return fmt.Errorf("read byte %d is %#x, want %#x", i, mem[i], seed+byte(i*13))
		}
	}
	return nil
}

// spinByte waits until the byte at mem[i] holds want, reading the aligned
// word around it atomically so the compiler cannot hoist the load. Like
// verbs.CQ.Spin it lets the goroutine pass through the scheduler every
// verbs.YieldEvery (y, shared across the loop's waits): a goroutine that
// is not scheduled for 10 ms has its P retaken during its next long post,
// which costs the runtime's thread hand-offs (pkg/verbs, "Performance").
func spinByte(mem []byte, i int, want byte, deadline time.Time, y *verbs.Yielder) error {
	w := (*atomic.Uint32)(unsafe.Pointer(&mem[i&^3]))
	shift := uint(i&3) * 8
	for n := 1; ; n++ {
		if byte(w.Load()>>shift) == want {
			return nil
		}
		if n%1024 == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("no data from the peer (waiting for byte %d = %d)", i, want)
			}
			y.Maybe()
		}
	}
}

func (b *bench) spinCQ(ctx context.Context, cq *verbs.CQ, n int) error {
	for got := 0; got < n; {
		k, err := cq.Spin(ctx, b.wcs[:n-got])
		if err != nil {
			return err
		}
		for _, w := range b.wcs[:k] {
			if err := w.Err(); err != nil {
				return err
			}
		}
		got += k
	}
	return nil
}

// post posts a chain and, when its last work request is signaled, waits
// for that completion.
func (b *bench) post(ctx context.Context, wrs ...verbs.SendWR) error {
	if err := b.qp.PostSend(wrs...); err != nil {
		return err
	}
	if wrs[len(wrs)-1].Flags&verbs.SendSignaled == 0 {
		return nil
	}
	return b.spinCQ(ctx, b.scq, 1)
}

// poster posts one work request again and again, signaled or not: through
// two send plans that differ only in SendSignaled (so a post changes no
// field), or with -loop go-postsend through QP.PostSend.
type poster struct {
	b     *bench
	wr    verbs.SendWR
	plans [2]*verbs.SendPlan // unsignaled, signaled
}

func (b *bench) newPoster(wr verbs.SendWR, flags verbs.SendFlags) (*poster, error) {
	p := &poster{b: b, wr: wr}
	p.wr.Flags = flags &^ verbs.SendSignaled
	if b.cfg.Loop == loopPostSend {
		return p, nil
	}
	for i, f := range []verbs.SendFlags{0, verbs.SendSignaled} {
		w := p.wr
		w.Flags |= f
		var err error
		if p.plans[i], err = b.qp.NewSendPlan(w); err != nil {
			p.close()
			return nil, err
		}
	}
	return p, nil
}

// post posts the work request with flags (only SendSignaled may differ
// from the flags newPoster was given) and, if signaled, waits for its
// completion.
func (p *poster) post(ctx context.Context, flags verbs.SendFlags) error {
	signaled := flags&verbs.SendSignaled != 0
	if p.plans[0] == nil {
		w := p.wr
		w.Flags |= flags & verbs.SendSignaled
		return p.b.post(ctx, w)
	}
	pl := p.plans[0]
	if signaled {
		pl = p.plans[1]
	}
	if err := pl.Post(); err != nil {
		return err
	}
	if !signaled {
		return nil
	}
	return p.b.spinCQ(ctx, p.b.scq, 1)
}

func (p *poster) close() {
	for _, pl := range p.plans {
		if pl != nil {
			pl.Close()
		}
	}
}

func (b *bench) flags(size, scnt, iters int) verbs.SendFlags {
	var f verbs.SendFlags
	if size <= b.qp.Cap().MaxInlineData && size <= b.cfg.Inline {
		f |= verbs.SendInline
	}
	if scnt%b.cfg.CQMod == 0 || scnt == iters {
		f |= verbs.SendSignaled
	}
	return f
}

// writeLat is perftest's write latency loop: each side writes its counter
// into the peer's buffer and spins on the last byte of its own.
func (b *bench) writeLat(ctx context.Context, size, iters int) ([]time.Duration, error) {
	mem := b.mr.Bytes()
	stamps := make([]uint64, iters)
	ps, err := b.newPoster(verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{b.mr.SGE(0, size)}, RemoteAddr: b.peer.Addr, RKey: b.peer.RKey},
		b.flags(size, 1, iters))
	if err != nil {
		return nil, err
	}
	defer ps.close()
	deadline := time.Now().Add(30 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	scnt, rcnt := 0, 0
	var y verbs.Yielder
	for scnt < iters || rcnt < iters {
		if rcnt < iters && !(scnt < 1 && b.client) {
			rcnt++
			if err := spinByte(mem, b.max+size-1, byte(rcnt), deadline, &y); err != nil {
				return nil, err
			}
		}
		if scnt < iters {
			stamps[scnt] = rdtsc()
			scnt++
			mem[size-1] = byte(scnt)
			if err := ps.post(ctx, b.flags(size, scnt, iters)); err != nil {
				return nil, err
			}
		}
	}
	return cyclesToDurations(stamps), nil
}

func (b *bench) postRecvs(n, size int) error {
	if size <= 0 {
		size = b.max
	}
	if len(b.recvChain) < n || b.recvSize != size {
		b.recvChain = make([]verbs.RecvWR, max(n, rxDepth))
		for i := range b.recvChain {
			b.recvChain[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{b.mr.SGE(b.max, size)}}
		}
		b.recvSize = size
	}
	return b.qp.PostRecv(b.recvChain[:n]...)
}

// sendLat is perftest's send latency ping-pong: the client sends and waits
// for the server's answer, the server answers each message.
func (b *bench) sendLat(ctx context.Context, size int) ([]time.Duration, error) {
	iters := b.cfg.Iters
	stamps := make([]uint64, iters)
	ps, err := b.newPoster(verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{b.mr.SGE(0, size)}}, b.flags(size, 1, iters))
	if err != nil {
		return nil, err
	}
	defer ps.close()
	rx := &refiller{b: b, post: func(n int) error { return b.postRecvs(n, 0) }}
	recv := func() error { return rx.recv(ctx) }
	for i := 0; i < iters; i++ {
		if !b.client {
			if err := recv(); err != nil {
				return nil, err
			}
		}
		stamps[i] = rdtsc()
		if err := ps.post(ctx, b.flags(size, i+1, iters)); err != nil {
			return nil, err
		}
		if b.client {
			if err := recv(); err != nil {
				return nil, err
			}
		}
	}
	// Top the receive queue up again for the next size.
	if err := rx.flush(); err != nil {
		return nil, err
	}
	return cyclesToDurations(stamps), nil
}

// readLat times each RDMA READ from post to completion.
func (b *bench) readLat(ctx context.Context, size int) ([]time.Duration, error) {
	iters := b.cfg.Iters
	ps, err := b.newPoster(verbs.SendWR{Op: verbs.OpRead, SGL: []verbs.SGE{b.mr.SGE(b.max, size)},
		RemoteAddr: b.peer.Addr - uint64(b.max), RKey: b.peer.RKey}, verbs.SendSignaled)
	if err != nil {
		return nil, err
	}
	defer ps.close()
	samples := make([]time.Duration, 0, iters)
	for i := 0; i < iters; i++ {
		t0 := rdtsc()
		if err := ps.post(ctx, verbs.SendSignaled); err != nil {
			return nil, err
		}
		samples = append(samples, time.Duration(float64(rdtsc()-t0)/cyclesPerUsec*float64(time.Microsecond)))
	}
	return samples, nil
}

// postList is the longest chain bw posts in one call.
func (b *bench) postList(mod int) int {
	if b.cfg.PostList > 0 {
		return b.cfg.PostList
	}
	return mod
}

// bw keeps up to TxDepth work requests in flight, as perftest does, with
// every CQMod-th one signaled; the free slots are filled with chains cut
// at the signaled work requests and at PostList (perftest posts one per
// call unless told otherwise; on rxe, whose post system call does the
// whole transfer, chains are what lets the Go loop keep up: see
// docs/benchmarks.md). It measures from the first post to the last
// completion.
func (b *bench) bw(ctx context.Context, size int, read bool) (BWStats, error) {
	iters, depth, mod := b.cfg.Iters, b.cfg.TxDepth, min(b.cfg.CQMod, b.cfg.TxDepth)
	op := verbs.OpWrite
	local, remote := b.mr.SGE(0, size), b.peer.Addr
	if read {
		op = verbs.OpRead
		local, remote = b.mr.SGE(b.max, size), b.peer.Addr-uint64(b.max)
	}
	chain := make([]verbs.SendWR, mod)
	for i := range chain {
		chain[i] = verbs.SendWR{Op: op, SGL: []verbs.SGE{local}, RemoteAddr: remote, RKey: b.peer.RKey}
		if !read && size <= b.qp.Cap().MaxInlineData && size <= b.cfg.Inline {
			chain[i].Flags = verbs.SendInline
		}
	}
	posted, completed := 0, 0
	var peak float64
	start := time.Now()
	last := start
	for completed < iters {
		for posted < iters {
			// Fill the free slots, cutting chains at the signaled WRs.
			n := min(mod-posted%mod, iters-posted, depth-(posted-completed), b.postList(mod))
			if n <= 0 {
				break
			}
			for i := 0; i < n; i++ {
				chain[i].Flags &^= verbs.SendSignaled
			}
			if end := posted + n; end%mod == 0 || end == iters {
				chain[n-1].Flags |= verbs.SendSignaled
				chain[n-1].ID = uint64(end)
			}
			if err := b.qp.PostSend(chain[:n]...); err != nil {
				return BWStats{}, err
			}
			posted += n
		}
		k, err := b.scq.Spin(ctx, b.wcs)
		if err != nil {
			return BWStats{}, err
		}
		now := time.Now()
		for _, w := range b.wcs[:k] {
			if err := w.Err(); err != nil {
				return BWStats{}, err
			}
			done := int(w.ID)
			if dt := now.Sub(last).Seconds(); dt > 0 {
				if r := float64((done-completed)*size) / dt / (1 << 20); r > peak {
					peak = r
				}
			}
			completed = done
		}
		last = now
	}
	return bwStats(size, iters, time.Since(start), peak), nil
}
