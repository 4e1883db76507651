package activeaccess

import (
	"errors"
	"math/rand"
	"testing"
)

// refCost computes an access's log bytes byte by byte: one entry per
// (packet, page) pair the access touches.
func refCost(addr uint64, n, mtu int) int64 {
	type key struct{ pkt, page uint64 }
	lens := map[key]int64{}
	var order []key
	for i := 0; i < n; i++ {
		k := key{uint64(i / mtu), (addr + uint64(i)) / pageSize}
		if _, ok := lens[k]; !ok {
			order = append(order, k)
		}
		lens[k]++
	}
	var c int64
	for _, k := range order {
		c += entryHeader + round64(lens[k])
	}
	return c
}

func TestCost(t *testing.T) {
	cases := []struct {
		addr   uint64
		n, mtu int
		want   int64
	}{
		{0, 1, 1024, 128},
		{0, 64, 1024, 128},
		{0, 65, 1024, 64 + 128},
		{4000, 200, 1024, (64 + 128) + (64 + 128)},            // two pages
		{0, 3000, 1024, 2*(64+1024) + 64 + 960},               // three packets
		{0x10000, 8192, 4096, 2 * (64 + 4096)},                // two full pages
		{0x10000 + 100, 4096, 4096, (64 + 4032) + (64 + 128)}, // one packet, two pages
		{0, 0, 1024, 0},
	}
	for _, c := range cases {
		if got := cost(c.addr, c.n, c.mtu); got != c.want {
			t.Errorf("cost(%#x, %d, %d) = %d, want %d", c.addr, c.n, c.mtu, got, c.want)
		}
	}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 3000; i++ {
		addr := uint64(r.Intn(3 * pageSize))
		n := 1 + r.Intn(3*pageSize)
		mtu := 256 << r.Intn(5)
		got, want := cost(addr, n, mtu), refCost(addr, n, mtu)
		if got != want {
			t.Fatalf("cost(%d, %d, %d) = %d, reference %d", addr, n, mtu, got, want)
		}
		// The bound docs/activeaccess.md states.
		entries := int64((n+mtu-1)/mtu + (n+pageSize-1)/pageSize + 1)
		if got > entries*entryHeader+int64(n)+entries*(entryAlign-1) {
			t.Fatalf("cost(%d, %d, %d) = %d above the documented bound", addr, n, mtu, got)
		}
		// A smaller MTU never costs less: an unknown MTU may assume 256.
		if mtu > 256 && cost(addr, n, 256) < got {
			t.Fatalf("cost(%d, %d) with MTU 256 below MTU %d", addr, n, mtu)
		}
	}
}

func TestGrantFor(t *testing.T) {
	for _, c := range []struct{ log, n int }{{1 << 20, 4}, {1 << 16, 1}, {1 << 16, 12}, {64 << 20, 1024}} {
		g, err := grantFor(c.log, c.n)
		if err != nil {
			t.Fatalf("grantFor(%d, %d): %v", c.log, c.n, err)
		}
		if g%entryAlign != 0 || g < maxEntry || g*int64(c.n)+maxEntry > int64(c.log) {
			t.Errorf("grantFor(%d, %d) = %d", c.log, c.n, g)
		}
	}
	for _, c := range []struct{ log, n int }{{4096, 1}, {1 << 16, 16}, {1 << 20, 0}} {
		if _, err := grantFor(c.log, c.n); !errors.Is(err, ErrInvalid) {
			t.Errorf("grantFor(%d, %d): %v, want ErrInvalid", c.log, c.n, err)
		}
	}
}

