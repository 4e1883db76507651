// Command rdmaperf measures RDMA latency and bandwidth through pkg/verbs the
// way perftest does, and prints the same statistics (t_min, t_max,
// t_typical, t_avg, t_stdev, 99% and 99.9% percentiles; BW peak and
// average in MB/sec, message rate, and Gb/sec), so the two can be read side
// by side.
//
// Usage (server first, then client, like ib_write_lat):
//
//	rdmaperf -d rxe0                                  # server: follows the client's settings
//	rdmaperf -d rxe0 -t write_lat -a 127.0.0.1        # client: all sizes 2 B .. 64 KiB
//	rdmaperf -d rxe0 -t write_bw -s 65536 -n 5000 10.77.0.1
//
// Tests: write_lat, read_lat, send_lat (ping-pong; latency is half the
// round trip, except read_lat which is one operation), write_bw, read_bw;
// write_send_lat and write_wait_send_lat (an RDMA WRITE whose completion
// the receiver learns from a 1-byte SEND, posted right behind the WRITE or
// after its completion); write_imm_lat (an RDMA WRITE WITH IMMEDIATE, the
// receiver waiting for its receive completion); setup_lat (registering a
// fresh buffer and sending its address and key to the writer: what RDMA
// pays per new buffer and RVMA does not); rvma_lat and rvma_bw (pkg/rvma puts; -guard none
// measures windows without the late-write guard, -src heap puts from, and
// Gets into, Go memory, which pkg/rvma copies); rvma_get_lat (an
// Endpoint.Get of a kept epoch, one at a time, against read_lat). See
// rvma.go and notify.go. rvma_lat -ab N runs N rounds of a block of the
// RVMA ping-pong followed by blocks of write_send_lat, write_wait_send_lat
// and write_lat between the same two processes, and prints the median
// ratios of their t_typical: under TCG, separate runs drift by more than
// the differences measured.
// As in perftest, write_lat spins on the last byte of its receive buffer,
// not on the CQ; send completions are requested every -cq-mod posts.
//
// rdmaperf re-executes itself with GODEBUG=asyncpreemptoff=1: a CPU profile
// of the Go write_lat loop under TCG spent 19% of its samples in
// runtime.asyncPreempt (a signal every 10 ms to the spinning goroutine, each
// saving every vector register of -cpu max). The spin loops still reach
// cooperative preemption points.
//
// A process pinned to one CPU (taskset, as perftest is run) gets
// GOMAXPROCS 1 from Go, and the runtime then hands the poster's P to
// another thread during every long post and must get it back through the
// scheduler: on rxe, where every post does its transfer inside the
// system call, that alone made the Go loop's read_lat up to 2.5x slower.
// rdmaperf therefore raises GOMAXPROCS to 2 for the verbs loops unless the
// environment sets it (pkg/verbs, "Performance"). The RVMA loops keep the
// runtime's choice, as an application of pkg/rvma would: pkg/rvma's
// spinners yield to the endpoint's goroutines themselves, and a second P
// on one CPU only lets each wake-up of those goroutines start a thread
// that preempts the spinner (docs/rvma.md, "Measured findings").
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"syscall"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
)

type config struct {
	Test    string
	Size    int
	MaxSize int
	All     bool
	Iters   int
	TxDepth int
	CQMod   int
	Inline  int
	Warmup  int
	MTU     int
	Loop    loopKind
	NoGuard bool // rvma tests: windows with rvma.GuardNone
	// Counting: rvma tests: who counts puts (-counting).
	Counting rvma.Counting
	// HeapSrc: rvma tests: puts from and Gets into Go heap memory, which
	// pkg/rvma copies through registered memory, instead of endpoint
	// memory (-src).
	HeapSrc bool
	// PostList caps the work requests one PostSend posts in the
	// bandwidth tests (perftest's -l; 0: no cap); client only, not sent
	// to the server.
	PostList int
	// AB is rvma_lat's -ab: rounds of a block of the ping-pong followed
	// by blocks of (b1), (b2) and write_lat (0: none).
	AB int
	// QPTimeout is the exponent of the RDMA loops' local ACK timeout,
	// 4.096 µs × 2^QPTimeout (perftest's -u; 14, 67 ms, by default). The
	// RVMA tests' links keep rdma_cm's (2^19 on RoCE, 2.1 s).
	QPTimeout int
}

