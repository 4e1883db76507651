//go:build lab

package dht_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht"
)

// TestLabTables: for every design, two sources (guests 2 and 3) insert
// their halves of a random workload at 5% and 25% collisions, then the
// target finds every key exactly once with its value in a sound volume
// (chains intact, no orphan, the heap holding exactly the collisions);
// each source looks a sample of its keys up remotely, deletes a quarter
// of them and checks that a sample of those is gone and of the rest is
// not; the target checks every key again.
func TestLabTables(t *testing.T) {
	const n = 400
	l := dht.Layout{Buckets: 1024, Heap: 256}
	for di, d := range designs() {
		for ci, coll := range []float64{0.05, 0.25} {
			name := fmt.Sprintf("%s-%d", d.name, int(coll*100))
			port := uint16(7600 + 2*di + ci)
			t.Run(name, func(t *testing.T) {
				seed := uint64(100*di + ci + 1)
				w, err := dht.Workload(n, l, coll, seed)
				if err != nil {
					t.Fatal(err)
				}
				b := barriers(t, name)
				if guest(t) == 1 {
					tablesTarget(t, port, d, l, w, b)
				} else {
					tablesSource(t, port, d.kind, w, b)
				}
			})
		}
	}
}

func tablesTarget(t *testing.T, port uint16, d design, l dht.Layout, w []dht.Pair, b func(string) string) {
	tg := serve(t, port, d, l)
	defer signal(t, b("checked"))
	signal(t, b("ready"))
	await(t, b("inserted-2"))
	await(t, b("inserted-3"))
	check(t, tg.Volume(), w, nil)
	if got, want := tg.Volume().HeapUsed(), dht.Collisions(w, l); got != want {
		t.Errorf("%d heap cells used, want %d (the collisions)", got, want)
	}
	signal(t, b("inserts-checked"))
	await(t, b("deleted-2"))
	await(t, b("deleted-3"))
	gone := map[uint32]bool{}
	for i := 2; i <= 3; i++ {
		for _, p := range deleted(dht.Share(w, i-2, 2)) {
			gone[p.Key] = true
		}
	}
	check(t, tg.Volume(), w, gone)
}

// sample is the part of a share a source looks up remotely (the target
// checks every key locally): every fifth pair.
func sample(share []dht.Pair) []dht.Pair {
	var out []dht.Pair
	for i := 0; i < len(share); i += 5 {
		out = append(out, share[i])
	}
	return out
}

// deleted is the part of a source's share it deletes: every fourth pair.
func deleted(share []dht.Pair) []dht.Pair {
	var out []dht.Pair
	for i := 0; i < len(share); i += 4 {
		out = append(out, share[i])
	}
	return out
}

// check finds every key of w but those in gone exactly once with its
// value, and nothing else.
func check(t *testing.T, v *dht.Volume, w []dht.Pair, gone map[uint32]bool) {
	t.Helper()
	seen, err := v.Contents()
	if err != nil {
		t.Fatalf("volume: %v", err)
	}
	want := 0
	for _, p := range w {
		switch {
		case gone[p.Key] && seen[p] != 0:
			t.Fatalf("deleted key %d found %d times", p.Key, seen[p])
		case !gone[p.Key] && seen[p] != 1:
			t.Fatalf("key %d with value %d found %d times", p.Key, p.Value, seen[p])
		}
		if !gone[p.Key] {
			want++
		}
	}
	total := 0
	for _, c := range seen {
		total += c
	}
	if total != want {
		t.Fatalf("the volume holds %d elements, want %d", total, want)
	}
}

func tablesSource(t *testing.T, port uint16, k dht.Kind, w []dht.Pair, b func(string) string) {
	i := guest(t)
	share := dht.Share(w, i-2, 2)
	await(t, b("ready"))
	tb := dial(t, k, port)
	ctx := timeout(t, 120*time.Second)
	start := time.Now()
	for _, p := range share {
		if err := tb.Insert(ctx, p.Key, p.Value); err != nil {
			t.Fatalf("Insert: %v", err)
		}
	}
	if err := tb.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	t.Logf("%d inserts in %v", len(share), time.Since(start))
	signal(t, b(fmt.Sprintf("inserted-%d", i)))
	await(t, b("inserts-checked"))
	for _, p := range sample(share) {
		v, ok, err := tb.Lookup(ctx, p.Key)
		if err != nil || !ok || v != p.Value {
			t.Fatalf("Lookup(%d) = %d, %v, %v; want %d", p.Key, v, ok, err, p.Value)
		}
	}
	del := deleted(share)
	for _, p := range del {
		if err := tb.Delete(ctx, p.Key); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	if err := tb.Flush(ctx); err != nil {
		t.Fatalf("Flush after deletes: %v", err)
	}
	for j, p := range share[:min(len(share), 40)] { // the target checks them all
		_, ok, err := tb.Lookup(ctx, p.Key)
		if err != nil || ok != (j%4 != 0) {
			t.Fatalf("after deleting %d keys: Lookup(%d) found %v, %v", len(del), p.Key, ok, err)
		}
	}
	if _, ok, err := tb.Lookup(ctx, 0xfffffffe); err != nil || ok {
		t.Fatalf("Lookup of a key never inserted: %v %v", ok, err)
	}
	signal(t, b(fmt.Sprintf("deleted-%d", i)))
	await(t, b("checked"))
}