func TestLedger(t *testing.T) {
	l := newLedger(1000)
	if !l.charge(600) || l.charge(500) || !l.charge(400) || l.charge(1) {
		t.Fatal("charges beyond the grant accepted, or within it refused")
	}
	e1 := l.closeEpoch()
	if r, err := l.ack(e1); err != nil || r != 1000 || l.avail != 1000 {
		t.Fatalf("ack(%d) = %d, %v; avail %d", e1, r, err, l.avail)
	}
	if _, err := l.ack(e1 + 1); !errors.Is(err, ErrProtocol) {
		t.Fatalf("ack of an epoch never sent: %v", err)
	}
	if r, err := l.ack(e1); err != nil || r != 0 {
		t.Fatalf("second ack: %d, %v", r, err)
	}
	// Random operations keep the invariant; acks return exactly what
	// their epochs spent.
	r := rand.New(rand.NewSource(2))
	l = newLedger(1 << 16)
	spent := map[uint64]int64{}
	for i := 0; i < 20000; i++ {
		switch r.Intn(4) {
		case 0, 1:
			c := int64(64 + r.Intn(5000))
			before := l.avail
			if ok := l.charge(c); ok != (c <= before) {
				t.Fatalf("charge(%d) with %d available: %v", c, before, ok)
			}
		case 2:
			if r.Intn(3) == 0 && l.open > 0 {
				l.uncharge(l.open / 2)
			}
			open := l.open
			spent[l.closeEpoch()] = open
		case 3:
			if l.last == l.acked {
				continue
			}
			ep := l.acked + 1 + uint64(r.Intn(int(l.last-l.acked)))
			var want int64
			for e := l.acked + 1; e <= ep; e++ {
				want += spent[e]
			}
			if got, err := l.ack(ep); err != nil || got != want {
				t.Fatalf("ack(%d) = %d, %v; want %d", ep, got, err, want)
			}
		}
		if err := l.check(); err != nil {
			t.Fatal(err)
		}
		if l.outstanding() != len(l.closed) {
			t.Fatalf("outstanding %d, %d closed epochs", l.outstanding(), len(l.closed))
		}
	}
}

func TestStaging(t *testing.T) {
	s := newStaging(1000)
	if _, _, ok := s.alloc(1001); ok {
		t.Fatal("allocated more than the area")
	}
	if _, _, ok := s.alloc(0); ok {
		t.Fatal("allocated 0 bytes")
	}
	o1, h1, _ := s.alloc(600)
	if _, _, ok := s.alloc(500); ok {
		t.Fatal("overcommitted")
	}
	o2, h2, ok := s.alloc(300)
	if !ok || o1 != 0 || o2 != 600 {
		t.Fatalf("offsets %d %d %v", o1, o2, ok)
	}
	s.free(h2) // out of order: nothing reclaimed yet
	if _, _, ok := s.alloc(200); ok {
		t.Fatal("reused space behind a live span")
	}
	s.free(h1)
	if s.used() != 0 {
		t.Fatalf("used %d after freeing everything", s.used())
	}
	// The tail end of the area is skipped when a span does not fit.
	s = newStaging(1000)
	_, ha, _ := s.alloc(700)
	_, hb, _ := s.alloc(200)
	s.free(ha)
	o, hc, ok := s.alloc(250) // 100 left at the end: wraps to 0
	if !ok || o != 0 {
		t.Fatalf("wrapped alloc at %d, %v", o, ok)
	}
	s.free(hb)
	s.free(hc)
	if s.used() != 0 {
		t.Fatalf("used %d", s.used())
	}

	// An empty area takes a span of its whole size, wherever the last
	// one ended; cancel undoes the newest span.
	s = newStaging(1000)
	_, h, _ := s.alloc(600)
	s.free(h)
	if o, h, ok := s.alloc(1000); !ok || o != 0 {
		t.Fatalf("whole-area span after a free: %d, %v", o, ok)
	} else {
		s.free(h)
	}
	_, h1, _ = s.alloc(300)
	_, h2, _ = s.alloc(300)
	s.cancel(h2)
	if o, _, ok := s.alloc(700); !ok || o != 300 {
		t.Fatalf("alloc after cancel: %d, %v", o, ok)
	}
	s.cancel(h1) // not the newest: an ordinary free
	if s.used() != 700 {
		t.Fatalf("used %d after cancelling an older span", s.used())
	}

	// Random in-order and out-of-order frees: live spans never overlap
	// and stay inside the area.
	r := rand.New(rand.NewSource(3))
	s = newStaging(1 << 14)
	type live struct{ off, n, h int }
	var spans []live
	for i := 0; i < 50000; i++ {
		if r.Intn(2) == 0 || len(spans) == 0 {
			n := 1 + r.Intn(3000)
			off, h, ok := s.alloc(n)
			if !ok {
				continue
			}
			if off < 0 || off+n > s.size {
				t.Fatalf("span [%d, +%d) outside the area", off, n)
			}
			for _, l := range spans {
				if off < l.off+l.n && l.off < off+n {
					t.Fatalf("span [%d, +%d) overlaps live [%d, +%d)", off, n, l.off, l.n)
				}
			}
			spans = append(spans, live{off, n, h})
			continue
		}
		j := 0
		if r.Intn(4) == 0 {
			j = r.Intn(len(spans))
		}
		s.free(spans[j].h)
		spans = append(spans[:j], spans[j+1:]...)
	}
	for _, l := range spans {
		s.free(l.h)
	}
	if s.used() != 0 || len(s.spans) != 0 {
		t.Fatalf("used %d, %d spans after freeing all", s.used(), len(s.spans))
	}
}

