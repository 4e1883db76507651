package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/perftest"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// The perftest bench: unmodified ib_read_bw / ib_write_bw clients on guest
// 2 against, on guest 1, a stock perftest server (the anchor) and pages of
// an Active Access target served through pkg/activeaccess/perftest: a page
// with no actions (the hooks armed for the other pages), and pages logging
// metadata (RL|WL) or the data (RLD|WLD) in three domains that differ in
// how their counting handler is woken (ptKinds).
const (
	ptAAPort    = 7710  // the target's rdma_cm port
	ptStockPort = 18515 // the stock server
	ptBasePort  = 18600 // + the page: the target's side channels
)

// The kinds, in page order after "stock": pages of the target with no
// actions, metadata logged (RL|WL), data logged (RLD|WLD), the handler's
// runtime woken per entry (threshold 1), for the "-a" kinds with adaptive
// moderation (the default: at once after a quiet 250 µs, else at most
// every 250 µs) and for the "-c" kinds coalesced (threshold 64, or 1 ms
// after the first entry).
var ptKinds = []string{"stock", "plain", "meta", "data", "meta-a", "data-a", "meta-c", "data-c"}

var ptPages = len(ptKinds) - 1 // the target's pages, one per kind after "stock"

// ptRun is one invocation of the perftest bench, as both guests see it.
type ptRun struct {
	prog   string   // ib_read_bw or ib_write_bw
	args   []string // perftest's arguments but the port and the server
	rounds int
	iters  int
	size   int
	verb   string
}

// barrier names the barrier what of round r and kind k.
func (p *ptRun) barrier(what string, r, k int) string {
	return fmt.Sprintf("pt-%s-%d-%s-%d-%s", p.verb, p.size, what, r, ptKinds[k])
}

// kind is the kind measured i-th in round r: the order rotates.
func (p *ptRun) kind(r, i int) int { return (i + r) % len(ptKinds) }

func benchPerftest(verb string, rounds, iters, size int) error {
	if verb != "read" && verb != "write" || rounds <= 0 || iters <= 0 || size <= 0 || size > 4096 {
		return errors.New("perftest: bad -verb, -rounds, -iters or -size (at most one page)")
	}
	tgt, err := isTarget()
	if err != nil {
		return err
	}
	dev := os.Getenv(labenv.EnvDevice)
	if dev == "" {
		return errors.New("perftest: the lab created no RDMA device")
	}
	p := &ptRun{prog: "ib_" + verb + "_bw", rounds: rounds, iters: iters, size: size, verb: verb,
		args: []string{"-F", "-d", dev, "-x", "1", "-s", fmt.Sprint(size), "-n", fmt.Sprint(iters)}}
	if tgt {
		return p.target()
	}
	return p.client()
}

// target serves the rounds on guest 1: the stock server when its turn
// comes, the target's pages throughout; then it checks that every access
// was handled.
func (p *ptRun) target() error {
	addr, err := target(ptAAPort)
	if err != nil {
		return err
	}
	tg, err := activeaccess.Listen(context.Background(), addr, ptPages*4096, &activeaccess.TargetOptions{LogSize: 8 << 20, MaxSources: 1})
	if err != nil {
		return err
	}
	defer tg.Close()
	var handled atomic.Int64
	count := func(*activeaccess.Access) { handled.Add(1) }
	meta := activeaccess.W | activeaccess.R | activeaccess.WL | activeaccess.RL
	data := activeaccess.W | activeaccess.R | activeaccess.WLD | activeaccess.RLD
	var doms []*activeaccess.Domain
	for _, dc := range []struct {
		h    activeaccess.Handler
		opts *activeaccess.DomainOptions
		page int // its meta page; the data page follows
	}{
		{count, &activeaccess.DomainOptions{Threshold: 1}, 1},
		{count, nil, 3},
		{count, &activeaccess.DomainOptions{Threshold: 64, Interval: time.Millisecond}, 5},
	} {
		d, err := tg.NewDomain(dc.h, dc.opts)
		if err != nil {
			return err
		}
		doms = append(doms, d)
		if err := d.Associate(dc.page*4096, 4096, meta); err != nil {
			return err
		}
		if err := d.Associate((dc.page+1)*4096, 4096, data); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	serveErr := make(chan error, ptPages)
	for pg := 0; pg < ptPages; pg++ {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(addr.Addr(), uint16(ptBasePort+pg)).String())
		if err != nil {
			return err
		}
		go func() { serveErr <- perftest.Serve(ctx, ln, tg, &perftest.Options{Offset: pg * 4096}) }()
	}
	for r := 0; r < p.rounds; r++ {
		for i := range ptKinds {
			if err := p.serveTurn(r, p.kind(r, i)); err != nil {
				return err
			}
		}
	}
	mtu, err := tg.PathMTU()
	if err != nil {
		return err
	}
	want := int64((ptPages - 1) * p.rounds * p.iters * ((p.size + mtu.Bytes() - 1) / mtu.Bytes())) // the logged pages
	for i := 0; i < 100 && handled.Load() < want; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	var refused, lost uint64
	for _, d := range doms {
		r, l := d.Refused()
		refused, lost = refused+r, lost+l
	}
	fmt.Printf("target: %d accesses handled (want %d), %d refused, %d lost\n", handled.Load(), want, refused, lost)
	cancel()
	for pg := 0; pg < ptPages; pg++ {
		if err := <-serveErr; !errors.Is(err, context.Canceled) {
			return err
		}
	}
	if handled.Load() != want || refused != 0 || lost != 0 {
		return errors.New("perftest: accesses lost or refused")
	}
	return tg.Err()
}

