// Command rvmahalo is the halo-exchange benchmark of docs/rvma.md: the
// guests of a lab boot form a ring; every step each guest sends a face of
// -face bytes to both neighbours and waits for both of theirs, then moves
// to the next step. It runs the exchange once in the mode -mode names
// (test/softroce/bench/rvma-halo.sh runs every mode in one boot) and
// prints its steps per second:
//
//   - rvma: each guest opens two windows (mailboxes by step parity) whose
//     epochs complete at two faces' worth of bytes, one from each
//     neighbour (with -share, the default, the windows promise that
//     share: WindowOptions.Share), posts -buffers buffers to each
//     (ShownBuffers+1 by default), and puts its faces to its neighbours'
//     mailboxes; it never learns a buffer address. It
//     waits for each step's epoch with Posted.Wait (the goroutine parks);
//     rvma-spin is the same exchange waiting with Posted.Spin, as the
//     rdma mode spins on its CQ. rvma-peer opens one window per parity
//     and neighbour instead, each filled by that neighbour alone (an
//     epoch is one face): the one-sender case, where a sender counts its
//     own epochs and the receiver sends no notice per epoch.
//   - rdma: the same exchange on plain verbs, written the way an RDMA
//     program must: buffers registered and their addresses and keys sent
//     to the neighbours first (the setup, timed on its own), then per step
//     an RDMA WRITE of the face into the neighbour's buffer for that parity
//     and a 1-byte SEND behind it on the same QP, which tells the
//     neighbour the face is complete. It spins on its CQs; rdma-wait is
//     the same exchange parked on a completion channel instead, which is
//     what rvma's Posted.Wait is to be compared with.
//
// Every received face is checked (first and last bytes every step, every
// byte every 16th step). It runs only inside the lab (test/softroce),
// which gives it its index, the ring's addresses and the barriers:
//
//	rvmahalo -mode rvma -face 4096 -steps 300 -run 1
//
// Output, two lines per mode on every guest (the steps, and the guest's
// CPU time they took, kernel included), and for the rvma modes one more
// with the endpoint's counters (notices sent per step, stale puts,
// puts that waited for a buffer, link failures):
//
//	HALO <mode> <guests> <face bytes> <steps> <steps/s> <setup µs>
//	HALOCPU <mode> <face bytes> ms/step <guest CPU ms per step> user <ms> sys <ms> irq <ms> busy <share of the guest's CPU time> reads/step <n> writes/step <n>
//	HALOSTATS <mode> <face bytes> notices/step <n> stale <n> bufferwaits <n> linkfailures <n>
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"runtime/pprof"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// ring is this guest's place in the ring.
type ring struct {
	index, n    int // 1-based index, number of guests
	left, right int
	run         string // prefixes barrier names
	self        netip.Addr
	addrs       []netip.Addr // by index-1
}

