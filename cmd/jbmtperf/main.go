// Command jbmtperf measures JBMT (pkg/jbmt) against the RDMA ways of
// making memory reachable, in one process, side by side.
//
// Usage:
//
//	jbmtperf -d rxe0 -t reg [-min 4096] [-max 1073741824] [-pinned-max 268435456] [-n 20]
//	jbmtperf -t bw -addr 10.77.0.1 [-min 65536] [-max 16777216] [-bytes 268435456]
//	jbmtperf -t lat -addr 10.77.0.1 [-min 8] [-max 1048576] [-n 1000]
//	jbmtperf -t lat -addr 10.77.0.1 -state warm|cold|pageout [-sizes 1,8,...,4194304] [-n 200] [-bytes 67108864]
//	jbmtperf -t async -addr 10.77.0.1 [-min 65536] [-max 4194304] [-window 8] [-bytes 268435456] [-n 100]
//	jbmtperf -t sweep -addr 10.77.0.1 [-max 262144] [-budgets 1,4,16,64,256,1024] [-procs 1,4,16] [-dur 2s]
//
// Tests:
//   - reg: the cost of registering and deregistering a fresh buffer, at
//     sizes from -min to -max by factors of 4: jbmt.Register and
//     Region.Close (which pin nothing), against ibv_reg_mr/ibv_dereg_mr of
//     the same memory (which pin every page, up to -pinned-max: more would
//     not fit the machine) and, on a device with on-demand paging (rxe
//     from 7.x), ibv_reg_mr with IBV_ACCESS_ON_DEMAND. Each figure is the
//     median of -n registrations of the same buffer, in µs, and each size's
//     buffer is new (never touched: as memory a program registers before
//     it has filled it). Prints one line per size and a last line with the
//     ratios of the largest size to the smallest.
//   - bw: the bandwidth of Peer.Get and Peer.Put between a Go buffer and a
//     region of the JBMT service at -addr (this host's own address for a
//     loopback), for transfer sizes from -min to -max by factors of 4,
//     each moving -bytes in all, one transfer at a time (each keeps its
//     sections in flight). Prints MB/s per size and operation. The
//     anchor is perftest's ib_write_bw between pinned buffers in the same
//     boot (test/softroce/bench/jbmt-bw.sh).
//   - lat: the latency of one Peer.Get or Peer.Put at a time, sizes from
//     -min to -max by factors of 8, -n of each: median and 99th
//     percentile in µs. The anchors are perftest's ib_read_lat and
//     ib_write_lat in the same boot (test/softroce/bench/jbmt-lat.sh).
//     With -state, the sizes of -sizes (or -min to -max by factors of 8),
//     and before each timed transfer, outside the timed part, the pages
//     of the region (the target's side: a get's source, a put's sink;
//     the caller's buffer stays warm, pin cache hits) are put in a state:
//     warm: resident and in the pin cache (every transfer hits it, as
//     without -state); cold: out of the pin cache, and for a put not
//     resident either (MADV_DONTNEED: its pins fault in new, zeroed
//     pages), for a get resident in new pages (MADV_DONTNEED, then its
//     bytes written again: an anonymous page dropped would read as the
//     zero page, so a get's only fault that keeps its data is a swap-in,
//     the next state); pageout: out of the pin cache (the mapping made
//     read-only and writable again: reclaim passes over pinned pages, so
//     the cache's ranges must go first) and swapped out (MADV_PAGEOUT,
//     which needs swap; /proc/self/pagemap must show every page in swap,
//     or jbmtperf fails). Both buffers have 4 KiB pages
//     (MADV_NOHUGEPAGE). Each size makes min(-n, max(11, -bytes/size))
//     transfers after two untimed ones, every one checked byte for byte,
//     and prints besides the median and 99th percentile the median time
//     of the preparation and, per transfer, the sections the target
//     served in its completion handler (inline) and from a work item
//     (deferred), the pin cache's hits and misses (both sides) and the
//     pages swapped in and out (/proc/vmstat pswpin, pswpout)
//     (test/softroce/bench/jbmt-lat-state.sh).
//   - async: asynchronous gets (Peer.StartGet, Service.Wait and Poll):
//     the bandwidth with -window of them in flight, and, one at a time,
//     the median of each stage of -n, from the times in each completion:
//     queued (submitted until a kernel worker began it), the first
//     section's round trip, the rest of the transfer, and the wake-up
//     (the end until Wait returned in the caller), in µs: where a get's
//     time goes, as in the report's Figures 6 and 7.
//   - sweep: gets of -max bytes under each pin budget of -budgets (pages,
//     set through the module parameter jbmt_pin_budget_pages, restored
//     after; root only) by each number of services in -procs (each its
//     own file, as processes would have), for -dur each: aggregate MB/s,
//     Jain's fairness index over the services' bytes, and the NACKs and
//     budget waits the module counted.
//
// The figures are ratios and slopes under TCG, not absolute times
// (docs/benchmarks.md).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

