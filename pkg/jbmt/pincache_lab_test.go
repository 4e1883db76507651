//go:build lab

package jbmt_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

// remap puts a fresh anonymous mapping at b's place (MAP_FIXED), holding
// data: the same addresses, other pages.
func remap(t *testing.T, b []byte, data []byte) {
	t.Helper()
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&b[0]), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED)
	if err != nil {
		t.Fatalf("mmap MAP_FIXED: %v", err)
	}
	copy(b, data)
}

// TestLabTransferPinCache (suite jbmt): a get repeated over the same
// buffer and region finds both sides' sections in the pin cache (the
// caller's from the second get on, the region's, cached when served a
// second time, from the third), and a
// changed mapping is never served from it: a region whose pages were
// replaced (MAP_FIXED) gives the new bytes, a local buffer replaced the
// same way receives them, a put sees bytes written in place since.
// Turning the cache off gives its pages back, closing the service gives
// back every page.
func TestLabTransferPinCache(t *testing.T) {
	setParam(t, "jbmt_pin_cache", "Y")
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 1 << 20 // four sections
	mem, reg := region(t, s, n, jbmt.Read|jbmt.Write)
	want := random(n, 11)
	copy(mem, want)
	buf := alloc(t, n)
	p := self(t, ctx, s)
	get := func(what string, want []byte) {
		t.Helper()
		clear(buf)
		if m, err := p.Get(ctx, buf, reg.Token(), 0); err != nil || m != n {
			t.Fatalf("%s: Get: %d, %v", what, m, err)
		}
		if !bytes.Equal(buf, want) {
			t.Fatalf("%s: the bytes that arrived differ from the region's", what)
		}
	}

	get("first get", want)
	get("second get", want)
	before := stats(t)
	get("third get", want)
	st := settle(t)
	t.Logf("third get of 1 MiB: %d hits, %d misses; %d pages cached", st.PinCacheHits-before.PinCacheHits,
		st.PinCacheMisses-before.PinCacheMisses, st.PinCachePages)
	// four sections, each found on both sides
	if hits := st.PinCacheHits - before.PinCacheHits; hits < 8 {
		t.Errorf("third get over the same buffer and region: %d pin-cache hits, want 8", hits)
	}
	if st.PinCacheIdle == 0 || st.PinCacheIdle != st.PinCachePages {
		t.Errorf("after the gets: %d cached pages, %d idle; want some, all idle", st.PinCachePages, st.PinCacheIdle)
	}
	checkUnpinned(t)

	// the region's pages replaced: its cached ranges are stale
	fresh := random(n, 12)
	remap(t, mem, fresh)
	get("get after the region's pages were replaced", fresh)
	if d := stats(t).PinCacheStale - st.PinCacheStale; d == 0 {
		t.Errorf("no cached range went stale when the region's pages were replaced")
	}

	// the local buffer's pages replaced: the bytes land in the new ones
	remap(t, buf, nil)
	get("get into a buffer whose pages were replaced", fresh)

	// a put from the same buffer sees what was written in place since
	put := func(what string) {
		t.Helper()
		if m, err := p.Put(ctx, buf, reg.Token(), 0); err != nil || m != n {
			t.Fatalf("%s: Put: %d, %v", what, m, err)
		}
		if !bytes.Equal(mem, buf) {
			t.Fatalf("%s: the region differs from the bytes put", what)
		}
	}
	copy(buf, random(n, 13))
	put("first put")
	copy(buf, random(n, 14))
	put("second put, of bytes written in place")
	copy(buf, random(n, 15))
	before = stats(t)
	put("third put, of bytes written in place")
	if hits := stats(t).PinCacheHits - before.PinCacheHits; hits < 8 {
		t.Errorf("third put from the same buffer into the same region: %d pin-cache hits, want 8", hits)
	}
	checkUnpinned(t)

	// off: what it holds is given back, and nothing is cached again
	setParam(t, "jbmt_pin_cache", "N")
	if st := stats(t); st.PinCachePages != 0 || st.PinnedPages != 0 {
		t.Errorf("with the pin cache turned off: %d pages cached, %d pinned; want none", st.PinCachePages, st.PinnedPages)
	}
	before = stats(t)
	get("get with the pin cache off", mem)
	if st := stats(t); st.PinCacheHits != before.PinCacheHits || st.PinCachePages != 0 {
		t.Errorf("with the pin cache off: %d hits, %d pages cached", st.PinCacheHits-before.PinCacheHits, st.PinCachePages)
	}
	setParam(t, "jbmt_pin_cache", "Y")
	get("get with the pin cache on again", mem)
	if st := stats(t); st.PinCachePages == 0 {
		t.Errorf("with the pin cache on again: nothing cached")
	}

	// closing the region and the service gives back every page
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st := stats(t); st.PinnedPages != 0 || st.PinCachePages != 0 {
		t.Errorf("after closing the region and the service: %d pages pinned, %d cached", st.PinnedPages, st.PinCachePages)
	}
}

