package verbs

import (
	"runtime"
	"sync/atomic"
	"time"
)

// YieldEvery is how long a busy-polling goroutine runs before it passes
// through the scheduler once (runtime.Gosched). It is below the runtime's
// 10 ms preemption period, so the runtime never finds the poller running
// on one scheduling tick for 10 ms, which inside a cgo call costs its P
// (see CQ.Spin). It is not shorter because every runtime.Gosched wakes a
// thread for an idle P if there is one: on a one-CPU machine with
// GOMAXPROCS 2 that thread takes the CPU from the poller each time.
const YieldEvery = 5 * time.Millisecond

// A Yielder applies CQ.Spin's yield rule to a goroutine that busy-polls by
// itself (on the last byte of a buffer, as perftest's ib_write_lat does, or
// on an RVMA completion pointer): call Maybe every few polls. The zero
// value is ready; a Yielder may be shared by goroutines that take turns
// spinning (it remembers the last yield of any of them).
type Yielder struct {
	last atomic.Int64 // ns since yieldBase
}

// Maybe calls runtime.Gosched if no goroutine sharing y yielded within
// YieldEvery, and reports whether it did.
func (y *Yielder) Maybe() bool {
	now := int64(time.Since(yieldBase))
	if now-y.last.Load() < int64(YieldEvery) {
		return false
	}
	y.last.Store(now)
	runtime.Gosched()
	return true
}

// yieldBase is the base of Yielder's monotonic clock.
var yieldBase = time.Now()