func main() {
	dev := flag.String("d", "", "RDMA device (first one if empty)")
	test := flag.String("t", "reg", "test: reg, bw, lat, async or sweep")
	budgets := flag.String("budgets", "1,4,16,64,256,1024", "sweep: pin budgets, pages")
	procs := flag.String("procs", "1,4,16", "sweep: numbers of services")
	dur := flag.Duration("dur", 2*time.Second, "sweep: time per budget and number of services")
	window := flag.Int("window", 8, "async: transfers in flight")
	addr := flag.String("addr", "", "bw: the JBMT service's IPv4 address")
	total := flag.Int("bytes", 256<<20, "bw: bytes moved per size and operation")
	minSize := flag.Int("min", 4096, "smallest size in bytes")
	maxSize := flag.Int("max", 1<<30, "largest size in bytes")
	pinnedMax := flag.Int("pinned-max", 256<<20, "largest size registered pinned or with ODP")
	n := flag.Int("n", 20, "registrations per size and kind")
	state := flag.String("state", "", "lat: the state of the region's pages (the target's side: a get's source, a put's sink) before each timed transfer: warm (in the pin cache), cold (out of it; a put's pages dropped), pageout (swapped out; needs swap); go doc ./cmd/jbmtperf says more")
	sizeList := flag.String("sizes", "", "lat with -state: the sizes, comma-separated (default: -min to -max by factors of 8)")
	flag.Parse()
	var sizes []int
	if *sizeList != "" {
		var err error
		if sizes, err = ints(*sizeList); err != nil {
			fmt.Fprintln(os.Stderr, "jbmtperf: -sizes:", err)
			os.Exit(2)
		}
	} else {
		for s := *minSize; s >= 1 && s <= *maxSize; s *= 8 {
			sizes = append(sizes, s)
		}
	}
	if *state != "" && (*test != "lat" || (*state != stateWarm && *state != stateCold && *state != statePageout)) {
		fmt.Fprintln(os.Stderr, "jbmtperf: -state is warm, cold or pageout, with -t lat")
		os.Exit(2)
	}
	if *state == "" && *sizeList != "" {
		fmt.Fprintln(os.Stderr, "jbmtperf: -sizes goes with -state")
		os.Exit(2)
	}
	if (*test != "reg" && *test != "bw" && *test != "lat" && *test != "async" && *test != "sweep") || *window < 1 || *minSize < 1 || *maxSize < *minSize || *n < 1 || (*total < *maxSize && *state == "") || len(sizes) == 0 {
		fmt.Fprintln(os.Stderr, "jbmtperf: bad settings (see -h)")
		os.Exit(2)
	}
	var err error
	switch *test {
	case "bw":
		err = bw(*addr, *minSize, *maxSize, *total)
	case "lat":
		if *state != "" {
			err = latState(*addr, sizes, *n, *total, *state)
		} else {
			err = lat(*addr, *minSize, *maxSize, *n)
		}
	case "async":
		err = async(*addr, *minSize, *maxSize, *total, *window, *n)
	case "sweep":
		var bs, ps []int
		if bs, err = ints(*budgets); err == nil {
			ps, err = ints(*procs)
		}
		if err == nil {
			err = sweep(*addr, *maxSize, bs, ps, *dur)
		}
	default:
		err = reg(*dev, *minSize, *maxSize, *pinnedMax, *n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "jbmtperf:", err)
		os.Exit(1)
	}
}

// kind is one way of registering memory from alloc: reg returns the undo.
type kind struct {
	name  string
	max   int
	alloc func(size int) ([]byte, func() error, error)
	reg   func(b []byte) (func() error, error)
}