// ring models the module's log accounting (aa_fits and aa_reserve in
// kmod/rdmaplus_aa.c): entries never wrap, a padding entry fills the end
// of the area, an access is refused when its entries do not fit.
type ring struct {
	size, head, tail int64
	live             []int64 // entry end positions, oldest first (padding included)
}

func (r *ring) fits(lens []int64) bool {
	h := r.head
	for _, l := range lens {
		if room := r.size - h%r.size; room < l {
			h += room
		}
		h += l
	}
	return h-r.tail <= r.size
}

func (r *ring) append(lens []int64) {
	for _, l := range lens {
		if room := r.size - r.head%r.size; room < l {
			r.head += room
		}
		r.head += l
		r.live = append(r.live, r.head)
	}
}

// entries returns the entry lengths of one packet's pieces.
func entries(addr uint64, n, mtu int) [][]int64 {
	var pkts [][]int64
	for p := 0; p < n; p += mtu {
		var lens []int64
		end := min(p+mtu, n)
		for a, e := addr+uint64(p), addr+uint64(end); a < e; {
			next := min((a&^(pageSize-1))+pageSize, e)
			lens = append(lens, entryHeader+round64(int64(next-a)))
			a = next
		}
		pkts = append(pkts, lens)
	}
	return pkts
}

// TestCreditsNeverRefused drives several credit-respecting sources into
// one modelled log with a slow, bursty consumer, acknowledging markers the
// way the target's runtime does (once the consumer passed the head seen
// when the marker arrived), and checks that no packet is ever refused.
func TestCreditsNeverRefused(t *testing.T) {
	for _, c := range []struct {
		logSize, sources, mtu int
	}{{1 << 16, 4, 1024}, {1 << 15, 3, 4096}, {1 << 16, 1, 256}, {1 << 16, 7, 1024}} {
		g, err := grantFor(c.logSize, c.sources)
		if err != nil {
			t.Fatal(err)
		}
		rg := &ring{size: int64(c.logSize)}
		type src struct {
			l       *ledger
			markers []struct {
				epoch uint64
				head  int64
			}
		}
		srcs := make([]*src, c.sources)
		for i := range srcs {
			srcs[i] = &src{l: newLedger(g)}
		}
		rnd := rand.New(rand.NewSource(int64(c.logSize + c.sources)))
		var accesses, blocked int
		for step := 0; step < 200000; step++ {
			s := srcs[rnd.Intn(len(srcs))]
			switch k := rnd.Intn(10); {
			case k < 6: // an access
				n := 1 + rnd.Intn(min(6000, int(g/2)))
				addr := uint64(rnd.Intn(8 * pageSize))
				cst := cost(addr, n, c.mtu)
				if cst > g {
					continue
				}
				if !s.l.charge(cst) {
					blocked++
					continue
				}
				for _, lens := range entries(addr, n, c.mtu) {
					if !rg.fits(lens) {
						t.Fatalf("log %d, %d sources, MTU %d: packet refused (head %d tail %d)", c.logSize, c.sources, c.mtu, rg.head, rg.tail)
					}
					rg.append(lens)
				}
				accesses++
			case k < 8: // a marker arrives: snapshot the head
				if s.l.outstanding() < 16 {
					ep := s.l.closeEpoch()
					s.markers = append(s.markers, struct {
						epoch uint64
						head  int64
					}{ep, rg.head})
				}
			default: // the consumer processes a few entries
				for i := rnd.Intn(40); i > 0 && len(rg.live) > 0; i-- {
					rg.tail = rg.live[0]
					rg.live = rg.live[1:]
				}
				if len(rg.live) == 0 {
					rg.tail = rg.head
				}
				for _, s := range srcs {
					for len(s.markers) > 0 && s.markers[0].head <= rg.tail {
						if _, err := s.l.ack(s.markers[0].epoch); err != nil {
							t.Fatal(err)
						}
						s.markers = s.markers[1:]
					}
				}
			}
		}
		if accesses < 10000 || blocked == 0 {
			t.Fatalf("log %d: %d accesses, %d waits for credits: the model did not push the log", c.logSize, accesses, blocked)
		}
	}
}
