package jbmt

import (
	"fmt"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// Advise pins buf ahead of use into the module's pin cache, for this
// Service's transfers: use is Write when gets will write buf, Read when
// puts will read it (both: either). Transfers over buf that start where
// buf starts then find their local pages pinned (a transfer is cut into
// sections from its start, and the cache keeps a section's pages while
// its mapping is unchanged). It is a hint: it returns how many bytes from
// the start are cached, stopping without an error where the pin budget
// (or this process's share of it) is taken or the pin cache is off; it
// takes no pages from others. Errors wrap ErrInvalid (no or unknown use,
// an empty buf), ErrFault (pages not mapped; the count stops before
// them), ErrClosed, or the module's error.
func (s *Service) Advise(buf []byte, use Rights) (int, error) {
	if use == 0 || use&^(Read|Write) != 0 {
		return 0, fmt.Errorf("%w: use %#x", ErrInvalid, uint32(use))
	}
	if len(buf) == 0 {
		return 0, fmt.Errorf("%w: advise of an empty buffer", ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, fmt.Errorf("jbmt: advise: %w", ErrClosed)
	}
	n, err := s.dev.JBMTAdviseBuffer(uintptr(unsafe.Pointer(&buf[0])), uint64(len(buf)), uint32(use))
	return int(n), wrapTransfer("advise", err)
}

// Advise pins n bytes of the region from off ahead of use into the
// module's pin cache, for serving peers (writable if the region has
// Write). The range is cut into sections as a transfer from off cuts it
// when both its ends are page-aligned; peers' transfers cut the same way
// (from a page-aligned buffer to a page-aligned offset, the usual case
// for large ones) find their sections' pages pinned. A hint, as
// Service.Advise: it returns the bytes from off now cached. Errors wrap
// ErrInvalid (n < 1), ErrRange (outside the region), ErrFault, ErrClosed
// (the region or its Service closed), or the module's error.
func (r *Region) Advise(off uint64, n int) (int, error) {
	if n < 1 {
		return 0, fmt.Errorf("%w: advise of %d bytes at %d", ErrInvalid, n, off)
	}
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.closed {
		return 0, fmt.Errorf("jbmt: advise: %w", ErrClosed)
	}
	t := r.token
	done, err := s.dev.JBMTAdviseRegion(kmod.JBMTToken{ID: t.ID, Gen: t.Gen, Key: t.Key}, off, uint64(n))
	return int(done), wrapTransfer("advise", err)
}
