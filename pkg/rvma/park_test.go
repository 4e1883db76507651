package rvma

import (
	"context"
	"testing"
	"time"
)

// parkedEngine is an engine's progress alone: the state waitNoSpinner uses.
func parkedEngine() *progress {
	p := newProgress(false)
	return &p
}

// park runs waitNoSpinner in a goroutine and returns its result channel.
func park(ctx context.Context, e *progress) <-chan bool {
	out := make(chan bool, 1)
	go func() { out <- e.waitNoSpinner(ctx) }()
	return out
}

func expectResume(t *testing.T, res <-chan bool, want bool, what string) {
	t.Helper()
	select {
	case got := <-res:
		if got != want {
			t.Fatalf("%s: waitNoSpinner returned %v, want %v", what, got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the progress loop stayed parked", what)
	}
}

func expectParked(t *testing.T, res <-chan bool, what string) {
	t.Helper()
	select {
	case <-res:
		t.Fatalf("%s: the progress loop resumed while a goroutine spins", what)
	case <-time.After(3 * spinGrace):
	}
}

func TestParkNeverSpun(t *testing.T) {
	e := parkedEngine()
	expectResume(t, park(context.Background(), e), true, "no spin ever")
}

func TestParkWhileSpinning(t *testing.T) {
	e := parkedEngine()
	e.spinBegin()
	res := park(context.Background(), e)
	expectParked(t, res, "spinning")
	// A waiter does not end the park while someone spins (the spinner
	// makes progress), but the spin's end does, within the grace.
	e.waitBegin()
	expectParked(t, res, "spinning with a waiter")
	e.spinEnd()
	expectResume(t, res, true, "spin ended with a waiter")
	e.waitEnd()
}

func TestParkGraceThenResume(t *testing.T) {
	e := parkedEngine()
	e.spinBegin()
	e.spinEnd()
	// Within the grace after a spin the loop parks, and resumes by itself
	// once a nap finds no spin.
	expectResume(t, park(context.Background(), e), true, "grace over")
}

func TestParkKickedByWaiter(t *testing.T) {
	e := parkedEngine()
	e.spinBegin()
	res := park(context.Background(), e)
	expectParked(t, res, "spinning")
	// A goroutine that blocks on the engine after the last spin ended
	// kicks the parked loop (waitBegin), which then resumes although the
	// spin ended less than spinGrace ago.
	e.spinEnd()
	for !e.parked.Load() {
		time.Sleep(time.Millisecond)
	}
	e.waitBegin()
	defer e.waitEnd()
	expectResume(t, res, true, "kicked")
}

func TestParkContextEnds(t *testing.T) {
	e := parkedEngine()
	e.spinBegin()
	defer e.spinEnd()
	ctx, cancel := context.WithCancel(context.Background())
	res := park(ctx, e)
	expectParked(t, res, "spinning")
	cancel()
	expectResume(t, res, false, "context ended")
}

// fakeSpinner counts what spin calls; its pollOnce closes done after
// polls calls.
type fakeSpinner struct {
	polls, spinning, yields int
	closeAfter              int
	done                    chan struct{}
}

func (f *fakeSpinner) pollOnce() bool {
	f.polls++
	if f.polls == f.closeAfter {
		close(f.done)
	}
	return f.polls%3 == 0
}
func (f *fakeSpinner) spinBegin() { f.spinning++ }
func (f *fakeSpinner) spinEnd()   { f.spinning-- }
func (f *fakeSpinner) yield()     { f.yields++ }

func TestSpin(t *testing.T) {
	f := &fakeSpinner{closeAfter: 1000, done: make(chan struct{})}
	if err := spin(context.Background(), f, f.done); err != nil {
		t.Fatal(err)
	}
	if f.polls != 1000 || f.spinning != 0 || f.yields == 0 {
		t.Fatalf("after the spin: %+v", f)
	}
	// Closed already: no poll at all.
	f = &fakeSpinner{done: make(chan struct{})}
	close(f.done)
	if err := spin(context.Background(), f, f.done); err != nil || f.polls != 0 || f.spinning != 0 {
		t.Fatalf("done before the spin: %+v %v", f, err)
	}
	// A context that ends stops the spin with its error.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	f = &fakeSpinner{done: make(chan struct{})}
	if err := spin(ctx, f, f.done); err != context.DeadlineExceeded || f.spinning != 0 {
		t.Fatalf("context ended: %+v %v", f, err)
	}
}
