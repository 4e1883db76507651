//go:build lab

package jbmt_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

// shared maps n bytes of shared memory (shmem: pages that are not
// anonymous to the kernel), unmapped when the test ends.
func shared(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// TestLabTransferSmall (suite jbmt): sections of at most jbmt_inline_bytes
// carry their data in the request and the answer. Gets and puts of 1 B to
// 8 KiB from odd addresses to odd offsets move every byte with their
// data in the messages (counted in small_sections), with the threshold at
// 0 they take the registered way, and a small put into shared memory
// (whose pages a completion handler does not write) is served from a work
// item. Asynchronous small transfers start in the submitting call and end
// in the completion handler (async_direct), from Go memory or from shared
// memory (a worker then), and a refused one keeps the connection.
func TestLabTransferSmall(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const size = 1 << 20
	mem, reg := region(t, s, size, jbmt.Read|jbmt.Write)

	move := func(n int, off uint64, seed uint64) {
		t.Helper()
		src := random(n+7, seed)[7:]
		if got, err := p.Put(ctx, src, reg.Token(), off); err != nil || got != n {
			t.Fatalf("Put of %d bytes at %d: %d, %v", n, off, got, err)
		}
		if !bytes.Equal(mem[off:off+uint64(n)], src) {
			t.Fatalf("Put of %d bytes at %d: the region holds other bytes", n, off)
		}
		dst := make([]byte, n+1)[1:]
		if got, err := p.Get(ctx, dst, reg.Token(), off); err != nil || got != n || !bytes.Equal(dst, src) {
			t.Fatalf("Get of %d bytes at %d: %d, %v (equal: %v)", n, off, got, err, bytes.Equal(dst, src))
		}
	}
	sizes := []int{1, 100, 4095, 4096, 4097, 8191, 8192}
	setParam(t, "jbmt_inline_bytes", "8192")
	before := sysfsJBMT(t, "small_sections")
	for i, n := range sizes {
		move(n, uint64(4096*i*3+4093), uint64(i))
	}
	if d := sysfsJBMT(t, "small_sections") - before; d != 2*uint64(len(sizes)) {
		t.Errorf("%d transfers of at most 8 KiB with jbmt_inline_bytes 8192: %d small sections, want one each", 2*len(sizes), d)
	}
	setParam(t, "jbmt_inline_bytes", "0")
	before = sysfsJBMT(t, "small_sections")
	for i, n := range sizes[:4] {
		move(n, uint64(4096*i*3+11), uint64(50+i))
	}
	if d := sysfsJBMT(t, "small_sections") - before; d != 0 {
		t.Errorf("with jbmt_inline_bytes 0: %d small sections", d)
	}
	setParam(t, "jbmt_inline_bytes", "4096")

	// a region in shared memory: its small puts go to a work item
	shm := shared(t, 64<<10)
	sreg, err := s.Register(shm, jbmt.Read|jbmt.Write)
	if err != nil {
		t.Fatal(err)
	}
	defer sreg.Close()
	for i := range shm {
		shm[i] = 0xee // resident
	}
	deferred := sysfsJBMT(t, "sections_deferred")
	src := random(3000, 77)
	if got, err := p.Put(ctx, src, sreg.Token(), 5000); err != nil || got != len(src) {
		t.Fatalf("Put into shared memory: %d, %v", got, err)
	}
	if !bytes.Equal(shm[5000:8000], src) || shm[4999] != 0xee || shm[8000] != 0xee {
		t.Fatal("a small put into shared memory: other bytes, or bytes around it written")
	}
	if sysfsJBMT(t, "sections_deferred") == deferred {
		t.Error("a small put into shared memory was served in the completion handler")
	}

	// asynchronous: direct from Go memory, and into shared memory
	direct := sysfsJBMT(t, "async_direct")
	copy(mem[1000:], random(64<<10, 88))
	g1 := make([]byte, 4096)
	g2 := make([]byte, 64<<10)
	g3 := shm[10000:14096]
	pv := random(2000, 89)
	for i, op := range []func() error{
		func() error { return p.StartGet(g1, reg.Token(), 1000, 0) },
		func() error { return p.StartGet(g2, reg.Token(), 1000, 1) },
		func() error { return p.StartGet(g3, reg.Token(), 1000, 2) },
		func() error { return p.StartPut(pv, reg.Token(), 300000, 3) },
	} {
		if err := op(); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
	}
	for _, c := range collect(t, ctx, s, 4) {
		want := []int{4096, 64 << 10, 4096, 2000}
		if c.Tag >= 4 || c.Err != nil || c.N != want[c.Tag] {
			t.Fatalf("completion %+v", c)
		}
		if !(c.Submitted > 0 && c.Submitted <= c.Started && c.Started <= c.FirstAnswer && c.FirstAnswer <= c.Ended) {
			t.Errorf("completion %d: stages out of order: %+v", c.Tag, c)
		}
	}
	want := random(64<<10, 88)
	if !bytes.Equal(g1, want[:4096]) || !bytes.Equal(g2, want) || !bytes.Equal(g3, want[:4096]) ||
		!bytes.Equal(mem[300000:302000], pv) {
		t.Error("asynchronous small transfers: other bytes")
	}
	if d := sysfsJBMT(t, "async_direct") - direct; d < 2 || d > 4 {
		t.Errorf("%d of 4 asynchronous transfers started directly; want the three from Go memory (two at least: credits may be taken)", d)
	}
	bad := reg.Token()
	bad.Key++
	if err := p.StartGet(make([]byte, 10), bad, 0, 9); err != nil {
		t.Fatal(err)
	}
	if c := collect(t, ctx, s, 1)[0]; c.Tag != 9 || !errors.Is(c.Err, jbmt.ErrBadToken) {
		t.Errorf("a small get with a bad token: %+v", c)
	}
	move(4096, 12345, 99) // the connection is up
	checkUnpinned(t)
}
