package checkpoint

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's soft-dirty tracking (Documentation/admin-guide/mm/soft-dirty.rst):
// writing "4" to /proc/self/clear_refs clears the soft-dirty bit of every
// page of the process and write-protects them; the next store to a page
// sets its bit again, and bit 55 of the page's /proc/self/pagemap entry
// shows it. Clearing is process-wide, so every live Tracker's bits are
// harvested into its own set before each clear (softDirty.mu).

const softDirtyBit = 1 << 55

var softDirty struct {
	mu       sync.Mutex
	trackers map[*Tracker]struct{}
	probed   bool
	probeErr error
}

// harvestAndClear adds the soft-dirty pages of every live tracker to its
// local set, then clears the bits of the whole process. A store between a
// tracker's harvest and the clear is missed; Checkpoint's callers pause
// their local writers.
func harvestAndClear() error {
	softDirty.mu.Lock()
	defer softDirty.mu.Unlock()
	return harvestAndClearLocked()
}

func harvestAndClearLocked() error {
	for t := range softDirty.trackers {
		bits, err := readSoftDirty(t.region)
		if err != nil {
			return err
		}
		t.mu.Lock()
		for i, d := range bits {
			if d {
				t.local[i] = true
			}
		}
		t.mu.Unlock()
	}
	return clearSoftDirty()
}

// readSoftDirty returns the soft-dirty bit of each page of mem (which
// starts on a page boundary).
func readSoftDirty(mem []byte) ([]bool, error) {
	n := len(mem) / Page
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 8*n)
	at := int64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))) / Page * 8)
	if _, err := f.ReadAt(buf, at); err != nil {
		return nil, fmt.Errorf("checkpoint: reading /proc/self/pagemap: %w", err)
	}
	out := make([]bool, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(buf[8*i:])&softDirtyBit != 0
	}
	return out, nil
}

func clearSoftDirty() error {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("4"), 0); err != nil {
		return fmt.Errorf("checkpoint: clearing soft-dirty bits: %w", err)
	}
	return nil
}

// probeLocked checks once that this kernel tracks soft-dirty pages: a page
// is clean after a clear and dirty after a store. softDirty.mu held.
func probeLocked() error {
	if softDirty.probed {
		return softDirty.probeErr
	}
	softDirty.probed = true
	softDirty.probeErr = probe()
	return softDirty.probeErr
}

// probe tries a few times: a page reads as soft-dirty after a clear also
// when another thread's new mapping was merged with its VMA in between
// (the merged VMA is marked soft-dirty as a whole), which the Go runtime,
// growing its heap, can do at any moment. Seen once in the lab.
func probe() error {
	var err error
	for range 5 {
		if err = probeOnce(); err == nil {
			return nil
		}
	}
	return err
}

func probeOnce() error {
	mem, err := unix.Mmap(-1, 0, Page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer unix.Munmap(mem)
	mem[0] = 1
	if err := harvestAndClearLocked(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	before, err := readSoftDirty(mem)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	mem[0] = 2
	after, err := readSoftDirty(mem)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	if before[0] || !after[0] {
		return fmt.Errorf("%w: soft-dirty bit %v after a clear, %v after a store (kernel without CONFIG_MEM_SOFT_DIRTY?)", ErrNotSupported, before[0], after[0])
	}
	return nil
}