func main() {
	if !strings.Contains(os.Getenv("GODEBUG"), "asyncpreemptoff") {
		env := []string{"GODEBUG=asyncpreemptoff=1," + os.Getenv("GODEBUG")}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "GODEBUG=") {
				env = append(env, kv)
			}
		}
		if self, err := os.Executable(); err == nil {
			err = syscall.Exec(self, os.Args, env)
			log.Printf("re-exec with asyncpreemptoff failed: %v", err)
		}
	}
	var (
		dev      = flag.String("d", "", "RDMA device (default: the first)")
		gidIdx   = flag.Int("x", 1, "GID index (1 is the RoCE v2 IPv4 GID on rxe)")
		port     = flag.Int("p", 18516, "TCP port of the side channel")
		test     = flag.String("t", "write_lat", "test: write_lat, read_lat, send_lat, write_bw, read_bw, write_send_lat, write_wait_send_lat, write_imm_lat, setup_lat, rvma_lat, rvma_bw, rvma_get_lat (client only)")
		size     = flag.Int("s", 2, "message size in bytes (client only)")
		all      = flag.Bool("a", false, "run every power-of-two size from 2 B to -max-size (client only)")
		maxSize  = flag.Int("max-size", 65536, "largest size with -a")
		iters    = flag.Int("n", 0, "iterations (default 1000 for latency, 5000 for bandwidth)")
		txDepth  = flag.Int("tx-depth", 128, "outstanding work requests in bandwidth tests")
		cqMod    = flag.Int("cq-mod", 100, "request a completion every N posts")
		postLst  = flag.Int("l", 0, "bandwidth tests: at most N work requests per PostSend call, like perftest's --post_list (0: the free slots up to the next signaled one, in one call)")
		inline   = flag.Int("I", 0, "send sizes up to N bytes inline (perftest on rxe reports 0)")
		mtu      = flag.Int("m", 0, "path MTU in bytes (default: the port's active MTU)")
		warmup   = flag.Int("warmup", 0, "warm-up iterations before measuring")
		loop     = flag.String("loop", "go", "latency loop: go (the pkg/verbs API, posting through send plans), go-postsend (the same, one QP.PostSend per post) or c (perftest's loop in C on the same objects)")
		guard    = flag.String("guard", "invalidate", "rvma tests: how completed buffers are guarded against late bytes: invalidate (the default) or none")
		counting = flag.String("counting", "auto", "rvma tests: who counts puts: auto (the kernel module if loaded), module or library")
		srcMem   = flag.String("src", "endpoint", "rvma tests: where puts come from and Gets go to: endpoint (memory from Endpoint.Alloc, which the NIC reads and writes directly) or heap (a Go slice, which pkg/rvma copies through registered memory)")
		cpuprof  = flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
		traceTo  = flag.String("trace", "", "write a Go execution trace of the run to this file")
		timeout  = flag.Duration("timeout", 2*time.Minute, "give up when the whole run takes longer")
		ab       = flag.Int("ab", 0, "rvma_lat: N rounds, each a block of the RVMA ping-pong (a) followed by blocks of write_send_lat (b1), write_wait_send_lat (b2) and write_lat (c) on the same two processes, -n/N iterations each; print per anchor the median and quartiles of the rounds' (a)/anchor ratios of t_typical (client only)")
		qpTmo    = flag.Int("u", 14, "RDMA loops: local ACK timeout exponent, 4.096 µs × 2^N, 1 to 31, as perftest's --qp-timeout (ACKs do not restart rxe 6.1's timer, so each time it runs out the request then in flight is sent again: a short timeout shows as retries and duplicates in a long run, without a lost packet)")
		ctxsw    = flag.Bool("ctxsw", false, "after each size, print the context switches per iteration of every thread of this process, its read and write system calls per iteration and, in the RVMA tests, the endpoint's notices, buffer waits and stale puts per iteration")
	)
	flag.Parse()
	showSwitches = *ctxsw
	log.SetFlags(0)
	log.SetPrefix("rdmaperf: ")
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	var conn net.Conn
	var err error
	client := flag.NArg() > 0
	var cfg config
	if client {
		cfg = config{Test: *test, Size: *size, MaxSize: *maxSize, All: *all, Iters: *iters, TxDepth: *txDepth, CQMod: *cqMod, Inline: *inline, Warmup: *warmup, MTU: *mtu, NoGuard: *guard == "none", PostList: *postLst, AB: *ab, QPTimeout: *qpTmo}
		var ok bool
		if cfg.Loop, ok = loopKinds[*loop]; !ok {
			log.Fatalf("-loop must be go, go-postsend or c, not %q", *loop)
		}
		switch *counting {
		case "auto":
		case "module":
			cfg.Counting = rvma.CountModule
		case "library":
			cfg.Counting = rvma.CountLibrary
		default:
			log.Fatalf("-counting must be auto, module or library, not %q", *counting)
		}
		if *guard != "none" && *guard != "invalidate" {
			log.Fatalf("-guard must be invalidate or none, not %q", *guard)
		}
		if *srcMem != "endpoint" && *srcMem != "heap" {
			log.Fatalf("-src must be endpoint or heap, not %q", *srcMem)
		}
		cfg.HeapSrc = *srcMem == "heap"
		if cfg.Iters == 0 {
			cfg.Iters = 1000
			if isBW(cfg.Test) {
				cfg.Iters = 5000
			}
		}
		if cfg.PostList < 0 {
			log.Fatalf("-l must not be negative, not %d", cfg.PostList)
		}
		if !cfg.All {
			cfg.MaxSize = cfg.Size
		}
		if err := cfg.check(); err != nil {
			log.Fatal(err)
		}
		var d net.Dialer
		for {
			conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort(flag.Arg(0), fmt.Sprint(*port)))
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			log.Fatal(err)
		}
		if err := writeMsg(conn, cfg.marshal()); err != nil {
			log.Fatal(err)
		}
	} else {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
		if err != nil {
			log.Fatal(err)
		}
		go func() { <-ctx.Done(); l.Close() }()
		conn, err = l.Accept()
		l.Close()
		if err != nil {
			log.Fatal(err)
		}
		b, err := readMsg(conn)
		if err != nil {
			log.Fatal(err)
		}
		if err := cfg.unmarshal(b); err != nil {
			log.Fatal(err)
		}
	}
	defer conn.Close()
	if !strings.HasPrefix(cfg.Test, "rvma") {
		runtime.GOMAXPROCS(verbsProcs())
	}
	go func() { <-ctx.Done(); conn.SetDeadline(time.Now()) }()
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *traceTo != "" {
		f, err := os.Create(*traceTo)
		if err != nil {
			log.Fatal(err)
		}
		if err := trace.Start(f); err != nil {
			log.Fatal(err)
		}
		defer trace.Stop()
	}
	runTest := run
	if isRVMA(cfg.Test) {
		runTest = runRVMA
	}
	if err := runTest(ctx, conn, *dev, *gidIdx, client, cfg, os.Stdout); err != nil {
		pprof.StopCPUProfile()
		trace.Stop()
		log.Fatal(err)
	}
}

