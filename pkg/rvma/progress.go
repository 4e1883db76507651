package rvma

import (
	"context"
	"runtime"
)

// progressSpinner lets a goroutine run the driver's progress itself while
// it busy-waits (spin).
type progressSpinner interface {
	// pollOnce runs one non-blocking progress step (completions handled
	// on the caller's goroutine) and reports whether it found any.
	pollOnce() bool
	// spinBegin and spinEnd bracket a goroutine that runs pollOnce in a
	// loop; meanwhile the driver's own loop stays parked.
	spinBegin()
	spinEnd()
	// yield lets a spinner pass through the scheduler as often as the
	// runtime needs (verbs.Yielder); call it every few polls.
	yield()
}

// spin busy-waits until done is closed, running ps's progress step on the
// calling goroutine meanwhile; it returns ctx's error if ctx ends first.
func spin(ctx context.Context, ps progressSpinner, done <-chan struct{}) error {
	ps.spinBegin()
	defer ps.spinEnd()
	// With one P, other goroutines of the endpoint (a put waiting for its
	// view) run only when this one yields, and a yield is cheap; with more,
	// they run elsewhere and a yield wakes a thread for an idle P, so it
	// happens only as often as the runtime needs (verbs.Yielder).
	oneP := runtime.GOMAXPROCS(0) == 1
	for n := 1; ; n++ {
		select {
		case <-done:
			return nil
		default:
		}
		if ps.pollOnce() {
			continue
		}
		if err := spinIdle(ctx, ps, n, oneP); err != nil {
			return err
		}
	}
}

// spinIdle ends round n of a spinner that found nothing: every 256th
// round it checks ctx (returning its error) and, with one P, lets the
// endpoint's goroutines run; every 16th it yields as the runtime needs.
func spinIdle(ctx context.Context, ps progressSpinner, n int, oneP bool) error {
	if n%256 == 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		if oneP {
			runtime.Gosched()
		}
	}
	if n%16 == 0 {
		ps.yield()
	}
	return nil
}

// progressWaiter is told when a goroutine blocks until the driver's
// progress closes a channel (waitBegin) and when it stops (waitEnd): the
// driver's loop must not stay parked meanwhile.
type progressWaiter interface {
	waitBegin()
	waitEnd()
}

// progressDriver runs progress on the caller's goroutine and is told of
// goroutines that block on it.
type progressDriver interface {
	progressSpinner
	progressWaiter
}

// awaitPolls bounds the progress steps await runs itself before it blocks.
const awaitPolls = 4

// await blocks until done is closed or ctx ends (then ctx's error),
// keeping pd's progress loop awake while it waits. It first runs what
// progress the completion queue holds on the caller's goroutine: the
// completion waited for is often there already (a put's, when the answer
// to it was seen in memory first), and handling it here spares a switch
// to the progress loop and back.
func await(ctx context.Context, pd progressDriver, done <-chan struct{}) error {
	for i := 0; ; i++ {
		select {
		case <-done:
			return nil
		default:
		}
		if i == awaitPolls || !pd.pollOnce() {
			break
		}
	}
	pd.waitBegin()
	defer pd.waitEnd()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
