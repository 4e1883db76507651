//go:build lab

package jbmt_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

// TestLabSectionSize (suite jbmt): jbmt_section_pages caps the sections
// this host starts. At 1 and 5 pages, gets and puts from odd addresses to
// odd offsets move every byte in as many sections as their local range
// spans in pages, divided by the cap and rounded up; a value outside 1 to
// 64 is refused and the cap kept.
func TestLabSectionSize(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const size = 1 << 20
	mem, reg := region(t, s, size, jbmt.Read|jbmt.Write)

	const path = "/sys/module/rdmaplus/parameters/jbmt_section_pages"
	for _, bad := range []string{"0", "65", "-1", "x"} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err == nil {
			t.Errorf("jbmt_section_pages %q taken", bad)
		}
	}
	if b, err := os.ReadFile(path); err != nil || string(bytes.TrimSpace(b)) != "64" {
		t.Fatalf("jbmt_section_pages after refused writes: %q, %v; want 64", b, err)
	}

	for _, c := range []struct {
		pages  int
		n      int
		off    uint64
		seed   uint64
		lshift int // the local buffer's offset in its first page
	}{
		{1, 20000, 4093, 1, 7},
		{5, 100<<10 + 333, 70001, 2, 4001},
		{5, 8 << 10, 12345, 3, 0},
	} {
		setParam(t, "jbmt_section_pages", strconv.Itoa(c.pages))
		span := (c.lshift + c.n + 4095) / 4096
		want := uint64((span + c.pages - 1) / c.pages)
		buf := alloc(t, (span+1)*4096)

		src := buf[c.lshift : c.lshift+c.n]
		copy(src, random(c.n, c.seed))
		before := sysfsJBMT(t, "sections")
		if got, err := p.Put(ctx, src, reg.Token(), c.off); err != nil || got != c.n {
			t.Fatalf("%d pages: Put of %d bytes at %d: %d, %v", c.pages, c.n, c.off, got, err)
		}
		if d := sysfsJBMT(t, "sections") - before; d != want {
			t.Errorf("%d pages: Put of %d bytes from offset %d of a page: %d sections, want %d", c.pages, c.n, c.lshift, d, want)
		}
		if !bytes.Equal(mem[c.off:c.off+uint64(c.n)], src) {
			t.Fatalf("%d pages: Put of %d bytes at %d: the region holds other bytes", c.pages, c.n, c.off)
		}

		clear(buf)
		copy(mem[c.off:], random(c.n, c.seed+100))
		before = sysfsJBMT(t, "sections")
		if got, err := p.Get(ctx, src, reg.Token(), c.off); err != nil || got != c.n {
			t.Fatalf("%d pages: Get of %d bytes at %d: %d, %v", c.pages, c.n, c.off, got, err)
		}
		if d := sysfsJBMT(t, "sections") - before; d != want {
			t.Errorf("%d pages: Get of %d bytes into offset %d of a page: %d sections, want %d", c.pages, c.n, c.lshift, d, want)
		}
		if !bytes.Equal(src, mem[c.off:c.off+uint64(c.n)]) {
			t.Fatalf("%d pages: Get of %d bytes at %d: other bytes arrived", c.pages, c.n, c.off)
		}
		for i, b := range buf {
			if (i < c.lshift || i >= c.lshift+c.n) && b != 0 {
				t.Fatalf("%d pages: Get wrote byte %d outside its buffer", c.pages, i)
			}
		}
	}
	setParam(t, "jbmt_section_pages", "64")
}