func main() {
	var (
		mode    = flag.String("mode", "rvma", "rvma, rvma-spin, rvma-peer, rdma or rdma-wait")
		face    = flag.Int("face", 4096, "bytes sent to each neighbour per step")
		steps   = flag.Int("steps", 300, "steps to run")
		timeout = flag.Duration("timeout", 5*time.Minute, "give up after this long")
		runID   = flag.String("run", "1", "a name for this run, unique in the boot (the lab's barriers last for the whole boot)")
		profile = flag.String("cpuprofile", "", "write a CPU profile of the run (setup and steps) to this file")
		bufs    = flag.Int("buffers", rvma.ShownBuffers+1, "buffers posted per window (rvma modes)")
		share   = flag.Bool("share", true, "windows promise each neighbour's share of an epoch, WindowOptions.Share (rvma modes)")
	)
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("rvmahalo: ")
	if !labenv.InLab() {
		log.Fatal(labenv.ErrNotInLab)
	}
	if *face < 16 || *steps < 2 || *bufs < 1 {
		log.Fatal("-face must be at least 16 bytes, -steps at least 2 and -buffers at least 1")
	}
	r, err := newRing()
	if err != nil {
		log.Fatal(err)
	}
	r.run = *runID
	if *profile != "" {
		stop, err := startProfile(*profile)
		if err != nil {
			log.Fatal(err)
		}
		defer stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var res result
	switch *mode {
	case "rvma":
		res, err = runRVMA(ctx, r, *face, *steps, haloOptions{bufs: *bufs, share: *share})
	case "rvma-spin":
		res, err = runRVMA(ctx, r, *face, *steps, haloOptions{bufs: *bufs, share: *share, spin: true})
	case "rvma-peer":
		res, err = runRVMA(ctx, r, *face, *steps, haloOptions{bufs: *bufs, share: *share, perPeer: true})
	case "rdma":
		res, err = runRDMA(ctx, r, *face, *steps, false)
	case "rdma-wait":
		res, err = runRDMA(ctx, r, *face, *steps, true)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil {
		log.Fatalf("%s: %v", *mode, err)
	}
	fmt.Printf("HALO %s %d %d %d %.1f %.0f\n", *mode, r.n, *face, *steps, float64(*steps)/res.run.Seconds(), float64(res.setup)/float64(time.Microsecond))
	ms := func(sec float64) float64 { return 1000 * sec / float64(*steps) }
	per := func(n uint64) float64 { return float64(n) / float64(*steps) }
	fmt.Printf("HALOCPU %s %d ms/step %.2f user %.2f sys %.2f irq %.2f busy %.2f reads/step %.2f writes/step %.2f\n", *mode, *face,
		ms(res.cpu.busy()), ms(res.cpu.user), ms(res.cpu.sys), ms(res.cpu.irq), res.cpu.share, per(res.cpu.reads), per(res.cpu.writes))
	if st := res.rvma; st != nil {
		// What the steps cost besides the puts: notices sent per step,
		// puts refused as stale (each one replaces a stripe), and puts
		// that found no buffer in their view and waited.
		fmt.Printf("HALOSTATS %s %d notices/step %.2f stale %d bufferwaits %d linkfailures %d\n", *mode, *face,
			float64(st.Notices)/float64(*steps), st.StalePuts, st.BufferWaits, st.LinkFailures)
	}
	os.Stdout.Sync()
}

// result is what one run measured: the setup before the first step and
// the steps themselves.
type result struct {
	setup, run time.Duration
	cpu        cpuUse              // the guest's CPU time during the steps
	rvma       *rvma.EndpointStats // the endpoint's counters at the end (rvma modes)
}

func newRing() (*ring, error) {
	i, err := labenv.Index()
	if err != nil {
		return nil, err
	}
	n, err := labenv.Guests()
	if err != nil {
		return nil, err
	}
	if n < 2 {
		return nil, fmt.Errorf("a ring needs at least 2 guests, the lab has %d", n)
	}
	r := &ring{index: i, n: n, left: (i+n-2)%n + 1, right: i%n + 1}
	for k := 1; k <= n; k++ {
		a, err := labenv.AddrOf(k)
		if err != nil {
			return nil, err
		}
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, err
		}
		r.addrs = append(r.addrs, ip)
	}
	r.self = r.addrs[i-1]
	return r, nil
}

// barrier waits until every guest of the ring reached point name.
func (r *ring) barrier(ctx context.Context, name string) error {
	if err := labenv.Signal(fmt.Sprintf("%s-%s-%d", r.run, name, r.index)); err != nil {
		return err
	}
	for k := 1; k <= r.n; k++ {
		if err := labenv.Wait(ctx, fmt.Sprintf("%s-%s-%d", r.run, name, k)); err != nil {
			return fmt.Errorf("barrier %s, guest %d: %w", name, k, err)
		}
	}
	return nil
}

// fill writes the face guest from sends at step into b.
func fill(b []byte, from, step int) {
	for i := range b {
		b[i] = pattern(from, step, i)
	}
}

func pattern(from, step, i int) byte { return byte(from*31+step*7) + byte(i*13) }

// check verifies a face received from guest from at step.
func check(b []byte, from, step int) error {
	idx := []int{0, len(b) - 1}
	if step%16 == 0 {
		idx = nil
		for i := range b {
			idx = append(idx, i)
		}
	}
	for _, i := range idx {
		if b[i] != pattern(from, step, i) {
			return fmt.Errorf("step %d: byte %d of guest %d's face is %#x, want %#x", step, i, from, b[i], pattern(from, step, i))
		}
	}
	return nil
}

// startProfile starts a CPU profile into path; the returned function stops
// it and closes the file.
func startProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			log.Printf("cpu profile: %v", err)
		}
	}, nil
}
