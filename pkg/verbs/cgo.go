package verbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#cgo noescape shim_post_send
#cgo nocallback shim_post_send
#cgo noescape shim_post_recv
#cgo nocallback shim_post_recv
#cgo noescape shim_post_srq_recv
#cgo nocallback shim_post_srq_recv
#include "shim.h"
*/
import "C"

import "unsafe"

// handle passes a C object's pointer to a data-path helper of shim.h as
// an integer, so that cgo has no Go-pointer check to make on each call.
func handle[T any](p *T) C.uintptr_t { return C.uintptr_t(uintptr(unsafe.Pointer(p))) }

// cbytes copies b into a fresh C allocation (nil for an empty slice); the
// caller frees it with C.free.
func cbytes(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return C.CBytes(b)
}