// TestLabTransferPinCacheUnmap (suite jbmt): a region's cached range
// whose pages are unmapped is dropped at once (no pin outlives the
// mapping), and a get of them fails with ErrFault on a connection that
// goes on serving.
func TestLabTransferPinCacheUnmap(t *testing.T) {
	setParam(t, "jbmt_pin_cache", "Y")
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 256 << 10
	mem := alloc(t, 2*n)
	reg, err := s.Register(mem, jbmt.Read)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	copy(mem, random(2*n, 21))
	p := self(t, ctx, s)
	buf := make([]byte, n)
	for i := 0; i < 2; i++ {
		if _, err := p.Get(ctx, buf, reg.Token(), n); err != nil || !bytes.Equal(buf, mem[n:]) {
			t.Fatalf("Get of the second half: %v", err)
		}
	}
	before := settle(t) // the serving side's sections released: the range idle
	hole(t, mem[n:])
	st := stats(t)
	if st.PinCacheStale == before.PinCacheStale || st.PinnedPages >= before.PinnedPages {
		t.Errorf("after munmap of a cached range: stale %d -> %d, pinned %d -> %d; want the range dropped",
			before.PinCacheStale, st.PinCacheStale, before.PinnedPages, st.PinnedPages)
	}
	if _, err := p.Get(ctx, buf, reg.Token(), n); err == nil {
		t.Errorf("Get of unmapped pages succeeded")
	}
	if _, err := p.Get(ctx, buf, reg.Token(), 0); err != nil || !bytes.Equal(buf, mem[:n]) {
		t.Errorf("Get of the mapped half after: %v", err)
	}
	checkUnpinned(t)
}

