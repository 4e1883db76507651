package verbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include "shim.h"
*/
import "C"

import "unsafe"

// cbytes copies b into a fresh C allocation (nil for an empty slice); the
// caller frees it with C.free.
func cbytes(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return C.CBytes(b)
}
