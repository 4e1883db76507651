package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

// The states of the region's pages before each timed transfer of
// latState (-state).
const (
	stateWarm    = "warm"    // resident, and pinned by the pin cache
	stateCold    = "cold"    // out of the pin cache; a put's pages dropped, a get's new
	statePageout = "pageout" // out of the pin cache and swapped out
)

// pagemap bits of a page (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
)

// latState measures the latency of single Gets and Puts of each size in
// sizes against a region of the service at addr, with the region's pages
// put in state before each transfer (outside the timed part): the median
// and 99th percentile of the transfers, the median time the preparation
// took, and per transfer the sections the target served in its completion
// handler and from a work item, the pin cache's hits and misses (both
// sides), and the pages swapped in and out (/proc/vmstat). Each size makes
// min(n, max(11, total/size)) transfers, after two untimed ones. Every
// transfer's bytes are checked.
func latState(addr string, sizes []int, n, total int, state string) error {
	maxSize := slices.Max(sizes)
	page := os.Getpagesize()
	maxSize = (maxSize + page - 1) &^ (page - 1)
	t, err := newTarget(addr, maxSize)
	if err != nil {
		return err
	}
	defer t.close()
	// 4 KiB pages only: a huge page would be split by MADV_PAGEOUT and
	// make the states differ in more than residency (the region is
	// dropped and written again to lose any it has)
	pa := slices.Clone(t.mem)
	if err := unix.Madvise(t.mem, unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("madvise(MADV_DONTNEED): %w", err)
	}
	if err := unix.Madvise(t.mem, unix.MADV_NOHUGEPAGE); err != nil {
		return fmt.Errorf("madvise(MADV_NOHUGEPAGE): %w", err)
	}
	copy(t.mem, pa)
	buf, err := jbmt.Alloc(maxSize) // page-aligned, as perftest's buffers
	if err != nil {
		return err
	}
	defer jbmt.Free(buf)
	if err := unix.Madvise(buf, unix.MADV_NOHUGEPAGE); err != nil {
		return fmt.Errorf("madvise(MADV_NOHUGEPAGE): %w", err)
	}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return err
	}
	defer pm.Close()
	// pa is what the region holds for gets, pb what puts write (they
	// differ, so that a put that moved nothing is seen)
	pb := make([]byte, maxSize)
	for i := range pb {
		pb[i] = byte(i*7 + 3)
	}
	fmt.Printf("%-4s %10s %-7s %10s %10s %5s %10s %8s %8s %8s %8s %8s %8s\n", "op", "bytes", "state", "median_us", "p99_us",
		"n", "prep_us", "inline", "deferred", "hits", "misses", "pswpin", "pswpout")
	for _, size := range sizes {
		iters := min(n, max(11, total/size))
		span := (size + page - 1) &^ (page - 1) // the region's pages the transfer touches
		region := t.mem[:span]
		for _, op := range []string{"get", "put"} {
			// after a cold put the rest of its pages are new, zeroed ones
			rest := pa[size:span]
			if op == "put" && state == stateCold {
				rest = make([]byte, span-size)
			}
			prepare := func() error {
				if op == "get" {
					clear(buf[:size])
				} else {
					copy(region, pa) // so that the put is seen to land
				}
				switch state {
				case stateCold:
					if err := unix.Madvise(region, unix.MADV_DONTNEED); err != nil {
						return fmt.Errorf("madvise(MADV_DONTNEED): %w", err)
					}
					if op == "get" {
						// a dropped page would read as the zero page:
						// give the get its bytes again in new pages
						copy(region, pa)
						return nil
					}
					return expectPages(pm, region, 0, "dropped")
				case statePageout:
					return pageOut(pm, region)
				}
				return nil
			}
			check := func() error {
				if op == "get" {
					if !bytes.Equal(buf[:size], pa[:size]) {
						return fmt.Errorf("get of %d bytes (%s): the bytes that arrived differ from the region's", size, state)
					}
				} else if !bytes.Equal(t.mem[:size], pb[:size]) || !bytes.Equal(t.mem[size:span], rest) {
					return fmt.Errorf("put of %d bytes (%s): the region does not hold what was put", size, state)
				}
				return nil
			}
			copy(region, pa) // what an earlier put left
			if op == "put" {
				copy(buf[:size], pb)
			}
			for range 2 { // the first transfers: the pin cache fills
				if err := prepare(); err != nil {
					return err
				}
				if err := t.move(op, buf[:size]); err != nil {
					return err
				}
				if err := check(); err != nil {
					return err
				}
			}
			c0, err := readCounters()
			if err != nil {
				return err
			}
			lat := make([]float64, 0, iters)
			prep := make([]float64, 0, iters)
			for range iters {
				p0 := time.Now()
				if err := prepare(); err != nil {
					return fmt.Errorf("%s of %d bytes: %w", op, size, err)
				}
				prep = append(prep, float64(time.Since(p0).Nanoseconds())/1e3)
				t0 := time.Now()
				if err := t.move(op, buf[:size]); err != nil {
					return err
				}
				lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
				if err := check(); err != nil {
					return err
				}
			}
			c, err := readCounters()
			if err != nil {
				return err
			}
			per := func(a, b uint64) float64 { return float64(b-a) / float64(iters) }
			slices.Sort(lat)
			fmt.Printf("%-4s %10d %-7s %10.1f %10.1f %5d %10.1f %8.2f %8.2f %8.2f %8.2f %8.1f %8.1f\n", op, size, state,
				lat[len(lat)/2], lat[len(lat)*99/100], iters, median(prep),
				per(c0.st.SectionsInline, c.st.SectionsInline), per(c0.st.SectionsDefer, c.st.SectionsDefer),
				per(c0.st.PinCacheHits, c.st.PinCacheHits), per(c0.st.PinCacheMisses, c.st.PinCacheMisses),
				per(c0.in, c.in), per(c0.out, c.out))
		}
	}
	return nil
}

