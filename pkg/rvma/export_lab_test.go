//go:build lab

package rvma

import (
	"flag"
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// countingFlag selects who counts in the lab tests that listen through
// labListen and guestListen: the suites run them once with the module
// counting and once with the library counting.
var countingFlag = flag.String("rvma.counting", "module", "who counts puts in the endpoint tests: module, library or auto")

// LabCounting is the Counting the lab tests use (-rvma.counting).
func LabCounting() Counting {
	switch *countingFlag {
	case "module":
		return CountModule
	case "library":
		return CountLibrary
	case "auto":
		return CountAuto
	}
	panic(fmt.Sprintf("-rvma.counting=%q: want module, library or auto", *countingFlag))
}

// WithLabCounting returns opts (or new Options) with Counting set from
// -rvma.counting unless the test chose one.
func WithLabCounting(opts *EndpointOptions) *EndpointOptions {
	var o EndpointOptions
	if opts != nil {
		o = *opts
	}
	if o.Counting == CountAuto {
		o.Counting = LabCounting()
	}
	return &o
}

// BounceLent is how many bounce chunks ep has lent and not got back, and
// how many it has in all (0 before the first put from Go memory).
func BounceLent(ep *Endpoint) (lent, all int) { return ep.e.bounce.lent() }

// BounceMax is the most bounce chunks an endpoint registers.
const BounceMax = bounceSlab * bounceMaxSlabs

// descRemote is what a sender needs to RDMA READ the entry of slot.
func (e *engine) descRemote(slot uint32) verbs.Remote {
	r := e.desc.mr.Remote()
	r.Addr += uint64(slot) * wire.EntrySize
	r.Len = wire.EntrySize
	return r
}
