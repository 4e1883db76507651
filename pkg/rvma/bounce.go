package rvma

import (
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// A put whose source is not endpoint memory is copied into registered
// memory first, so that the caller may reuse the source at once. A source
// of at most bounceChunk bytes is copied into a chunk of the slabs the
// endpoint registers as puts need them (bounceSlab chunks each, at most
// bounceMaxSlabs, kept until the endpoint closes); a larger one, or any
// while every chunk is lent, gets a registration of its own, which costs
// system calls and the pinning of its pages each time (docs/benchmarks.md,
// "Puts from Go memory").
const (
	bounceChunk    = 4096
	bounceSlab     = 64
	bounceMaxSlabs = 16
)

// bounce lends the slabs' chunks to puts. Chunk i lies in slab
// i/bounceSlab. Safe for concurrent use.
type bounce struct {
	mu     sync.Mutex
	slabs  []*verbs.MR
	free   chunkStack
	failed bool // a slab could not be registered: no more are tried
	closed bool // the engine closed: the slabs are gone with its PD
}

// lend copies src (at most bounceChunk bytes) into a free chunk and
// returns the chunk's index and scatter/gather element; false when src is
// too large, or no chunk is free and no slab can be added.
func (b *bounce) lend(pd *verbs.PD, src []byte) (int, verbs.SGE, bool) {
	if len(src) > bounceChunk {
		return 0, verbs.SGE{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, verbs.SGE{}, false
	}
	i, ok := b.free.take()
	if !ok {
		if b.failed || len(b.slabs) == bounceMaxSlabs {
			return 0, verbs.SGE{}, false
		}
		mr, err := pd.AllocMR(bounceChunk*bounceSlab, verbs.AccessLocalWrite)
		if err != nil {
			// Most likely the locked-memory limit: the put registers
			// its own copy, and reports that error if it recurs.
			b.failed = true
			return 0, verbs.SGE{}, false
		}
		b.free.add(len(b.slabs)*bounceSlab, bounceSlab)
		b.slabs = append(b.slabs, mr)
		i, _ = b.free.take()
	}
	mr, off := b.slabs[i/bounceSlab], i%bounceSlab*bounceChunk
	copy(mr.Bytes()[off:off+len(src)], src)
	return i, verbs.SGE{Addr: mr.Addr() + uint64(off), Length: uint32(len(src)), LKey: mr.LKey()}, true
}

// giveBack returns chunk i, whose put is over: its work request executed
// or can no longer execute.
func (b *bounce) giveBack(i int) {
	b.mu.Lock()
	if !b.closed {
		b.free.put(i)
	}
	b.mu.Unlock()
}

// close stops the lending before the engine closes the PD, which
// deregisters and frees the slabs; chunks given back later are dropped.
func (b *bounce) close() {
	b.mu.Lock()
	b.closed, b.slabs, b.free = true, nil, nil
	b.mu.Unlock()
}

// lent reports the chunks lent and not given back, and the chunks in all.
func (b *bounce) lent() (lent, all int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	all = len(b.slabs) * bounceSlab
	return all - len(b.free), all
}

// chunkStack is a stack of free chunk indexes.
type chunkStack []int

// add pushes the n indexes from first on, first on top.
func (s *chunkStack) add(first, n int) {
	for i := first + n - 1; i >= first; i-- {
		*s = append(*s, i)
	}
}

// take pops a free index; false when none is left.
func (s *chunkStack) take() (int, bool) {
	n := len(*s)
	if n == 0 {
		return 0, false
	}
	i := (*s)[n-1]
	*s = (*s)[:n-1]
	return i, true
}

// put pushes a free index back.
func (s *chunkStack) put(i int) { *s = append(*s, i) }
