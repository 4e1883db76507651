//go:build lab

package jbmt_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// meminfo reads one field of /proc/meminfo, in bytes.
func meminfo(t *testing.T, name string) int {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != name {
			continue
		}
		kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		if err != nil {
			t.Fatalf("meminfo %s: %v", name, err)
		}
		return kb << 10
	}
	t.Fatalf("no %s in /proc/meminfo", name)
	return 0
}

// TestSwapTransferLargerThanRAM (suite jbmt-swap, a guest with swap on
// zram): a region of one and a half times the guest's memory, written
// page by page (each page holding its index, so that most of it is
// swapped out as it is written), is read whole with gets of 4 MiB over
// loopback, every byte checked. The target faults the swapped-out pages
// in from work items; sections read once are not kept in the pin cache,
// so what is pinned stays bounded by the sections in flight.
func TestSwapTransferLargerThanRAM(t *testing.T) {
	if meminfo(t, "SwapTotal") == 0 {
		t.Fatal("this test needs swap in the guest (suite jbmt-swap)")
	}
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 350*time.Second)
	defer cancel()
	const chunk = 4 << 20
	size := (meminfo(t, "MemTotal") * 3 / 2) &^ (chunk - 1)
	mem, reg := region(t, s, size, jbmt.Read)
	t0 := time.Now()
	for pg := 0; pg < size/4096; pg++ {
		b := mem[pg*4096 : (pg+1)*4096]
		for i := 0; i < 4096; i += 8 {
			binary.LittleEndian.PutUint64(b[i:], uint64(pg))
		}
	}
	t.Logf("wrote %d MiB (guest memory %d MiB) in %v; swap used %d MiB", size>>20, meminfo(t, "MemTotal")>>20,
		time.Since(t0).Round(time.Millisecond), (meminfo(t, "SwapTotal")-meminfo(t, "SwapFree"))>>20)
	p := self(t, ctx, s)
	dev := labenv.Device(t)
	retries := func() string { // rxe's, for the log: a retry is what its FRWR defect needs
		b, _ := os.ReadFile("/sys/class/infiniband/" + dev + "/ports/1/hw_counters/completer_retry_err")
		return strings.TrimSpace(string(b))
	}
	retries0 := retries()
	before := stats(t)
	buf := alloc(t, chunk)
	var maxPinned uint64
	t0 = time.Now()
	for off := 0; off < size; off += chunk {
		// rxe retransmits under memory pressure: registrations on
		// the connection's QP would be executed twice (docs/jbmt.md)
		if n, err := p.Get(ctx, buf, reg.Token(), uint64(off)); err != nil || n != chunk {
			t.Fatalf("Get at %d MiB: %d, %v (rxe retries: %s)", off>>20, n, err, retries())
		}
		for i := 0; i < chunk; i += 8 {
			if got, want := binary.LittleEndian.Uint64(buf[i:]), uint64((off+i)/4096); got != want {
				t.Fatalf("Get at %d MiB: byte %d holds %d, want %d", off>>20, i, got, want)
			}
		}
		if st := stats(t); st.ServedPinned > maxPinned {
			maxPinned = st.ServedPinned
		}
	}
	d := time.Since(t0)
	st := stats(t)
	t.Logf("got %d MiB in %v (%.1f MB/s): %d sections served, %d deferred for faults; at most %d pages pinned to serve between gets",
		size>>20, d.Round(time.Millisecond), float64(size)/d.Seconds()/1e6, st.SectionsServed-before.SectionsServed,
		st.SectionsDefer-before.SectionsDefer, maxPinned)
	t.Logf("rxe's completer retries: %s before, %s after", retries0, retries())
	if st.SectionsDefer == before.SectionsDefer {
		t.Errorf("no section was deferred for a fault: was the region swapped out?")
	}
	if st.ServedPinned > 0 {
		t.Errorf("%d pages stay pinned to serve after a stream read once", st.ServedPinned)
	}
	checkUnpinned(t)
}
