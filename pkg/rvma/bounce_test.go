package rvma

import (
	"slices"
	"testing"
)

func TestChunkStack(t *testing.T) {
	var s chunkStack
	s.add(0, 3)
	s.add(3, 2)
	var got []int
	for {
		i, ok := s.take()
		if !ok {
			break
		}
		got = append(got, i)
	}
	if want := []int{3, 4, 0, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("took %v, want %v", got, want)
	}
	s.put(1)
	if i, ok := s.take(); !ok || i != 1 {
		t.Fatalf("take after put(1) = %d, %v", i, ok)
	}
	if _, ok := s.take(); ok {
		t.Fatal("take from an empty stack succeeded")
	}
}

// A copy larger than a chunk, or any after close, is not lent; neither
// touches the PD (nil here).
func TestBounceRefuses(t *testing.T) {
	var b bounce
	if _, _, _, ok := b.lend(nil, bounceChunk+1); ok {
		t.Fatal("lent a chunk for a copy larger than a chunk")
	}
	b.close()
	if _, _, _, ok := b.lend(nil, 8); ok {
		t.Fatal("lent a chunk after close")
	}
	b.giveBack(0) // dropped, no panic
	if lent, all := b.lent(); lent != 0 || all != 0 {
		t.Fatalf("after close: %d of %d chunks lent", lent, all)
	}
}

// lent reports the chunks lent and not given back, and the chunks in all.
func (b *bounce) lent() (lent, all int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	all = len(b.slabs) * bounceSlab
	return all - len(b.free), all
}
