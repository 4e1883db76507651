package verbs

import (
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Buffer is memory outside the Go heap (an anonymous mmap) that the
// NIC may read and write. Bytes exposes it as a []byte; the slice must not
// be used after Close (the pages are unmapped and access faults).
//
// A Buffer is the parent of the memory regions registered over it: Close
// deregisters them first.
type Buffer struct {
	n   node
	mem []byte
}

var (
	bufMu   sync.Mutex
	buffers []*Buffer // sorted by address
)

// Alloc maps size bytes of zeroed, page-aligned private memory. It fails
// with ErrInvalid for size <= 0 and with an *OpError from mmap otherwise.
func Alloc(size int) (*Buffer, error) { return alloc(size, unix.MAP_PRIVATE) }

// AllocShared is Alloc with a shared anonymous mapping (MAP_SHARED). Use it
// for memory whose local writes are tracked with the kernel's soft-dirty
// bits while registered: the kernel never clears the soft-dirty bit of a
// pinned page in a private mapping, so registered private memory always
// looks written. Errors as for Alloc.
func AllocShared(size int) (*Buffer, error) { return alloc(size, unix.MAP_SHARED) }

func alloc(size, flags int) (*Buffer, error) {
	if size <= 0 {
		return nil, invalid("buffer size %d", size)
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|flags)
	if err != nil {
		return nil, &OpError{Op: "mmap", Err: err}
	}
	b := &Buffer{mem: mem}
	b.n.init("buffer", b.destroy)
	bufMu.Lock()
	i := sort.Search(len(buffers), func(i int) bool { return buffers[i].addr() > b.addr() })
	buffers = append(buffers, nil)
	copy(buffers[i+1:], buffers[i:])
	buffers[i] = b
	bufMu.Unlock()
	return b, nil
}

func (b *Buffer) addr() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b.mem))) }

func (b *Buffer) destroy() error {
	bufMu.Lock()
	for i, x := range buffers {
		if x == b {
			buffers = append(buffers[:i], buffers[i+1:]...)
			break
		}
	}
	bufMu.Unlock()
	err := unix.Munmap(b.mem)
	b.mem = nil
	if err != nil {
		return &OpError{Op: "munmap", Err: err}
	}
	return nil
}

// Bytes returns the whole buffer (nil after Close).
func (b *Buffer) Bytes() []byte {
	b.n.mu.RLock()
	defer b.n.mu.RUnlock()
	return b.mem
}

// Len returns the buffer size in bytes.
func (b *Buffer) Len() int { return len(b.Bytes()) }

// Addr returns the virtual address of the first byte, as used in SGEs.
func (b *Buffer) Addr() uint64 { return addrOf(b.Bytes()) }

// Close deregisters the memory regions over the buffer and unmaps it. It is
// idempotent.
func (b *Buffer) Close() error { return b.n.close() }

// bufferOf returns the live Buffer that contains all of mem, or nil.
func bufferOf(mem []byte) *Buffer {
	if len(mem) == 0 {
		return nil
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	end := start + uintptr(len(mem))
	bufMu.Lock()
	defer bufMu.Unlock()
	i := sort.Search(len(buffers), func(i int) bool { return buffers[i].addr() > start })
	if i == 0 {
		return nil
	}
	b := buffers[i-1]
	if end <= b.addr()+uintptr(len(b.mem)) {
		return b
	}
	return nil
}

// addrOf returns the virtual address of mem's first byte.
func addrOf(mem []byte) uint64 {
	if mem == nil {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
}
