package dht

import (
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
)

// pageSize and cellSize are the volume's page and cell sizes.
const (
	pageSize = layout.PageSize
	cellSize = layout.CellSize
)

// MaxCells bounds Buckets+Heap of a Layout (a cell's index travels in 32
// bits).
const MaxCells = 1 << 26

// The internal layout's bound is MaxCells (a compile error otherwise).
const _ = uint(MaxCells-layout.MaxCells) + uint(layout.MaxCells-MaxCells)

// Layout sizes a volume: Buckets table cells and Heap overflow cells. A
// key goes into the cell of its bucket (Bucket); a key whose bucket is
// taken collides and goes into the heap, chained to its bucket. The
// target chooses the layout; sources read it from the target.
type Layout struct {
	Buckets int
	Heap    int
}

// geo is l's geometry: the offsets of its parts in the target's memory.
func (l Layout) geo() layout.Layout { return layout.Layout(l) }

// Check reports a layout that cannot be built: fewer than one bucket, a
// negative heap, or more than MaxCells cells in all (ErrInvalid).
func (l Layout) Check() error {
	if !l.geo().OK() {
		return fmt.Errorf("%w: layout of %d buckets and %d heap cells (1 to %d cells in all, at least one bucket)",
			ErrInvalid, l.Buckets, l.Heap, MaxCells)
	}
	return nil
}

// Size is the bytes of memory the volume needs (whole pages), for a
// layout that passes Check. It cannot fail.
func (l Layout) Size() int { return l.geo().Size() }

// Bucket is the table cell of key, for a layout with at least one
// bucket (it panics on a zero Layout, as a division by zero). Keys whose
// buckets are equal collide.
func (l Layout) Bucket(key uint32) int { return l.geo().Bucket(key) }

// parseHeader reads a layout from the header a source fetched, checking
// it against the size of the memory it describes.
func parseHeader(b []byte, memSize int) (Layout, error) {
	g, err := layout.ParseHeader(b, memSize)
	if err != nil {
		return Layout{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return Layout(g), nil
}

// checkKey refuses key 0.
func checkKey(key uint32) error {
	if key == 0 {
		return fmt.Errorf("%w: key 0 (keys are 1 to 2^32-1)", ErrInvalid)
	}
	return nil
}