// TestLabTransferAdvise (suite jbmt): Region.Advise and Service.Advise pin
// a range ahead of use, so that the first get over it finds both sides'
// sections cached (and is served in the completion handler); an advice
// stops without an error at the pin budget, fails with ErrFault before
// unmapped pages and ErrRange outside the region.
func TestLabTransferAdvise(t *testing.T) {
	setParam(t, "jbmt_pin_cache", "Y")
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 1 << 20 // four sections
	mem, reg := region(t, s, n, jbmt.Read)
	copy(mem, random(n, 31))
	buf := alloc(t, n)
	p := self(t, ctx, s)
	before := stats(t)
	if m, err := reg.Advise(0, n); err != nil || m != n {
		t.Fatalf("Region.Advise of 1 MiB: %d, %v", m, err)
	}
	if m, err := s.Advise(buf, jbmt.Write); err != nil || m != n {
		t.Fatalf("Service.Advise of 1 MiB: %d, %v", m, err)
	}
	mid := stats(t)
	if d := mid.PinCachePages - before.PinCachePages; d != 2*n/4096 {
		t.Errorf("after advising 1 MiB each side: %d more pages cached, want %d", d, 2*n/4096)
	}
	if m, err := p.Get(ctx, buf, reg.Token(), 0); err != nil || m != n || !bytes.Equal(buf, mem) {
		t.Fatalf("Get over advised memory: %d, %v", m, err)
	}
	st := stats(t)
	if hits, inline := st.PinCacheHits-mid.PinCacheHits, st.SectionsInline-mid.SectionsInline; hits != 8 || inline != 4 {
		t.Errorf("the first get over advised memory: %d pin-cache hits, %d sections inline; want 8, 4", hits, inline)
	}
	if st.PinCacheMisses != mid.PinCacheMisses {
		t.Errorf("the first get over advised memory: %d misses", st.PinCacheMisses-mid.PinCacheMisses)
	}

	// errors, and the budget
	if _, err := s.Advise(nil, jbmt.Write); !errors.Is(err, jbmt.ErrInvalid) {
		t.Errorf("Advise of nothing: %v, want ErrInvalid", err)
	}
	if _, err := s.Advise(buf, 0); !errors.Is(err, jbmt.ErrInvalid) {
		t.Errorf("Advise with no use: %v, want ErrInvalid", err)
	}
	if _, err := reg.Advise(n-4096, 8192); !errors.Is(err, jbmt.ErrRange) {
		t.Errorf("Region.Advise past the region's end: %v, want ErrRange", err)
	}
	gap := alloc(t, 3*4096)
	hole(t, gap[8192:])
	if m, err := s.Advise(gap, jbmt.Read); !errors.Is(err, jbmt.ErrFault) || m != 0 {
		// one section: it faults as a whole
		t.Errorf("Advise over an unmapped page: %d, %v; want 0, ErrFault", m, err)
	}
	settle(t)
	setParam(t, "jbmt_pin_cache", "N") // give everything back
	setParam(t, "jbmt_pin_cache", "Y")
	setParam(t, "jbmt_pin_budget_pages", "96")
	if m, err := reg.Advise(0, n); err != nil || m != 256<<10 {
		st := stats(t)
		t.Errorf("Region.Advise of 1 MiB with a budget of 96 pages: %d, %v; want one section of 256 KiB (%d pages pinned, %d cached, %d idle)",
			m, err, st.PinnedPages, st.PinCachePages, st.PinCacheIdle)
	}
	other := alloc(t, n)
	if m, err := s.Advise(other, jbmt.Read); err != nil || m != 256<<10 {
		t.Errorf("Service.Advise of 1 MiB with a budget of 96 pages: %d, %v; want one section of 256 KiB", m, err)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Advise(0, 4096); !errors.Is(err, jbmt.ErrClosed) {
		t.Errorf("Advise of a closed region: %v, want ErrClosed", err)
	}
}

// forkWhile forks this process (a real fork: CLONE_NEWUSER keeps Go from
// sharing the address space with the child, so its page tables are copied
// copy-on-write) and execs true in the child, again and again until done
// is closed; it returns how many times.
func forkWhile(t *testing.T, done <-chan struct{}) int {
	t.Helper()
	n := 0
	for {
		select {
		case <-done:
			return n
		default:
		}
		cmd := exec.Command("true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		if err := cmd.Run(); err != nil {
			t.Errorf("fork and exec: %v", err)
			return n
		}
		n++
	}
}

// TestLabTransferFork (suite jbmt): a process forks again and again while
// a 32 MiB get lands in its buffer and a 32 MiB put reads from it (the
// fork copies its page tables, write-protecting every page; pinned pages
// are copied for the child). Every byte lands, the cached ranges the
// forks made stale are dropped, and nothing stays pinned but idle cached
// ranges.
func TestLabTransferFork(t *testing.T) {
	setParam(t, "jbmt_pin_cache", "Y")
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 32 << 20
	mem, reg := region(t, s, n, jbmt.Read|jbmt.Write)
	want := random(n, 41)
	copy(mem, want)
	buf := alloc(t, n)
	p := self(t, ctx, s)
	if _, err := p.Get(ctx, buf, reg.Token(), 0); err != nil { // caches both sides
		t.Fatal(err)
	}
	before := stats(t)
	for _, op := range []string{"get", "put"} {
		if op == "put" {
			want = random(n, 42)
			copy(buf, want)
		} else {
			clear(buf)
		}
		done := make(chan struct{})
		forks := make(chan int)
		go func() { forks <- forkWhile(t, done) }()
		var m int
		var err error
		if op == "get" {
			m, err = p.Get(ctx, buf, reg.Token(), 0)
		} else {
			m, err = p.Put(ctx, buf, reg.Token(), 0)
		}
		close(done)
		k := <-forks
		if err != nil || m != n {
			t.Fatalf("%s of 32 MiB with %d forks meanwhile: %d, %v", op, k, m, err)
		}
		got := buf
		if op == "put" {
			got = mem
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s of 32 MiB with %d forks meanwhile: the bytes differ", op, k)
		}
		t.Logf("%s of 32 MiB with %d forks meanwhile: every byte right", op, k)
	}
	if st := stats(t); st.PinCacheStale == before.PinCacheStale {
		t.Errorf("no cached range went stale across the forks")
	}
	checkUnpinned(t)
}
