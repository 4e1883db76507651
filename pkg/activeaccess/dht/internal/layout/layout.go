// Package layout is the layout of a DHT volume in a target's memory, the
// same for the three tables (docs/activeaccess.md, "Use case: distributed
// hash table"); RMA sources read and write it directly, so it is their
// wire format:
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
package layout

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Sizes, and the header's fields.
const (
	PageSize   = 4096               // the volume's parts start on pages
	CellSize   = 16                 // a cell: its element and the next cell's index
	magic      = 0x3154484441414d52 // "RMAADHT1"
	offMagic   = 0
	offBuckets = 8
	offHeap    = 16
	offNext    = 64
	offDelete  = PageSize
	offLast    = 2 * PageSize

	// HeaderLen is how much of page 0 a source reads.
	HeaderLen = 24

	// MaxCells bounds Buckets+Heap (the cell index travels in 32 bits).
	MaxCells = 1 << 26

	// Tombstone is the element of a deleted cell: key 0, value 1. A
	// deleted cell is never reused (the heap is a bump allocator).
	Tombstone = 1
)

// Layout sizes a volume: Buckets table cells and Heap overflow cells.
// (dht.Layout converts to it.)
type Layout struct {
	Buckets int
	Heap    int
}

// OK reports whether the layout can be built.
func (l Layout) OK() bool {
	return l.Buckets >= 1 && l.Heap >= 0 && l.Buckets+l.Heap <= MaxCells
}

func roundPage(n int) int { return (n + PageSize - 1) &^ (PageSize - 1) }

// cellsOff is where the cells start.
func (l Layout) cellsOff() int { return offLast + roundPage(8*l.Buckets) }

// Size is the bytes of memory the volume needs (whole pages).
func (l Layout) Size() int { return l.cellsOff() + roundPage(CellSize*(l.Buckets+l.Heap)) }

// CellOff is the offset of cell i's element.
func (l Layout) CellOff(i int) int { return l.cellsOff() + CellSize*i }

// LastOff is the offset of bucket b's lastPtr word.
func (l Layout) LastOff(b int) int { return offLast + 8*b }

// NextFreeOff is the offset of the heap's next-free counter.
func (l Layout) NextFreeOff() int { return offNext }

// DeleteOff is the offset of the delete page.
func (l Layout) DeleteOff() int { return offDelete }

// TableSpan is the page-aligned [off, off+n) that holds the cells.
func (l Layout) TableSpan() (off, n int) {
	return l.cellsOff(), roundPage(CellSize * (l.Buckets + l.Heap))
}

// Bucket is the table cell of key.
func (l Layout) Bucket(key uint32) int {
	return int((uint64(key) * 0x9e3779b97f4a7c15 >> 32) % uint64(l.Buckets))
}

// CellAt is the cell whose element is at offset off, if off is one.
func (l Layout) CellAt(off int) (int, bool) {
	d := off - l.cellsOff()
	if d < 0 || d%CellSize != 0 || d/CellSize >= l.Buckets+l.Heap {
		return 0, false
	}
	return d / CellSize, true
}

// Elem packs a key and its value into one 8-byte element.
func Elem(key, value uint32) uint64 { return uint64(key)<<32 | uint64(value) }

// Split is Elem's inverse.
func Split(e uint64) (key, value uint32) { return uint32(e >> 32), uint32(e) }

// PutHeader writes the header of l into mem (the target, before it
// serves).
func (l Layout) PutHeader(mem []byte) {
	binary.LittleEndian.PutUint64(mem[offMagic:], magic)
	binary.LittleEndian.PutUint64(mem[offBuckets:], uint64(l.Buckets))
	binary.LittleEndian.PutUint64(mem[offHeap:], uint64(l.Heap))
}

// ErrNoHeader: the bytes are no volume header, or one that does not fit
// the memory it describes.
var ErrNoHeader = errors.New("no DHT volume header at the target")

// ParseHeader reads a layout from the header a source fetched, checking
// it against the size of the memory it describes. Errors wrap
// ErrNoHeader.
func ParseHeader(b []byte, memSize int) (Layout, error) {
	if len(b) < HeaderLen || binary.LittleEndian.Uint64(b[offMagic:]) != magic {
		return Layout{}, ErrNoHeader
	}
	bk, hp := binary.LittleEndian.Uint64(b[offBuckets:]), binary.LittleEndian.Uint64(b[offHeap:])
	if bk > MaxCells || hp > MaxCells {
		return Layout{}, fmt.Errorf("%w: the header claims %d buckets and %d heap cells", ErrNoHeader, bk, hp)
	}
	l := Layout{Buckets: int(bk), Heap: int(hp)}
	if !l.OK() || l.Size() > memSize {
		return Layout{}, fmt.Errorf("%w: the header claims %d buckets and %d heap cells in %d bytes", ErrNoHeader, bk, hp, memSize)
	}
	return l, nil
}
