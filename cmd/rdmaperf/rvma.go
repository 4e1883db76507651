package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// The RVMA tests measure pkg/rvma the way the others measure raw verbs:
//
//   - rvma_lat: ping-pong of puts. Each side puts size bytes to the other's
//     mailbox, whose window completes an epoch every size bytes, and learns
//     of the peer's put from its buffer's completion (Posted.Spin), never
//     from the data: the time the paper's Figure 4 plots, from put start
//     until the receiving application sees the completion (half the round
//     trip).
//   - rvma_bw: the client streams puts of size bytes, up to -tx-depth in
//     flight, into a window whose buffers hold rvmaBatch puts each and are
//     released and re-posted by the server as they complete. Bandwidth runs
//     from the first put to the completion of the last one at the sender,
//     as in write_bw; the server checks that every epoch completed with
//     every byte. Both sides wait parked (PutOp.Wait, Posted.Wait): with
//     both busy-polling instead (a PutOp.Spin like Posted.Spin) rvma_bw
//     ran at a third of this in loopback (docs/benchmarks.md).
//   - rvma_get_lat: the client puts one epoch of size bytes into the
//     server's window, which keeps it (WindowOptions.Keep), then reads it
//     back with Endpoint.Get, one Get at a time, and times each: post of
//     the GET to the last READ's completion, the time read_lat gives for
//     one RDMA READ of the same size. The bytes of the first and the
//     last Get are checked.
const (
	rvmaPort = 7491 // the endpoint's port; the client's is rvmaPort+1
	// rvmaBuffers is the buffers posted per window in rvma_lat: the sender
	// is shown those the application does not hold, all 31 when the
	// module counts (a notice every 30 epochs), rvma.ShownBuffers when
	// the library does (one every ShownBuffers-1).
	rvmaBuffers = 32
	rvmaBWBufs  = 4  // buffers posted per window in rvma_bw (16 puts per epoch: notices are rare anyway)
	rvmaBatch   = 16 // puts per buffer in rvma_bw
)

// rvmaBench is one side of an RVMA test.
type rvmaBench struct {
	cfg    config
	client bool
	conn   net.Conn
	ep     *rvma.Endpoint
	peer   netip.AddrPort
	src    []byte // endpoint memory, sent without a copy; Go heap memory with -src heap
	bufs   [][]byte
	max    int
	anchor *bench // -ab: the QP of the RDMA loops (b1), (b2) and (c) to the same peer
}

func runRVMA(ctx context.Context, conn net.Conn, devName string, gidIdx int, client bool, cfg config, out io.Writer) error {
	calibrate()
	ip, err := deviceIP(devName, gidIdx)
	if err != nil {
		return err
	}
	port := uint16(rvmaPort)
	if client {
		port++
	}
	ep, err := rvma.Listen(ctx, netip.AddrPortFrom(ip, port), &rvma.EndpointOptions{Stripes: 1, Counting: cfg.Counting})
	if err != nil {
		return err
	}
	defer ep.Close()
	b := &rvmaBench{cfg: cfg, client: client, conn: conn, ep: ep, max: max(cfg.MaxSize, 64)}
	a, _ := ep.Addr().MarshalBinary()
	if err := writeMsg(conn, a); err != nil {
		return err
	}
	pa, err := readMsg(conn)
	if err != nil {
		return err
	}
	if err := b.peer.UnmarshalBinary(pa); err != nil {
		return fmt.Errorf("peer endpoint address: %w", err)
	}
	if cfg.AB > 0 {
		vcfg := cfg
		vcfg.Test = "write_send_lat" // its receives for the SENDs of (b1) and (b2) are posted
		if b.anchor, _, err = newBench(conn, devName, gidIdx, client, vcfg); err != nil {
			return fmt.Errorf("the RDMA loops' QP for -ab: %w", err)
		}
		defer b.anchor.dev.Close()
	}
	bufLen := b.max
	if cfg.Test == "rvma_bw" {
		bufLen = b.max * rvmaBatch
	}
	if cfg.HeapSrc {
		b.src = make([]byte, b.max)
	} else if b.src, err = ep.Alloc(b.max); err != nil {
		return err
	}
	nbufs := rvmaBuffers
	if cfg.Test == "rvma_bw" {
		nbufs = rvmaBWBufs
	}
	for i := 0; i < nbufs; i++ {
		m, err := ep.Alloc(bufLen)
		if err != nil {
			return err
		}
		b.bufs = append(b.bufs, m)
	}
	if client {
		title := map[string]string{"rvma_lat": "RVMA Put Latency Test", "rvma_bw": "RVMA Put BW Test", "rvma_get_lat": "RVMA Get Latency Test"}[cfg.Test]
		fmt.Fprintln(out, "---------------------------------------------------------------------------------------")
		fmt.Fprintf(out, "                    %s (rdmaperf, pkg/rvma)\n", title)
		fmt.Fprintf(out, " Device         : %s\n Endpoint       : %v -> %v\n Stripes        : 1\n Buffers        : %d\n Guard          : %s\n Counting       : %s\n", devName, ep.Addr(), b.peer, nbufs, map[bool]string{false: "invalidate", true: "none"}[cfg.NoGuard], ep.Counting())
		if cfg.AB > 0 {
			fmt.Fprintf(out, " A/B rounds     : %d of %d iterations, RVMA then (b1), (b2), (c)\n", cfg.AB, cfg.Iters/cfg.AB)
		}
		fmt.Fprintln(out, "---------------------------------------------------------------------------------------")
		if cfg.Test == "rvma_bw" {
			fmt.Fprint(out, bwHeader)
		} else {
			fmt.Fprint(out, latHeader)
		}
	}
	for _, size := range sizes(cfg.Size, cfg.MaxSize, cfg.All) {
		if err := b.runSize(ctx, size, out); err != nil {
			return fmt.Errorf("%s, %d bytes: %w", cfg.Test, size, err)
		}
	}
	if client {
		fmt.Fprintln(out, "---------------------------------------------------------------------------------------")
	}
	return sync(conn)
}