// verbsAlloc maps memory pkg/verbs can register (a verbs.Buffer).
func verbsAlloc(size int) ([]byte, func() error, error) {
	b, err := verbs.Alloc(size)
	if err != nil {
		return nil, nil, err
	}
	return b.Bytes(), b.Close, nil
}

// jbmtAlloc maps memory with no swap reserved: JBMT registers any size.
func jbmtAlloc(size int) ([]byte, func() error, error) {
	b, err := jbmt.Alloc(size)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return jbmt.Free(b) }, nil
}

func reg(dev string, minSize, maxSize, pinnedMax, n int) error {
	s, err := jbmt.Open(nil)
	if err != nil {
		return err
	}
	defer s.Close()
	if dev == "" {
		names, err := verbs.Devices()
		if err != nil || len(names) == 0 {
			return fmt.Errorf("no RDMA device: %v", err)
		}
		dev = names[0].Name
	}
	ctx, err := verbs.Open(dev)
	if err != nil {
		return err
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Close()
	attr, err := ctx.QueryDevice()
	if err != nil {
		return err
	}
	verbsReg := func(access verbs.Access) func(b []byte) (func() error, error) {
		return func(b []byte) (func() error, error) {
			mr, err := pd.RegMR(b, access)
			if err != nil {
				return nil, err
			}
			return mr.Close, nil
		}
	}
	kinds := []kind{
		{"jbmt", maxSize, jbmtAlloc, func(b []byte) (func() error, error) {
			r, err := s.Register(b, jbmt.Read|jbmt.Write)
			if err != nil {
				return nil, err
			}
			return r.Close, nil
		}},
		{"pinned", pinnedMax, verbsAlloc, verbsReg(verbs.AccessAll)},
	}
	if attr.HasODP() {
		kinds = append(kinds, kind{"odp", pinnedMax, verbsAlloc, verbsReg(verbs.AccessAll | verbs.AccessOnDemand)})
	}
	fmt.Printf("# registration cost on %s, medians of %d (µs; - beyond the kind's largest size)\n", dev, n)
	fmt.Printf("%12s", "#bytes")
	for _, k := range kinds {
		fmt.Printf(" %12s %12s", k.name+"_reg", k.name+"_dereg")
	}
	fmt.Println()
	first := map[string]float64{}
	last := map[string]float64{}
	for size := minSize; size <= maxSize; size *= 4 {
		fmt.Printf("%12d", size)
		for _, k := range kinds {
			if size > k.max {
				fmt.Printf(" %12s %12s", "-", "-")
				continue
			}
			r, d, err := measure(k, size, n)
			if err != nil {
				return fmt.Errorf("%s at %d bytes: %w", k.name, size, err)
			}
			if _, ok := first[k.name]; !ok {
				first[k.name] = r
			}
			last[k.name] = r
			fmt.Printf(" %12.2f %12.2f", r, d)
		}
		fmt.Println()
	}
	fmt.Printf("# largest/smallest registration:")
	for _, k := range kinds {
		fmt.Printf(" %s %.2f", k.name, last[k.name]/first[k.name])
	}
	fmt.Println()
	return nil
}

// measure registers a fresh buffer of size bytes n times with k and
// returns the medians of the registration and deregistration times (µs).
func measure(k kind, size, n int) (float64, float64, error) {
	buf, free, err := k.alloc(size)
	if err != nil {
		return 0, 0, err
	}
	defer free()
	var regs, deregs []float64
	for i := 0; i < n; i++ {
		t0 := time.Now()
		undo, err := k.reg(buf)
		t1 := time.Now()
		if err != nil {
			return 0, 0, err
		}
		if err := undo(); err != nil {
			return 0, 0, errors.Join(errors.New("deregistering"), err)
		}
		t2 := time.Now()
		regs = append(regs, float64(t1.Sub(t0).Nanoseconds())/1e3)
		deregs = append(deregs, float64(t2.Sub(t1).Nanoseconds())/1e3)
	}
	return median(regs), median(deregs), nil
}

// ints parses a comma-separated list of positive integers.
func ints(s string) ([]int, error) {
	var v []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: not a list of positive integers", s)
		}
		v = append(v, n)
	}
	return v, nil
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}