// serveTurn is guest 1's part of round r's run of kind k: it starts the
// stock server if k is "stock", lets the client go, and waits for it.
func (p *ptRun) serveTurn(r, k int) error {
	var srv *exec.Cmd
	var srvOut bytes.Buffer
	if ptKinds[k] == "stock" {
		srv = exec.Command(p.prog, append(p.args, "-p", fmt.Sprint(ptStockPort))...)
		srv.Stdout, srv.Stderr = &srvOut, &srvOut
		if err := srv.Start(); err != nil {
			return err
		}
		if err := waitListen(ptStockPort); err != nil {
			srv.Process.Kill()
			return err
		}
	}
	if err := labenv.Signal(p.barrier("ready", r, k)); err != nil {
		return err
	}
	if err := await(p.barrier("done", r, k)); err != nil {
		return err
	}
	if srv != nil {
		if err := srv.Wait(); err != nil {
			return fmt.Errorf("%s server: %v\n%s", p.prog, err, srvOut.Bytes())
		}
	}
	return nil
}

// client runs the perftest clients on guest 2 and prints the figures.
func (p *ptRun) client() error {
	host, err := labenv.AddrOf(1)
	if err != nil {
		return err
	}
	ser := newSeries(ptKinds, 1) // ratios to "plain"
	for r := 0; r < p.rounds; r++ {
		got := make([]float64, len(ptKinds))
		for i := range ptKinds {
			k := p.kind(r, i)
			if err := await(p.barrier("ready", r, k)); err != nil {
				return err
			}
			port := ptStockPort
			if k > 0 {
				port = ptBasePort + k - 1
			}
			out, err := exec.Command(p.prog, append(p.args, "-p", fmt.Sprint(port), host)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s against %s: %v\n%s", p.prog, ptKinds[k], err, out)
			}
			if got[k], err = msgRate(out, p.size); err != nil {
				return err
			}
			if err := labenv.Signal(p.barrier("done", r, k)); err != nil {
				return err
			}
		}
		ser.add(fmt.Sprintf("round %d: %s %d B messages/s:", r+1, p.prog, p.size), got)
	}
	ser.figures(fmt.Sprintf("perftest_%s_%dB", p.verb, p.size), "msgs_per_s", "messages/s")
	return nil
}

// msgRate returns the "MsgRate[Mpps]" of perftest's result line in
// messages per second (it has six decimals; the MB/s columns have two,
// too few for small messages).
func msgRate(out []byte, size int) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 5 && f[0] == fmt.Sprint(size) {
			if _, err := strconv.Atoi(f[1]); err == nil {
				mpps, err := strconv.ParseFloat(f[4], 64)
				if err == nil && mpps <= 0 {
					err = fmt.Errorf("a message rate of %v in:\n%s", mpps, out)
				}
				return mpps * 1e6, err
			}
		}
	}
	return 0, fmt.Errorf("no result line for %d bytes in:\n%s", size, out)
}

// waitListen waits until something listens on TCP port (the stock
// server), reading /proc/net/tcp: a perftest server takes the first
// connection as its client, so probing it by connecting would break it.
func waitListen(port int) error {
	want := fmt.Sprintf(":%04X ", port)
	for i := 0; i < 200; i++ {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			for _, l := range strings.Split(string(b), "\n") {
				if x := strings.Fields(l); len(x) > 3 && strings.HasSuffix(x[1]+" ", want) && x[3] == "0A" {
					return nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on port %d", port)
}