// verbsProcs is the GOMAXPROCS the verbs loops run with: 2 where the
// runtime chose 1, unless the environment sets it (see the package doc).
func verbsProcs() int {
	p := runtime.GOMAXPROCS(0)
	if os.Getenv("GOMAXPROCS") == "" && p < 2 {
		return 2
	}
	return p
}

func isBW(test string) bool { return test == "write_bw" || test == "read_bw" || test == "rvma_bw" }

func isRVMA(test string) bool {
	return test == "rvma_lat" || test == "rvma_bw" || test == "rvma_get_lat"
}

// loopKind is how a latency test posts: through send plans, through
// QP.PostSend, or in C.
type loopKind int

const (
	loopGo loopKind = iota
	loopC
	loopPostSend
)

var loopKinds = map[string]loopKind{"go": loopGo, "c": loopC, "go-postsend": loopPostSend}

func (c config) check() error {
	switch c.Test {
	case "write_lat", "read_lat", "send_lat", "write_bw", "read_bw", "write_send_lat", "write_wait_send_lat", "write_imm_lat", "setup_lat":
	case "rvma_lat", "rvma_bw", "rvma_get_lat":
	default:
		return fmt.Errorf("unknown test %q", c.Test)
	}
	if c.Loop < loopGo || c.Loop > loopPostSend {
		return fmt.Errorf("unknown loop %d", c.Loop)
	}
	if c.Size < 1 || c.MaxSize < c.Size || c.Iters < 2 || c.TxDepth < 1 || c.CQMod < 1 {
		return fmt.Errorf("bad settings %+v", c)
	}
	if c.Test == "write_lat" && c.Size < 2 && !c.All {
		return fmt.Errorf("write_lat needs at least 2 bytes")
	}
	if c.QPTimeout < 1 || c.QPTimeout > 31 {
		return fmt.Errorf("-u must be from 1 to 31, not %d", c.QPTimeout)
	}
	if c.AB < 0 || c.AB > 0 && (c.Test != "rvma_lat" || c.Iters/c.AB < 2 || c.Size < 2) {
		return fmt.Errorf("-ab needs rvma_lat, at least 2 bytes and at least 2 iterations per block")
	}
	return nil
}

