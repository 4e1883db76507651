package rvma

import "testing"

func TestSeqWindow(t *testing.T) {
	var w seqWindow
	take := func(s uint32, want bool) {
		t.Helper()
		if got := w.take(s); got != want {
			t.Fatalf("take(%d) = %v, want %v (next %d, above %v)", s, got, want, w.next, w.above)
		}
	}
	take(0, true)
	take(0, false)
	take(2, true) // 1 lost with a stripe, sent again later
	take(3, true)
	take(2, false)
	take(1, true)
	if w.next != 4 || len(w.above) != 0 {
		t.Fatalf("next %d, above %v", w.next, w.above)
	}
	take(3, false)

	// Wrapping around 2^32.
	w = seqWindow{next: ^uint32(0)}
	take(0, true)
	take(^uint32(0), true)
	take(1, true)
	if w.next != 2 || len(w.above) != 0 {
		t.Fatalf("after wrapping: next %d, above %v", w.next, w.above)
	}
	take(^uint32(0), false)

	// A number lost for good: past maxLateGap the window moves on.
	w = seqWindow{}
	for s := uint32(1); s <= maxLateGap+1; s++ {
		take(s, true)
	}
	if w.next != maxLateGap+2 || len(w.above) != 0 {
		t.Fatalf("gap not given up: next %d, %d above", w.next, len(w.above))
	}
	take(0, false)
	take(5, false)
}
