package dht

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
)

func testVolume(t *testing.T, l Layout) *Volume {
	t.Helper()
	if err := l.Check(); err != nil {
		t.Fatal(err)
	}
	return newVolume(l, make([]byte, l.Size()))
}

func TestLayout(t *testing.T) {
	pl := Layout{Buckets: 1000, Heap: 300}
	l := pl.geo()
	if l.Size() != pl.Size() || pl.Bucket(77) != l.Bucket(77) {
		t.Fatal("Layout and its geometry differ")
	}
	if l.Size()%pageSize != 0 || l.CellOff(0)%pageSize != 0 || l.LastOff(999)+8 > l.CellOff(0) {
		t.Fatalf("layout %+v: size %d, cells at %d", l, l.Size(), l.CellOff(0))
	}
	if off, n := l.TableSpan(); off != l.CellOff(0) || off+n != l.Size() || n < 1300*cellSize {
		t.Fatalf("table span %d+%d", off, n)
	}
	for _, bad := range []Layout{{0, 1}, {1, -1}, {MaxCells, 1}} {
		if err := bad.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	mem := make([]byte, l.Size())
	l.PutHeader(mem)
	got, err := parseHeader(mem[:layout.HeaderLen], len(mem))
	if err != nil || got != pl {
		t.Fatalf("parseHeader: %+v %v", got, err)
	}
	if _, err := parseHeader(mem[:layout.HeaderLen], len(mem)-1); !errors.Is(err, ErrProtocol) {
		t.Errorf("too small memory: %v", err)
	}
	if _, err := parseHeader(make([]byte, layout.HeaderLen), len(mem)); !errors.Is(err, ErrProtocol) {
		t.Errorf("no magic: %v", err)
	}
	binary.LittleEndian.PutUint64(mem[8:], 1<<40) // Buckets
	if _, err := parseHeader(mem[:layout.HeaderLen], len(mem)); !errors.Is(err, ErrProtocol) {
		t.Errorf("huge: %v", err)
	}
	if k, v := layout.Split(layout.Elem(7, 9)); k != 7 || v != 9 {
		t.Fatal("Elem/Split")
	}
	if _, ok := l.CellAt(l.CellOff(3) + 8); ok {
		t.Error("cellAt accepts a next word")
	}
	if i, ok := l.CellAt(l.CellOff(1299)); !ok || i != 1299 {
		t.Error("cellAt")
	}
	if _, ok := l.CellAt(l.CellOff(1300)); ok {
		t.Error("cellAt past the heap")
	}
}

// remoteOf reads a local volume as a source would.
func remoteOf(v *Volume) cellReader {
	return func(_ context.Context, i int, b []byte) error {
		copy(b, v.mem[v.g.CellOff(i):v.g.CellOff(i)+cellSize])
		return nil
	}
}

func TestVolumeInsertLookupRemove(t *testing.T) {
	l := Layout{Buckets: 64, Heap: 40}
	v := testVolume(t, l)
	w, err := Workload(100, l, 0.5, 3)
	if err != nil {
		t.Fatal(err)
	}
	if c := Collisions(w, l); c != 50 {
		t.Fatalf("%d collisions, want 50", c)
	}
	full := 0
	for _, p := range w {
		if err := v.insert(layout.Elem(p.Key, p.Value)); errors.Is(err, ErrFull) {
			full++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if full != 10 || v.HeapUsed() != 40 {
		t.Fatalf("%d inserts found the heap full (want 10), %d heap cells used", full, v.HeapUsed())
	}
	seen, err := v.Contents()
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for _, p := range w {
		val, ok := v.Lookup(p.Key)
		_, rval, rok, err := findRemote(context.Background(), l.geo(), remoteOf(v), p.Key)
		if err != nil || rok != ok || ok && (rval != layout.Elem(p.Key, p.Value)) {
			t.Fatalf("key %d: remote lookup %v %v %v, local %v", p.Key, rval, rok, err, ok)
		}
		if ok {
			stored++
			if val != p.Value || seen[p] != 1 {
				t.Fatalf("key %d: value %d (want %d), seen %d times", p.Key, val, p.Value, seen[p])
			}
		}
	}
	if stored != 90 {
		t.Fatalf("%d stored, want 90", stored)
	}
	for _, p := range w[:30] {
		ok := v.remove(p.Key)
		if _, still := v.Lookup(p.Key); still {
			t.Fatalf("key %d still there after remove (%v)", p.Key, ok)
		}
	}
	if _, err := v.Contents(); err != nil {
		t.Fatal(err)
	}
	if v.remove(w[0].Key) {
		t.Fatal("removed twice")
	}
}

func TestVolumeCorrupt(t *testing.T) {
	l := Layout{Buckets: 4, Heap: 4}
	v := testVolume(t, l)
	v.setElem(0, layout.Elem(1, 1))
	v.setNext(0, 2) // into the table: corrupt
	if _, err := v.Contents(); err == nil {
		t.Fatal("a chain into the table not reported")
	}
	if _, _, _, err := findRemote(context.Background(), l.geo(), remoteOf(v), 0x10000); err == nil && l.Bucket(0x10000) == 0 {
		t.Fatal("remote walk follows a corrupt link")
	}
	v = testVolume(t, l)
	v.setNext(1, 5)
	v.setNext(5, 5) // loop
	if _, err := v.Contents(); err == nil {
		t.Fatal("a loop not reported")
	}
	v = testVolume(t, l)
	atomicStore(v, l.geo().NextFreeOff(), 1)
	v.setElem(4, layout.Elem(9, 9)) // orphan heap cell
	if _, err := v.Contents(); err == nil {
		t.Fatal("an orphan not reported")
	}
}

func atomicStore(v *Volume, off int, x uint64) { *v.word(off) = x }

func TestWorkload(t *testing.T) {
	l := Layout{Buckets: 4096, Heap: 1024}
	for _, c := range []float64{0, 0.05, 0.25} {
		w, err := Workload(2000, l, c, 11)
		if err != nil {
			t.Fatal(err)
		}
		want := int(2000*c + 0.5)
		if got := Collisions(w, l); got != want {
			t.Fatalf("%.2f: %d collisions, want %d", c, got, want)
		}
		keys := map[uint32]bool{}
		for _, p := range w {
			if p.Key == 0 || keys[p.Key] || p.Value != ValueOf(p.Key, 11) {
				t.Fatalf("bad pair %+v", p)
			}
			keys[p.Key] = true
		}
		w2, _ := Workload(2000, l, c, 11)
		if w2[17] != w[17] {
			t.Fatal("not deterministic")
		}
		a, b := Share(w, 0, 2), Share(w, 1, 2)
		if len(a)+len(b) != len(w) || a[1] != w[2] || b[0] != w[1] {
			t.Fatal("Share")
		}
	}
	for _, bad := range []struct {
		n int
		c float64
	}{{0, 0}, {10, 1}, {10, -0.1}, {5000, 0}} {
		if _, err := Workload(bad.n, l, bad.c, 1); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}
