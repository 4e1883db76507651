package activeaccess

import (
	"math/rand"
	"testing"
)

// TestSendQueueRing: the in-flight ring keeps posting order across
// wrap-arounds, find names the position of an id or -1, and pop empties
// it from the oldest.
func TestSendQueueRing(t *testing.T) {
	q := newSendQueue(5, 0)
	if q.sigEvery != 1 {
		t.Fatalf("sigEvery %d from 0, want 1", q.sigEvery)
	}
	r := rand.New(rand.NewSource(1))
	var model []uint64
	next := uint64(1)
	for i := 0; i < 2000; i++ {
		if len(model) < 5 && (len(model) == 0 || r.Intn(2) == 0) {
			q.push(sqEntry{id: next})
			model = append(model, next)
			next++
		} else {
			// Complete up to a random entry, as a signaled completion does.
			j := r.Intn(len(model))
			if got := q.find(model[j]); got != j {
				t.Fatalf("find(%d) = %d, want %d", model[j], got, j)
			}
			for k := 0; k <= j; k++ {
				if e := q.pop(); e.id != model[k] {
					t.Fatalf("pop %d, want %d", e.id, model[k])
				}
			}
			model = model[j+1:]
		}
		if q.n != len(model) {
			t.Fatalf("%d in flight, want %d", q.n, len(model))
		}
		if q.find(next) != -1 || q.find(0) != -1 {
			t.Fatal("find of an id never pushed or already popped")
		}
	}
}
