package rvma

import (
	"sync"
	"sync/atomic"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// A put whose source, or a get whose destination, is not endpoint memory
// goes through a registered copy: the NIC never touches Go memory, and the
// caller may reuse a put's source at once. A copy of at most bounceChunk
// bytes is a chunk of the slabs the endpoint registers as copies need them
// (bounceSlab chunks each, at most bounceMaxSlabs, kept until the endpoint
// closes); a larger one, or any while every chunk is lent, gets a
// registration of its own, which costs system calls and the pinning of its
// pages each time: between two guests a registration per put made a put
// of 8 B or 4 KiB from Go memory 2 to 4 times slower than one from
// endpoint memory, and a chunk makes it as fast (docs/rvma.md, "Measured
// findings").
const (
	bounceChunk    = 4096
	bounceSlab     = 64
	bounceMaxSlabs = 16
)

// regCopy is registered memory standing in for n bytes of Go memory that
// is not the endpoint's: a bounce chunk or a registration of its own. The
// zero value (mem nil) is no copy.
type regCopy struct {
	mem   []byte    // the copy's n bytes
	sge   verbs.SGE // the same, for a work request
	chunk int       // the bounce chunk, or -1
	temp  *verbs.MR // or the registration of its own
}

// newCopy returns registered memory for n (> 0) bytes. It fails only if a
// registration of its own is needed and fails (for example, the
// locked-memory limit).
func (e *engine) newCopy(n int) (regCopy, error) {
	if i, sge, mem, ok := e.bounce.lend(e.pd, n); ok {
		return regCopy{mem: mem, sge: sge, chunk: i}, nil
	}
	mr, err := e.pd.AllocMR(n, verbs.AccessLocalWrite)
	if err != nil {
		return regCopy{}, err
	}
	e.bounce.registered.Add(1)
	return regCopy{mem: mr.Bytes()[:n], sge: verbs.SGE{Addr: mr.Addr(), Length: uint32(n), LKey: mr.LKey()}, chunk: -1, temp: mr}, nil
}

// dropCopy ends c's use. inDoubt says a work request on c may still
// execute: a registration of its own is deregistered all the same (the
// request then fails if it runs), but a bounce chunk is never lent again,
// since another operation's bytes would be read or overwritten there.
func (e *engine) dropCopy(c regCopy, inDoubt bool) {
	if c.mem == nil {
		return
	}
	if c.temp != nil {
		c.temp.Close()
	}
	if c.chunk >= 0 && !inDoubt {
		e.bounce.giveBack(c.chunk)
	}
}

// bounce lends the slabs' chunks to copies. Chunk i lies in slab
// i/bounceSlab. Safe for concurrent use.
type bounce struct {
	mu     sync.Mutex
	slabs  []*verbs.MR
	free   chunkStack
	failed bool // a slab could not be registered: no more are tried
	closed bool // the engine closed: the slabs are gone with its PD

	registered atomic.Uint64 // copies that got a registration of their own
}

// lend returns a free chunk's index, scatter/gather element and first n
// (at most bounceChunk) bytes; false when n is too large, or no chunk is
// free and no slab can be added.
func (b *bounce) lend(pd *verbs.PD, n int) (int, verbs.SGE, []byte, bool) {
	if n > bounceChunk {
		return 0, verbs.SGE{}, nil, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, verbs.SGE{}, nil, false
	}
	i, ok := b.free.take()
	if !ok {
		if b.failed || len(b.slabs) == bounceMaxSlabs {
			return 0, verbs.SGE{}, nil, false
		}
		mr, err := pd.AllocMR(bounceChunk*bounceSlab, verbs.AccessLocalWrite)
		if err != nil {
			// Most likely the locked-memory limit: the copy gets a
			// registration of its own, which reports that error if it
			// recurs.
			b.failed = true
			return 0, verbs.SGE{}, nil, false
		}
		b.free.add(len(b.slabs)*bounceSlab, bounceSlab)
		b.slabs = append(b.slabs, mr)
		i, _ = b.free.take()
	}
	mr, off := b.slabs[i/bounceSlab], i%bounceSlab*bounceChunk
	return i, verbs.SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}, mr.Bytes()[off : off+n : off+n], true
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
