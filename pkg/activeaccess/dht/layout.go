package dht

import (
	"encoding/binary"
	"fmt"
)

// The layout of a volume in the target's memory, the same for the three
// tables (docs/activeaccess.md, "Use case: distributed hash table"):
//
//	page 0   header: magic, Buckets, Heap (offset 0, 8, 16), the heap's
//	         next free cell (offset 64, the counter RMA sources fetch-and-add)
//	page 1   the delete page (AA: active puts of keys to delete)
//	page 2.. lastPtr[Buckets]: the newest heap cell of each bucket's chain
//	then     cells[Buckets+Heap]: the table, then the overflow heap
//
// A cell is 16 bytes: the element (key<<32 | value; 0 = empty,
// Tombstone = deleted) and the index of the next cell of the bucket's
// chain (0 = none: a chain only ever points into the heap).
const (
	pageSize   = 4096
	cellSize   = 16
	magic      = 0x3154484441414d52 // "RMAADHT1"
	offMagic   = 0
	offBuckets = 8
	offHeap    = 16
	offNext    = 64
	offDelete  = pageSize
	offLast    = 2 * pageSize

	// MaxCells bounds Buckets+Heap (the cell index travels in 32 bits).
	MaxCells = 1 << 26
)

// Tombstone is the element of a deleted cell: key 0, value 1. A deleted
// cell is never reused (the heap is a bump allocator, as in the paper).
const Tombstone = 1

// Layout sizes a volume: Buckets table cells and Heap overflow cells.
type Layout struct {
	Buckets int
	Heap    int
}

// Check reports a layout that cannot be built (ErrInvalid).
func (l Layout) Check() error {
	if l.Buckets < 1 || l.Heap < 0 || l.Buckets+l.Heap > MaxCells {
		return fmt.Errorf("%w: layout of %d buckets and %d heap cells (1 to %d cells in all, at least one bucket)",
			ErrInvalid, l.Buckets, l.Heap, MaxCells)
	}
	return nil
}

func roundPage(n int) int { return (n + pageSize - 1) &^ (pageSize - 1) }

// cellsOff is where the cells start.
func (l Layout) cellsOff() int { return offLast + roundPage(8*l.Buckets) }

// Size is the bytes of memory the volume needs (whole pages).
func (l Layout) Size() int { return l.cellsOff() + roundPage(cellSize*(l.Buckets+l.Heap)) }

// CellOff is the offset of cell i's element.
func (l Layout) CellOff(i int) int { return l.cellsOff() + cellSize*i }

// LastOff is the offset of bucket b's lastPtr word.
func (l Layout) LastOff(b int) int { return offLast + 8*b }

// NextFreeOff is the offset of the heap's next-free counter.
func (l Layout) NextFreeOff() int { return offNext }

// DeleteOff is the offset of the delete page.
func (l Layout) DeleteOff() int { return offDelete }

// TableSpan is the page-aligned [off, off+n) that holds the cells.
func (l Layout) TableSpan() (off, n int) {
	return l.cellsOff(), roundPage(cellSize * (l.Buckets + l.Heap))
}

// Bucket is the table cell of key.
func (l Layout) Bucket(key uint32) int {
	return int((uint64(key) * 0x9e3779b97f4a7c15 >> 32) % uint64(l.Buckets))
}

// cellAt is the cell whose element is at offset off, if off is one.
func (l Layout) cellAt(off int) (int, bool) {
	d := off - l.cellsOff()
	if d < 0 || d%cellSize != 0 || d/cellSize >= l.Buckets+l.Heap {
		return 0, false
	}
	return d / cellSize, true
}

// Elem packs a key and its value into one 8-byte element. Key 0 is not
// a key (ErrInvalid from every table).
func Elem(key, value uint32) uint64 { return uint64(key)<<32 | uint64(value) }

// Split is Elem's inverse.
func Split(e uint64) (key, value uint32) { return uint32(e >> 32), uint32(e) }

// putHeader writes the header of l into mem (the target, before it serves).
func (l Layout) putHeader(mem []byte) {
	binary.LittleEndian.PutUint64(mem[offMagic:], magic)
	binary.LittleEndian.PutUint64(mem[offBuckets:], uint64(l.Buckets))
	binary.LittleEndian.PutUint64(mem[offHeap:], uint64(l.Heap))
}

// parseHeader reads a layout from the header a source fetched, checking
// it against the size of the memory it describes.
func parseHeader(b []byte, memSize int) (Layout, error) {
	if len(b) < 24 || binary.LittleEndian.Uint64(b[offMagic:]) != magic {
		return Layout{}, fmt.Errorf("%w: no DHT volume header at the target", ErrProtocol)
	}
	bk, hp := binary.LittleEndian.Uint64(b[offBuckets:]), binary.LittleEndian.Uint64(b[offHeap:])
	if bk > MaxCells || hp > MaxCells {
		return Layout{}, fmt.Errorf("%w: volume header claims %d buckets and %d heap cells", ErrProtocol, bk, hp)
	}
	l := Layout{Buckets: int(bk), Heap: int(hp)}
	if err := l.Check(); err != nil || l.Size() > memSize {
		return Layout{}, fmt.Errorf("%w: volume header claims %d buckets and %d heap cells in %d bytes", ErrProtocol, bk, hp, memSize)
	}
	return l, nil
}

// headerLen is how much of page 0 a source reads.
const headerLen = 24
