package dht

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
)

// Volume is the target's local view of a DHT volume (the paper's local
// volume) in memory it exposes. The AA and AM targets insert and delete
// through it from their handler (one writer); every target uses it to
// count and check what the sources stored. Its reads and writes of
// elements are 8-byte atomics, so sources reading cells remotely never see
// a torn element. Its methods are safe for concurrent use with the
// target's handler and the sources; they read the target's memory, so
// use a Volume only until its target's Close.
type Volume struct {
	l   Layout
	g   layout.Layout // l's geometry
	mem []byte
}

// newVolume lays a fresh volume out in mem (zeroed, at least l.Size()
// bytes, 8-byte aligned).
func newVolume(l Layout, mem []byte) *Volume {
	clear(mem[:l.Size()])
	l.geo().PutHeader(mem)
	return &Volume{l: l, g: l.geo(), mem: mem[:l.Size()]}
}

// Layout returns the volume's layout. It cannot fail.
func (v *Volume) Layout() Layout { return v.l }

func (v *Volume) word(off int) *uint64 {
	return (*uint64)(unsafe.Pointer(&v.mem[off]))
}

func (v *Volume) elem(i int) uint64       { return atomic.LoadUint64(v.word(v.g.CellOff(i))) }
func (v *Volume) next(i int) uint64       { return atomic.LoadUint64(v.word(v.g.CellOff(i) + 8)) }
func (v *Volume) setElem(i int, e uint64) { atomic.StoreUint64(v.word(v.g.CellOff(i)), e) }
func (v *Volume) setNext(i int, n uint64) { atomic.StoreUint64(v.word(v.g.CellOff(i)+8), n) }

// HeapUsed returns how many overflow cells are taken (the next-free
// counter, which RMA sources may push past Heap when it is full: the
// result is at most Heap). It cannot fail.
func (v *Volume) HeapUsed() int {
	return int(min(atomic.LoadUint64(v.word(v.g.NextFreeOff())), uint64(v.l.Heap)))
}

// insert is the paper's local_insert (Listing 3): the element goes into
// its bucket's cell if that is empty, else into the next free heap cell,
// which is linked behind the bucket's newest chain cell (lastPtr). One
// writer only. ErrFull when the heap has no free cell.
func (v *Volume) insert(e uint64) error {
	key, _ := layout.Split(e)
	pos := v.g.Bucket(key)
	if v.elem(pos) == 0 {
		v.setElem(pos, e)
		return nil
	}
	nf := v.word(v.g.NextFreeOff())
	free := atomic.LoadUint64(nf)
	if free >= uint64(v.l.Heap) {
		return fmt.Errorf("%w: key %d collided in bucket %d and all %d heap cells are taken", ErrFull, key, pos, v.l.Heap)
	}
	atomic.StoreUint64(nf, free+1)
	c := uint64(v.l.Buckets) + free
	v.setElem(int(c), e)
	last := v.word(v.g.LastOff(pos))
	prev := atomic.LoadUint64(last)
	atomic.StoreUint64(last, c)
	if prev == 0 {
		v.setNext(pos, c)
	} else {
		v.setNext(int(prev), c)
	}
	return nil
}

// remove tombstones the first cell of key's chain that holds key.
func (v *Volume) remove(key uint32) bool {
	found := false
	v.walk(v.g.Bucket(key), func(i int, e uint64) bool {
		if k, _ := layout.Split(e); k == key && e != layout.Tombstone {
			v.setElem(i, layout.Tombstone)
			found = true
			return false
		}
		return true
	})
	return found
}

// walk visits bucket b's cell and its chain until f returns false; it
// stops at a link that leaves the heap or loops (a corrupt volume) and
// returns false then.
func (v *Volume) walk(b int, f func(i int, e uint64) bool) bool {
	i := b
	for steps := 0; ; steps++ {
		if !f(i, v.elem(i)) {
			return true
		}
		n := v.next(i)
		if n == 0 {
			return true
		}
		if n < uint64(v.l.Buckets) || n >= uint64(v.l.Buckets+v.l.Heap) || steps > v.l.Heap {
			return false
		}
		i = int(n)
	}
}

// Lookup returns key's value as the target sees it, and whether key is
// there (key 0 never is). It cannot fail: a chain that leaves the heap or
// loops ends the search (Contents reports it).
func (v *Volume) Lookup(key uint32) (uint32, bool) {
	var val uint32
	ok := false
	v.walk(v.g.Bucket(key), func(_ int, e uint64) bool {
		if k, x := layout.Split(e); k == key && e != layout.Tombstone {
			val, ok = x, true
			return false
		}
		return true
	})
	return val, ok
}

// Contents walks every bucket's chain and returns how often each key was
// found with each value (deleted elements are not counted), and checks
// the volume's structure: every element in a taken cell is reachable from
// its own bucket exactly once, no chain is broken or loops. Use it when
// no source is active. Its error (a dht error of no sentinel) describes
// the first fault found; the counts are then those found so far.
func (v *Volume) Contents() (map[Pair]int, error) {
	seen := map[Pair]int{}
	misplaced := 0
	reached := make([]bool, v.l.Buckets+v.l.Heap)
	for b := 0; b < v.l.Buckets; b++ {
		twice := false
		ok := v.walk(b, func(i int, e uint64) bool {
			if reached[i] {
				twice = true
				return false
			}
			reached[i] = true
			if e == 0 || e == layout.Tombstone {
				return true
			}
			k, x := layout.Split(e)
			if v.g.Bucket(k) != b {
				misplaced++ // an error below
			}
			seen[Pair{k, x}]++
			return true
		})
		if !ok || twice {
			return seen, fmt.Errorf("dht: bucket %d: chain leaves the heap, loops or joins another", b)
		}
	}
	if misplaced > 0 {
		return seen, fmt.Errorf("dht: %d elements in a chain their key does not hash to", misplaced)
	}
	for i := v.l.Buckets; i < v.l.Buckets+v.HeapUsed(); i++ {
		if e := v.elem(i); e != 0 && !reached[i] {
			return seen, fmt.Errorf("dht: heap cell %d holds key %d but no chain reaches it", i, e>>32)
		}
	}
	return seen, nil
}

// cellReader fetches the 16-byte cell i of a remote volume into b.
type cellReader func(ctx context.Context, i int, b []byte) error

// findRemote walks key's chain with remote reads: the cell that holds
// key, its element, and whether it was found. Each step is one RDMA READ
// (the paper's lookup: a plain get, then the overflow chain).
func findRemote(ctx context.Context, l layout.Layout, read cellReader, key uint32) (int, uint64, bool, error) {
	var b [cellSize]byte
	i := l.Bucket(key)
	for steps := 0; steps <= l.Heap; steps++ {
		if err := read(ctx, i, b[:]); err != nil {
			return 0, 0, false, err
		}
		e, n := binary.LittleEndian.Uint64(b[:]), binary.LittleEndian.Uint64(b[8:])
		if k, _ := layout.Split(e); k == key && e != layout.Tombstone {
			return i, e, true, nil
		}
		if n == 0 {
			return 0, 0, false, nil
		}
		if n < uint64(l.Buckets) || n >= uint64(l.Buckets+l.Heap) {
			return 0, 0, false, fmt.Errorf("%w: chain of key %d leaves the heap (cell %d)", ErrProtocol, key, n)
		}
		i = int(n)
	}
	return 0, 0, false, fmt.Errorf("%w: chain of key %d loops", ErrProtocol, key)
}
