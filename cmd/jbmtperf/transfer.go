package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

// target is a region of this process served over a connection to addr
// (a loopback one when addr is this host's): what bw and lat move to.
type target struct {
	s   *jbmt.Service
	mem []byte
	reg *jbmt.Region
	p   *jbmt.Peer
}

func newTarget(addr string, size int) (*target, error) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("-addr: %w", err)
	}
	t := &target{}
	if t.s, err = jbmt.Open(nil); err != nil {
		return nil, err
	}
	if t.mem, err = jbmt.Alloc(size); err != nil {
		t.close()
		return nil, err
	}
	for i := range t.mem {
		t.mem[i] = byte(i)
	}
	if t.reg, err = t.s.Register(t.mem, jbmt.Read|jbmt.Write); err != nil {
		t.close()
		return nil, err
	}
	if t.p, err = t.s.Dial(context.Background(), netip.AddrPortFrom(a, 0)); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *target) close() {
	if t.reg != nil {
		t.reg.Close()
	}
	if t.mem != nil {
		jbmt.Free(t.mem)
	}
	t.s.Close()
}

// move makes one get or put of buf at the region's start.
func (t *target) move(op string, buf []byte) error {
	var err error
	if op == "get" {
		_, err = t.p.Get(context.Background(), buf, t.reg.Token(), 0)
	} else {
		_, err = t.p.Put(context.Background(), buf, t.reg.Token(), 0)
	}
	if err != nil {
		return fmt.Errorf("%s of %d bytes: %w", op, len(buf), err)
	}
	return nil
}

// bw measures Get and Put bandwidth against a region of the service at
// addr.
func bw(addr string, minSize, maxSize, total int) error {
	t, err := newTarget(addr, maxSize)
	if err != nil {
		return err
	}
	defer t.close()
	buf := make([]byte, maxSize)
	fmt.Printf("%-4s %10s %10s %8s\n", "op", "bytes", "MB/s", "ops")
	for size := minSize; size <= maxSize; size *= 4 {
		for _, op := range []string{"get", "put"} {
			n := max(total/size, 1)
			t0 := time.Now()
			for range n {
				if err := t.move(op, buf[:size]); err != nil {
					return err
				}
			}
			el := time.Since(t0)
			fmt.Printf("%-4s %10d %10.1f %8d\n", op, size, float64(n*size)/el.Seconds()/1e6, n)
		}
	}
	return nil
}

// lat measures the latency of single Gets and Puts of sizes from minSize
// to maxSize (by factors of 8) against a region of the service at addr:
// the median and the 99th percentile of n transfers each, in µs.
func lat(addr string, minSize, maxSize, n int) error {
	t, err := newTarget(addr, maxSize)
	if err != nil {
		return err
	}
	defer t.close()
	buf, err := jbmt.Alloc(maxSize) // page-aligned, as perftest's buffers
	if err != nil {
		return err
	}
	defer jbmt.Free(buf)
	fmt.Printf("%-4s %10s %10s %10s\n", "op", "bytes", "median_us", "p99_us")
	for size := minSize; size <= maxSize; size *= 8 {
		for _, op := range []string{"get", "put"} {
			v := make([]float64, 0, n)
			for range n {
				t0 := time.Now()
				if err := t.move(op, buf[:size]); err != nil {
					return err
				}
				v = append(v, float64(time.Since(t0).Nanoseconds())/1e3)
			}
			slices.Sort(v)
			fmt.Printf("%-4s %10d %10.1f %10.1f\n", op, size, v[len(v)/2], v[len(v)*99/100])
		}
	}
	return nil
}