// pageOut swaps the pages of b out with MADV_PAGEOUT and checks in
// /proc/self/pagemap that every one of them is in swap. Reclaim passes
// over pinned pages without unmapping them, so the pin cache's ranges
// over b are dropped first by a change of the mapping (read-only and
// back: its notifier drops them). The advice takes only pages on the LRU
// lists, and drains into them the pages just added on its own CPU: a page
// swapped in on another CPU (by the module's work item) may still wait in
// that CPU's batch. So a page that stayed is advised again from each CPU
// in turn; one that never goes out is an error (no swap, or a page
// pinned by something else).
func pageOut(pm *os.File, b []byte) error {
	if err := unix.Mprotect(b, unix.PROT_READ); err != nil {
		return fmt.Errorf("mprotect: %w", err)
	}
	if err := unix.Mprotect(b, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		return fmt.Errorf("mprotect: %w", err)
	}
	var err error
	if err = unix.Madvise(b, unix.MADV_PAGEOUT); err != nil {
		return fmt.Errorf("madvise(MADV_PAGEOUT): %w", err)
	}
	if err = expectPages(pm, b, pmSwapped, "swapped out"); err == nil {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return err
	}
	defer unix.SchedSetaffinity(0, &old)
	for range 2 {
		for cpu := range runtime.NumCPU() {
			if !old.IsSet(cpu) {
				continue
			}
			var one unix.CPUSet
			one.Set(cpu)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return err
			}
			if err := unix.Madvise(b, unix.MADV_PAGEOUT); err != nil {
				return fmt.Errorf("madvise(MADV_PAGEOUT): %w", err)
			}
			if err = expectPages(pm, b, pmSwapped, "swapped out"); err == nil {
				return nil
			}
		}
	}
	return fmt.Errorf("%w after MADV_PAGEOUT from every CPU (is swap on?)", err)
}

// expectPages checks that the pagemap entry of every page of b has its
// present and swapped bits as in want.
func expectPages(pm *os.File, b []byte, want uint64, what string) error {
	page := uintptr(os.Getpagesize())
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	first, npages := addr/page, (uintptr(len(b))+page-1)/page
	ents := make([]byte, 8*npages)
	if _, err := pm.ReadAt(ents, int64(first*8)); err != nil {
		return fmt.Errorf("pagemap: %w", err)
	}
	bad, firstBad := 0, uint64(0)
	for i := range npages {
		if e := binary.LittleEndian.Uint64(ents[8*i:]); e&(pmPresent|pmSwapped) != want {
			if bad == 0 {
				firstBad = e
			}
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d pages not %s (the first's pagemap entry %#x)", bad, npages, what, firstBad)
	}
	return nil
}

// counters are what latState reports per transfer: the host's JBMT
// counters and the pages swapped in and out since boot.
type counters struct {
	st      jbmt.Stats
	in, out uint64
}

func readCounters() (counters, error) {
	st, err := jbmt.ReadStats()
	if err != nil {
		return counters{}, err
	}
	in, out, err := swapCounts()
	return counters{st, in, out}, err
}

// swapCounts reads pswpin and pswpout from /proc/vmstat (pages swapped
// in and out since boot).
func swapCounts() (in, out uint64, err error) {
	f, err := os.Open("/proc/vmstat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		switch k {
		case "pswpin":
			in, err = strconv.ParseUint(v, 10, 64)
		case "pswpout":
			out, err = strconv.ParseUint(v, 10, 64)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/vmstat %s: %w", k, err)
		}
	}
	return in, out, sc.Err()
}
