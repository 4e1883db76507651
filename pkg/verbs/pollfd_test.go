package verbs

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newTestPollFD returns a pollFD on the read end of a pipe (standing in
// for a library's event descriptor), that read end (which the library
// would read) and the write end.
func newTestPollFD(t *testing.T) (*pollFD, int, int) {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	p, err := newPollFD(fds[0], "test pipe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.close() })
	return p, fds[0], fds[1]
}

// readOne is a try function: one byte from fd, or errAgain.
func readOne(fd int) func() error {
	return func() error {
		var b [1]byte
		_, err := unix.Read(fd, b[:])
		if err == unix.EAGAIN {
			return errAgain
		}
		return err
	}
}

func TestPollFDWaitsForData(t *testing.T) {
	p, r, w := newTestPollFD(t)
	done := make(chan error, 1)
	go func() { done <- p.wait(context.Background(), readOne(r)) }()
	select {
	case err := <-done:
		t.Fatalf("wait returned %v before there was data", err)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := unix.Write(w, []byte{1}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return after a write")
	}
	// Data already there: no parking at all.
	unix.Write(w, []byte{2})
	if err := p.wait(context.Background(), readOne(r)); err != nil {
		t.Fatal(err)
	}
}

func TestPollFDContext(t *testing.T) {
	p, r, w := newTestPollFD(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := p.wait(ctx, readOne(r)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with an expiring context: %v", err)
	}
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := p.wait(cancelled, readOne(r)); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a cancelled context: %v", err)
	}
	// The deadline an earlier context set does not linger.
	unix.Write(w, []byte{1})
	if err := p.wait(context.Background(), readOne(r)); err != nil {
		t.Fatalf("wait after a cancelled one: %v", err)
	}
}

func TestPollFDCloseWakesWaiter(t *testing.T) {
	p, r, _ := newTestPollFD(t)
	done := make(chan error, 1)
	go func() { done <- p.wait(context.Background(), readOne(r)) }()
	time.Sleep(20 * time.Millisecond)
	p.close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("wait during close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not wake the waiter")
	}
	if err := p.wait(context.Background(), readOne(r)); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait after close: %v, want ErrClosed", err)
	}
}

func TestPollFDTryError(t *testing.T) {
	p, _, w := newTestPollFD(t)
	unix.Write(w, []byte{1})
	boom := errors.New("boom")
	if err := p.wait(context.Background(), func() error { return boom }); err != boom {
		t.Fatalf("wait = %v, want try's error", err)
	}
}