// async measures asynchronous gets (Peer.StartGet, Service.Poll) of sizes
// from minSize to maxSize (by factors of 4) against a region of the
// service at addr: with window transfers in flight, the bandwidth over
// total bytes; one at a time, the median of each stage of n transfers
// (submitted to begun by a kernel worker, begun to the first section's
// answer, that to the end, the end to Wait's return in the caller), µs.
func async(addr string, minSize, maxSize, total, window, n int) error {
	t, err := newTarget(addr, maxSize)
	if err != nil {
		return err
	}
	defer t.close()
	ctx := context.Background()
	bufs := make([][]byte, window)
	for i := range bufs {
		if bufs[i], err = jbmt.Alloc(maxSize); err != nil {
			return err
		}
		defer jbmt.Free(bufs[i])
	}
	cs := make([]jbmt.Completion, window)
	wait := func() (int, error) {
		if err := t.s.Wait(ctx); err != nil {
			return 0, err
		}
		k := t.s.Poll(cs)
		for _, c := range cs[:k] {
			if c.Err != nil {
				return 0, c.Err
			}
		}
		return k, nil
	}
	fmt.Printf("%-6s %10s %6s %10s %10s %10s %10s %10s\n", "op", "bytes", "window", "MB/s", "queue_us", "first_us", "rest_us", "wake_us")
	for size := minSize; size <= maxSize; size *= 4 {
		ops := max(total/size, window)
		t0 := time.Now()
		inflight, started := 0, 0
		for started < ops || inflight > 0 {
			for inflight < window && started < ops {
				if err := t.p.StartGet(bufs[started%window][:size], t.reg.Token(), 0, uint64(started)); err != nil {
					return fmt.Errorf("start get of %d bytes: %w", size, err)
				}
				started++
				inflight++
			}
			k, err := wait()
			if err != nil {
				return fmt.Errorf("get of %d bytes: %w", size, err)
			}
			inflight -= k
		}
		mbs := float64(ops*size) / time.Since(t0).Seconds() / 1e6
		var queue, first, rest, wake []float64
		for range n {
			if err := t.p.StartGet(bufs[0][:size], t.reg.Token(), 0, 0); err != nil {
				return err
			}
			if err := t.s.Wait(ctx); err != nil {
				return err
			}
			seen := monotonic()
			if t.s.Poll(cs[:1]) != 1 || cs[0].Err != nil {
				return fmt.Errorf("get of %d bytes: %v", size, cs[0].Err)
			}
			c := cs[0]
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
			queue = append(queue, us(c.Started-c.Submitted))
			first = append(first, us(c.FirstAnswer-c.Started))
			rest = append(rest, us(c.Ended-c.FirstAnswer))
			wake = append(wake, us(seen-c.Ended))
		}
		fmt.Printf("%-6s %10d %6d %10.1f %10.1f %10.1f %10.1f %10.1f\n", "aget", size, window, mbs,
			median(queue), median(first), median(rest), median(wake))
	}
	return nil
}

// monotonic reads CLOCK_MONOTONIC, the clock of a Completion's times.
func monotonic() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// sweep measures gets under pin budgets of each size in budgets (pages,
// set through the module's parameter jbmt_pin_budget_pages, which it
// restores after), by each number of services in procs (each a file of
// its own, as a process would have; one region each, over this host's
// connection to addr), each getting size bytes at a time for dur: the
// aggregate MB/s, Jain's fairness index over the services' bytes, and
// the NACKs and budget waits the module counted.
func sweep(addr string, size int, budgets, procs []int, dur time.Duration) error {
	const param = "/sys/module/rdmaplus/parameters/jbmt_pin_budget_pages"
	old, err := os.ReadFile(param)
	if err != nil {
		return err
	}
	defer os.WriteFile(param, old, 0o644)
	fmt.Printf("%8s %6s %10s %8s %8s %8s\n", "budget", "procs", "MB/s", "jain", "nacks", "waits")
	for _, np := range procs {
		targets := make([]*target, np)
		for i := range targets {
			if targets[i], err = newTarget(addr, size); err != nil {
				return err
			}
			defer targets[i].close()
		}
		for _, b := range budgets {
			if err := os.WriteFile(param, []byte(strconv.Itoa(b)), 0o644); err != nil {
				return err
			}
			before, err := kmod.JBMTStatsFromSysfs("")
			if err != nil {
				return err
			}
			moved := make([]float64, np)
			errs := make(chan error, np)
			stop := time.Now().Add(dur)
			for i, t := range targets {
				go func() {
					buf := make([]byte, size)
					for time.Now().Before(stop) {
						if err := t.move("get", buf); err != nil {
							errs <- err
							return
						}
						moved[i] += float64(size)
					}
					errs <- nil
				}()
			}
			for range targets {
				if err := <-errs; err != nil {
					return fmt.Errorf("budget %d, %d services: %w", b, np, err)
				}
			}
			after, err := kmod.JBMTStatsFromSysfs("")
			if err != nil {
				return err
			}
			var sum, sq float64
			for _, m := range moved {
				sum += m
				sq += m * m
			}
			fmt.Printf("%8d %6d %10.1f %8.3f %8d %8d\n", b, np, sum/dur.Seconds()/1e6, sum*sum/(float64(np)*sq),
				after.NACKsReceived-before.NACKsReceived, after.BudgetWaits-before.BudgetWaits)
		}
	}
	return nil
}