func (c config) marshal() []byte {
	b := []byte{byte(len(c.Test))}
	b = append(b, c.Test...)
	all := uint32(0)
	if c.All {
		all = 1
	}
	ng := int(c.Counting) << 1 // bit 0: NoGuard, bits 1-2: Counting, bit 3: HeapSrc
	if c.NoGuard {
		ng |= 1
	}
	if c.HeapSrc {
		ng |= 8
	}
	for _, v := range []int{c.Size, c.MaxSize, int(all), c.Iters, c.TxDepth, c.CQMod, c.Inline, c.Warmup, c.MTU, int(c.Loop), ng, c.AB, c.QPTimeout} {
		b = binary.BigEndian.AppendUint32(b, uint32(v))
	}
	return b
}

func (c *config) unmarshal(b []byte) error {
	if len(b) < 1 || len(b) < 1+int(b[0])+52 {
		return fmt.Errorf("short config message")
	}
	c.Test = string(b[1 : 1+b[0]])
	b = b[1+b[0]:]
	v := make([]int, 13)
	for i := range v {
		v[i] = int(binary.BigEndian.Uint32(b[4*i:]))
	}
	c.Size, c.MaxSize, c.All, c.Iters, c.TxDepth, c.CQMod, c.Inline, c.Warmup, c.MTU, c.Loop, c.NoGuard = v[0], v[1], v[2] == 1, v[3], v[4], v[5], v[6], v[7], v[8], loopKind(v[9]), v[10]&1 == 1
	c.Counting = rvma.Counting(v[10] >> 1 & 3)
	c.HeapSrc = v[10]&8 != 0
	c.AB = v[11]
	c.QPTimeout = v[12]
	return c.check()
}

func writeMsg(w io.Writer, b []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	_, err := w.Write(append(hdr[:], b...))
	return err
}

func readMsg(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	_, err := io.ReadFull(r, b)
	return b, err
}

// sizes lists the message sizes of a run.
func sizes(size, max int, all bool) []int {
	if !all {
		return []int{size}
	}
	var s []int
	for n := 2; n <= max; n *= 2 {
		s = append(s, n)
	}
	return s
}

// sync exchanges a byte with the peer: a barrier between phases.
func sync(c net.Conn) error {
	if _, err := c.Write([]byte{1}); err != nil {
		return err
	}
	var b [1]byte
	_, err := io.ReadFull(c, b[:])
	return err
}
