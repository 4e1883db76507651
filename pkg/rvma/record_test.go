package rvma

import (
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

func TestCompletionLayout(t *testing.T) {
	if unsafe.Sizeof(Completion{}) != CompletionSize {
		t.Fatalf("Completion is %d bytes", unsafe.Sizeof(Completion{}))
	}
	s := newCompletionSlab(5)
	var got []*Completion
	seen := map[uintptr]bool{}
	for range 12 { // beyond one chunk: the slab grows
		c := s.get()
		if c.Addr()%CompletionSize != 0 {
			t.Fatalf("completion at %#x not cache-line aligned", c.Addr())
		}
		if seen[c.Addr()] {
			t.Fatalf("completion at %#x handed out twice", c.Addr())
		}
		seen[c.Addr()] = true
		got = append(got, c)
	}
	s.put(got[2])
	if s.get() != got[2] {
		t.Fatal("recycled completion not reused")
	}
	if _, ok := got[0].Load(); ok {
		t.Fatal("fresh completion reports a record")
	}
	r := Record{Epoch: 1, Addr: 2, Len: 3, Ops: 4, Cap: 5, Flags: FlagPartial | FlagLate}
	if seq := got[0].publish(r); seq != 2 {
		t.Fatalf("first publication seq %d", seq)
	}
	if l, ok := got[0].Load(); !ok || l != r {
		t.Fatalf("%+v", l)
	}
	if r.Flags.String() != "partial|late" || Flags(0).String() != "0" || Flags(1<<9).String() != "0x200" {
		t.Fatal(r.Flags.String())
	}
}

// Readers polling a completion while it is re-published never see a torn
// record: every field of a record is derived from its epoch.
func TestCompletionNeverTorn(t *testing.T) {
	s := newCompletionSlab(1)
	c := s.get()
	mk := func(e uint64) Record {
		return Record{Epoch: e, Addr: e * 3, Len: e * 5, Ops: e * 7, Cap: e * 11, Flags: Flags(e & 0xf)}
	}
	const n = 20000
	var stop atomic.Bool
	var wg sync.WaitGroup
	var seen atomic.Uint64
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for !stop.Load() {
				rec, ok := c.Load()
				if !ok {
					continue
				}
				if rec != mk(rec.Epoch) {
					t.Errorf("torn record %+v", rec)
					return
				}
				if rec.Epoch < last {
					t.Errorf("epoch went back from %d to %d", last, rec.Epoch)
					return
				}
				last = rec.Epoch
				seen.Add(1)
			}
		}()
	}
	for e := uint64(1); e <= n; e++ {
		c.publish(mk(e))
	}
	stop.Store(true)
	wg.Wait()
	if c.Seq() != 2*n {
		t.Fatalf("seq %d", c.Seq())
	}
	t.Logf("%d consistent reads", seen.Load())
}