// deviceIP returns the IPv4 address behind GID gidIdx of the device's
// port 1: the address an endpoint on that device listens on.
func deviceIP(devName string, gidIdx int) (netip.Addr, error) {
	dev, err := verbs.Open(devName)
	if err != nil {
		return netip.Addr{}, err
	}
	defer dev.Close()
	gids, err := dev.GIDs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, g := range gids {
		if g.Port == 1 && g.Index == gidIdx {
			if ip, ok := netip.AddrFromSlice(g.GID.IP().To4()); ok {
				return ip, nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("%s: GID index %d of port 1 is not an IPv4 RoCE GID", dev.Name(), gidIdx)
}

func (b *rvmaBench) runSize(ctx context.Context, size int, out io.Writer) error {
	fillPattern(b.src[:size], size, b.client)
	mb := rvma.Mailbox(0x52564D41_00000000 | uint64(size))
	threshold := uint64(size)
	if b.cfg.Test == "rvma_bw" {
		threshold = uint64(size) * rvmaBatch
	}
	opts := rvma.WindowOptions{Threshold: threshold}
	if b.cfg.Test == "rvma_get_lat" {
		opts.Keep = 1
	}
	if b.cfg.NoGuard {
		opts.Guard = rvma.GuardNone
	}
	w, err := b.ep.InitWindow(mb, &opts)
	if err != nil {
		return err
	}
	defer w.Close()
	posted := make([]*rvma.Posted, len(b.bufs))
	for i, m := range b.bufs {
		if posted[i], err = w.Post(ctx, m[:threshold], nil); err != nil {
			return err
		}
	}
	if err := sync(b.conn); err != nil {
		return err
	}
	switch b.cfg.Test {
	case "rvma_lat":
		if b.anchor != nil {
			if err := b.abLat(ctx, mb, size, posted, out); err != nil {
				return err
			}
			break
		}
		done := b.switches(out, b.cfg.Iters)
		samples, err := b.lat(ctx, mb, size, posted, 0, b.cfg.Iters)
		if err != nil {
			return err
		}
		if b.client {
			printLat(out, size, latStats(samples, 2))
		}
		done()
	case "rvma_get_lat":
		if err := b.getLat(ctx, mb, size, posted[0], out); err != nil {
			return err
		}
	case "rvma_bw":
		if b.client {
			done := b.switches(out, b.cfg.Iters-b.cfg.Iters%rvmaBatch)
			st, err := b.bw(ctx, mb, size)
			if err != nil {
				return err
			}
			printBW(out, size, st)
			done()
		} else if err := b.drain(ctx, size, posted); err != nil {
			return err
		}
	}
	return sync(b.conn)
}

// switches starts -ctxsw's count for a run of iters iterations; the
// function it returns prints the process's context switches and system
// calls and the endpoint's counters (printEndpointStats) per iteration
// since (nothing without -ctxsw).
func (b *rvmaBench) switches(out io.Writer, iters int) func() {
	if !showSwitches {
		return func() {}
	}
	sw, es := readProcStat(), b.ep.Stats()
	return func() {
		printProcStat(out, sw, readProcStat(), iters)
		printEndpointStats(out, es, b.ep.Stats(), iters)
	}
}

// printEndpointStats prints -ctxsw's line of the endpoint's counters per
// iteration between before and after: notices sent, puts that waited for
// a buffer, and puts refused as stale.
func printEndpointStats(w io.Writer, before, after rvma.EndpointStats, iters int) {
	n := float64(iters)
	fmt.Fprintf(w, "# endpoint per iteration: notices %.2f, buffer waits %.2f, stale puts %.3f\n",
		float64(after.Notices-before.Notices)/n, float64(after.BufferWaits-before.BufferWaits)/n, float64(after.StalePuts-before.StalePuts)/n)
}

// lat is the put ping-pong. Puts need no wait of their own: the answer
// arrives only after the peer saw the put complete, and any error of an
// earlier put is collected before the next one starts. A side releases
// the buffer it received into right after its answering put, as an
// application that answers first would: with rvmaBuffers posted, the
// buffer is not needed again for rvmaBuffers-1 more epochs. Epoch from+i
// is the i-th of this call (calls of -ab continue the window's epochs).
func (b *rvmaBench) lat(ctx context.Context, mb rvma.Mailbox, size int, posted []*rvma.Posted, from, iters int) ([]time.Duration, error) {
	stamps := make([]uint64, iters)
	var prev *rvma.PutOp
	var held *rvma.Posted
	recv := func(i int) error {
		p := posted[(from+i)%len(posted)]
		rec, err := p.Spin(ctx)
		if err != nil {
			return err
		}
		if rec.Len != uint64(size) || rec.Ops != 1 {
			return fmt.Errorf("epoch %d completed with %d bytes in %d puts, want %d in 1", rec.Epoch, rec.Len, rec.Ops, size)
		}
		held = p
		return b.checkData(p.Bytes()[:size], size, (from+i)%fullCheckEvery == 0)
	}
	release := func() error {
		if held == nil {
			return nil
		}
		p := held
		held = nil
		return p.Release(ctx)
	}
	for i := 0; i < iters; i++ {
		if !b.client {
			if err := recv(i); err != nil {
				return nil, err
			}
		}
		stamps[i] = rdtsc()
		op := b.ep.PutAsync(ctx, b.peer, mb, 0, b.src[:size])
		// The previous put's outcome is checked once this one is on its
		// way: nothing this put does waits for it, and its completion
		// may still be in the CQ, which the wait would poll first.
		if prev != nil {
			if err := prev.Wait(ctx); err != nil {
				return nil, err
			}
		}
		prev = op
		if err := release(); err != nil {
			return nil, err
		}
		if b.client {
			if err := recv(i); err != nil {
				return nil, err
			}
		}
	}
	if err := prev.Wait(ctx); err != nil {
		return nil, err
	}
	return cyclesToDurations(stamps), release()
}

// abLat is rvma_lat with -ab: cfg.AB rounds, each a block of the
// ping-pong (a) followed by blocks as long of the RDMA loops Figure 4
// compares it with, on the anchor's QP to the same peer: (b1) WRITE and
// SEND in one chain, (b2) the SEND after the WRITE's completion, (c)
// write_lat. So every tool sees the same moments of a TCG host, whose
// speed drifts by more than the differences measured. Each tool runs with
// its own GOMAXPROCS (the verbs loops' 2 where the runtime chose 1). The
// client prints the RVMA samples of all blocks as the result, then, per
// anchor, the median and quartiles of the rounds' ratios of (a)'s
// t_typical to the anchor's.
func (b *rvmaBench) abLat(ctx context.Context, mb rvma.Mailbox, size int, posted []*rvma.Posted, out io.Writer) error {
	n := b.cfg.Iters / b.cfg.AB
	v := b.anchor
	mem := v.mr.Bytes()
	fillPattern(mem[:size], size, b.client)
	procs, anchorProcs := runtime.GOMAXPROCS(0), verbsProcs()
	anchors := []struct {
		name string
		run  func() ([]time.Duration, error)
	}{
		{"b1", func() ([]time.Duration, error) { return v.notifyLat(ctx, size, n, false, false) }},
		{"b2", func() ([]time.Duration, error) { return v.notifyLat(ctx, size, n, true, false) }},
		{"c", func() ([]time.Duration, error) {
			// write_lat spins on the last byte: the peer writes only
			// after both cleared it.
			clear(mem[v.max : v.max+size])
			if err := sync(b.conn); err != nil {
				return nil, err
			}
			return v.writeLat(ctx, size, n)
		}},
	}
	var all []time.Duration
	var es rvma.EndpointStats
	sums := make([]procSum, 1+len(anchors)) // -ctxsw: (a), then the anchors
	stat := func() *procStat {
		if !showSwitches {
			return nil
		}
		return readProcStat()
	}
	if showSwitches {
		es = b.ep.Stats()
	}
	ta := make([]float64, 0, b.cfg.AB)
	tx := make([][]float64, len(anchors))     // the anchors' t_typical per round
	ratios := make([][]float64, len(anchors)) // (a)/anchor per round
	for k := 0; k < b.cfg.AB; k++ {
		before := stat()
		s, err := b.lat(ctx, mb, size, posted, k*n, n)
		if err != nil {
			return fmt.Errorf("block %d: %w", k, err)
		}
		sums[0].add(before, stat(), n)
		all = append(all, s...)
		a := latStats(s, 2).Typical
		ta = append(ta, a)
		for i, an := range anchors {
			if err := sync(b.conn); err != nil {
				return err
			}
			runtime.GOMAXPROCS(anchorProcs)
			before := stat()
			s, err := an.run()
			sums[1+i].add(before, stat(), n)
			runtime.GOMAXPROCS(procs)
			if err == nil {
				err = v.checkPeerData(size-1, size)
			}
			if err != nil {
				return fmt.Errorf("(%s) block %d: %w", an.name, k, err)
			}
			c := latStats(s, 2).Typical
			tx[i], ratios[i] = append(tx[i], c), append(ratios[i], a/c)
		}
		if err := sync(b.conn); err != nil {
			return err
		}
	}
	if b.client {
		printLat(out, size, latStats(all, 2))
		q := func(xs []float64, f float64) float64 {
			slices.Sort(xs)
			return xs[min(int(f*float64(len(xs))), len(xs)-1)]
		}
		fmt.Fprintf(out, "# ab: %d rounds of %d iterations per tool; t_typical median (a) %.2f usec\n", b.cfg.AB, n, q(ta, 0.5))
		for i, an := range anchors {
			fmt.Fprintf(out, "# ab: (a)/(%s) median %.3f, quartiles %.3f to %.3f; t_typical median (%s) %.2f usec\n",
				an.name, q(ratios[i], 0.5), q(ratios[i], 0.25), q(ratios[i], 0.75), an.name, q(tx[i], 0.5))
		}
	}
	if showSwitches {
		sums[0].print(out, "(a)")
		printEndpointStats(out, es, b.ep.Stats(), sums[0].iters)
		for i, an := range anchors {
			sums[1+i].print(out, "("+an.name+")")
		}
	}
	return nil
}

// getLat is rvma_get_lat: the client puts one epoch into the server's
// window and times Iters Gets of it; the server waits for that epoch and
// keeps it until the client is done.
func (b *rvmaBench) getLat(ctx context.Context, mb rvma.Mailbox, size int, p *rvma.Posted, out io.Writer) error {
	if !b.client {
		rec, err := p.Wait(ctx)
		if err != nil {
			return err
		}
		if rec.Len != uint64(size) {
			return fmt.Errorf("epoch %d completed with %d bytes, want %d", rec.Epoch, rec.Len, size)
		}
		return sync(b.conn) // the epoch is kept: the client may read it
	}
	if err := b.ep.Put(ctx, b.peer, mb, 0, b.src[:size]); err != nil {
		return err
	}
	if err := sync(b.conn); err != nil {
		return err
	}
	// Read into endpoint memory, which the NIC writes directly (the
	// client's own posted buffers: nothing is put to them in this test),
	// or with -src heap into a Go slice, which pkg/rvma reads through a
	// registered copy; cleared before each checked Get.
	into := b.bufs[0][:size]
	if b.cfg.HeapSrc {
		into = make([]byte, size)
	}
	samples := make([]time.Duration, 0, b.cfg.Iters)
	for i := 0; i < b.cfg.Iters; i++ {
		if i == 0 || i == b.cfg.Iters-1 {
			clear(into)
		}
		t0 := rdtsc()
		res, err := b.ep.Get(ctx, b.peer, mb, rvma.LastEpoch, 0, into)
		samples = append(samples, time.Duration(float64(rdtsc()-t0)/cyclesPerUsec*float64(time.Microsecond)))
		if err != nil {
			return err
		}
		if res.N != size {
			return fmt.Errorf("get %d read %d bytes, want %d", i, res.N, size)
		}
		if i == 0 || i == b.cfg.Iters-1 {
			if err := b.checkOwn(into, size); err != nil {
				return fmt.Errorf("get %d: %w", i, err)
			}
		}
	}
	printLat(out, size, latStats(samples, 1))
	return nil
}

// checkOwn verifies that got holds the pattern this side wrote into src
// for size, every byte.
func (b *rvmaBench) checkOwn(got []byte, size int) error {
	for i := range got {
		if got[i] != b.src[i] {
			return fmt.Errorf("byte %d of %d is %#x, want %#x", i, size, got[i], b.src[i])
		}
	}
	return nil
}

// fullCheckEvery is how often checkData verifies every byte of an epoch:
// once in this many epochs of a loop, so that verification, which the
// RDMA loops compared with do once per block and perftest never does,
// stays out of the latency and bandwidth figures (checking every epoch
// added 17 % to a 256 KiB put's t_typical in loopback under TCG, and
// 10 % at 4 KiB; docs/benchmarks.md).
const fullCheckEvery = 64

// checkData verifies the peer's pattern in a completed buffer: the first
// and last bytes always, every byte when full.
func (b *rvmaBench) checkData(got []byte, size int, full bool) error {
	peerSeed := byte(size)
	if !b.client {
		peerSeed++
	}
	check := func(i int) error {
		if got[i] != peerSeed+byte(i*13) {
			return fmt.Errorf("received byte %d is %#x, want %#x", i, got[i], peerSeed+byte(i*13))
		}
		return nil
	}
	if err := check(0); err != nil {
		return err
	}
	if err := check(size - 1); err != nil {
		return err
	}
	if full {
		for i := range got {
			if err := check(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// bw streams Iters puts, keeping up to TxDepth in flight.
func (b *rvmaBench) bw(ctx context.Context, mb rvma.Mailbox, size int) (BWStats, error) {
	iters, depth := b.cfg.Iters, b.cfg.TxDepth
	// Whole epochs only, so the server sees every buffer complete.
	iters -= iters % rvmaBatch
	ops := make([]*rvma.PutOp, iters)
	start := time.Now()
	done := 0
	for i := 0; i < iters; i++ {
		for i-done >= depth {
			if err := ops[done].Wait(ctx); err != nil {
				return BWStats{}, err
			}
			done++
		}
		ops[i] = b.ep.PutAsync(ctx, b.peer, mb, uint64(i%rvmaBatch*size), b.src[:size])
	}
	for ; done < iters; done++ {
		if err := ops[done].Wait(ctx); err != nil {
			return BWStats{}, err
		}
	}
	return bwStats(size, iters, time.Since(start), 0), nil
}

// drain is the receiving side of rvma_bw: it waits for every epoch,
// checks its count and its bytes, and re-posts the buffer.
func (b *rvmaBench) drain(ctx context.Context, size int, posted []*rvma.Posted) error {
	epochs := (b.cfg.Iters - b.cfg.Iters%rvmaBatch) / rvmaBatch
	for e := 0; e < epochs; e++ {
		p := posted[e%len(posted)]
		rec, err := p.Wait(ctx)
		if err != nil {
			return err
		}
		if rec.Len != uint64(size*rvmaBatch) || rec.Ops != rvmaBatch {
			return fmt.Errorf("epoch %d completed with %d bytes in %d puts, want %d in %d", rec.Epoch, rec.Len, rec.Ops, size*rvmaBatch, rvmaBatch)
		}
		for k := 0; k < rvmaBatch; k++ {
			if err := b.checkData(p.Bytes()[k*size:(k+1)*size], size, e%fullCheckEvery == 0); err != nil {
				return fmt.Errorf("epoch %d, put %d: %w", rec.Epoch, k, err)
			}
		}
		if err := p.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}
