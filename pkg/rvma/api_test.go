package rvma

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// fakeDriver queues binds and unbinds; run carries them out, as the
// endpoint's loopback QP completions would.
type fakeDriver struct {
	mu      sync.Mutex
	ops     []func()
	key     uint32
	entries []Entry
	reject  []byte
}

func (d *fakeDriver) addrOf(mem []byte) (uint64, error) {
	if d.reject != nil && &mem[0] == &d.reject[0] {
		return 0, invalidf("memory not allocated by the endpoint")
	}
	return heapAddr(mem), nil
}

func (d *fakeDriver) push(f func()) {
	d.mu.Lock()
	d.ops = append(d.ops, f)
	d.mu.Unlock()
}

func (d *fakeDriver) bind(w *Window, b *buffer) {
	d.push(func() {
		d.mu.Lock()
		d.key++
		k := d.key
		d.mu.Unlock()
		w.bound(b, Desc{Addr: b.addr, RKey: k})
	})
}

func (d *fakeDriver) unbind(w *Window, b *buffer) { d.push(func() { w.unbound(b) }) }

func (d *fakeDriver) entryChanged(w *Window, e Entry) {
	d.mu.Lock()
	d.entries = append(d.entries, e)
	d.mu.Unlock()
}

func (d *fakeDriver) pollOnce() bool {
	d.mu.Lock()
	if len(d.ops) == 0 {
		d.mu.Unlock()
		return false
	}
	f := d.ops[0]
	d.ops = d.ops[1:]
	d.mu.Unlock()
	f()
	return true
}

func (d *fakeDriver) run() {
	for {
		d.mu.Lock()
		if len(d.ops) == 0 {
			d.mu.Unlock()
			return
		}
		f := d.ops[0]
		d.ops = d.ops[1:]
		d.mu.Unlock()
		f()
	}
}

func (d *fakeDriver) last() Entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.entries[len(d.entries)-1]
}

func newTestWindow(t *testing.T, o WindowOptions) (*Window, *fakeDriver) {
	t.Helper()
	d := &fakeDriver{}
	w, err := newWindow(0x11FF0011, 3, 1, o, d)
	if err != nil {
		t.Fatal(err)
	}
	return w, d
}

func TestWindowAPI(t *testing.T) {
	w, d := newTestWindow(t, WindowOptions{Keep: 1})
	mem := make([]byte, 256)
	p, err := w.Post(mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := d.last(); e.NDesc != 0 {
		t.Fatalf("entry advertises a buffer before its bind completed: %+v", e)
	}
	d.run()
	e := d.last()
	if e.NDesc != 1 || e.Descs[0].Addr != heapAddr(mem) || e.Descs[0].Len != 256 || e.Mailbox != 0x11FF0011 || e.Incarnation != 1 {
		t.Fatalf("entry %+v", e)
	}
	buf := make([]byte, EntrySize)
	if err := MarshalEntry(buf, &e); err != nil {
		t.Fatalf("pushed entry does not marshal: %v", err)
	}
	if _, ok := p.Load(); ok {
		t.Fatal("record before completion")
	}
	if p.Completion().Addr()%CompletionSize != 0 {
		t.Fatal("completion pointer not cache-line aligned")
	}
	w.arrive(GenLow(0), 200)
	w.arrive(GenLow(0), 56)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	if _, err := p.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait before the unbind completed: %v", err)
	}
	cancel()
	rec, err := p.Spin(context.Background()) // runs the pending unbind itself
	want := Record{Epoch: 0, Addr: heapAddr(mem), Len: 256, Ops: 2, Cap: 256}
	if err != nil || rec != want {
		t.Fatalf("%+v %v", rec, err)
	}
	if r, ok := p.Load(); !ok || r != want {
		t.Fatal("Load")
	}
	if r, ok := p.Completion().Load(); !ok || r != want {
		t.Fatal("completion pointer")
	}
	if w.Epoch() != 1 || p.Epoch() != 0 {
		t.Fatalf("epoch %d", w.Epoch())
	}
	// Released while in the rewind ring: kept; a second epoch pushes it out
	// and it is re-posted, and Wait then refers to its new epoch.
	if err := p.Release(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("double release: %v", err)
	}
	q, _ := w.Post(make([]byte, 64), &PostOptions{OneTime: true})
	d.run()
	w.arrive(GenLow(1), 64)
	d.run()
	if r, err := q.Wait(context.Background()); err != nil || r.Flags != FlagOneTime {
		t.Fatalf("%+v %v", r, err)
	}
	d.run()
	if p.Epoch() != 2 {
		t.Fatalf("re-posted buffer holds epoch %d, want 2", p.Epoch())
	}
	if _, ok := p.Load(); ok {
		t.Fatal("re-posted buffer reports its old record as its own")
	}
	if r, _ := p.Completion().Load(); r.Epoch != 0 {
		t.Fatal("the completion pointer keeps the last record until the next one")
	}
	w.arrive(GenLow(2), 256)
	d.run()
	if r, err := p.Wait(context.Background()); err != nil || r.Epoch != 2 {
		t.Fatalf("%+v %v", r, err)
	}
	if rw := w.Rewind(3); len(rw) != 1 || rw[0].Epoch != 2 {
		t.Fatalf("rewind %+v", rw)
	}
	if s := w.Stats(); s.EpochsCompleted != 3 || s.Held != 2 || s.Posted != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestWindowAPIIncEpochAndClose(t *testing.T) {
	w, d := newTestWindow(t, WindowOptions{CloseMode: CloseSilent})
	if _, err := w.IncEpoch(context.Background()); !errors.Is(err, ErrNoBuffer) {
		t.Fatal(err)
	}
	p, _ := w.Post(make([]byte, 100), nil)
	p2, _ := w.Post(make([]byte, 100), nil)
	d.run()
	w.arrive(0, 42)
	res := make(chan error, 1)
	var rec Record
	go func() {
		var err error
		rec, err = w.IncEpoch(context.Background())
		res <- err
	}()
	time.Sleep(10 * time.Millisecond)
	select {
	case err := <-res:
		t.Fatalf("IncEpoch returned before the unbind: %v", err)
	default:
	}
	for len(res) == 0 {
		d.run()
		time.Sleep(time.Millisecond)
	}
	if err := <-res; err != nil || rec.Len != 42 || rec.Flags != FlagPartial || rec.Epoch != 0 {
		t.Fatalf("%+v", rec)
	}
	if r, _ := p.Wait(context.Background()); r != rec {
		t.Fatal("Wait and IncEpoch disagree")
	}
	waitErr := make(chan error, 1)
	go func() { _, err := p2.Wait(context.Background()); waitErr <- err }()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal("second Close")
	}
	d.run()
	if err := <-waitErr; !errors.Is(err, ErrClosed) {
		t.Fatalf("wait across Close: %v", err)
	}
	if e := d.last(); e.State != StateClosedSilent {
		t.Fatalf("entry after close %+v", e)
	}
	if _, err := w.Post(make([]byte, 8), nil); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if _, err := w.IncEpoch(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	w.knock(KnockDrop)
	if r := w.arrive(1, 5); r != arriveClosed || w.Stats().Drops != 1 {
		t.Fatal("closed arrivals")
	}
}

func TestWindowAPIErrors(t *testing.T) {
	w, d := newTestWindow(t, WindowOptions{Threshold: 500})
	d.reject = make([]byte, 10)
	if _, err := w.Post(d.reject, nil); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if _, err := w.Post(nil, nil); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if _, err := w.Post(make([]byte, 100), nil); !errors.Is(err, ErrTooLarge) {
		t.Fatal(err)
	}
	if _, err := newWindow(1, 0, 0, WindowOptions{Kind: EpochOps}, d); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

// Puts, binds, unbinds and waiters on many goroutines (run with -race).
func TestWindowAPIConcurrent(t *testing.T) {
	w, d := newTestWindow(t, WindowOptions{Kind: EpochOps, Threshold: 4, Keep: 2})
	stop := make(chan struct{})
	var drv sync.WaitGroup
	drv.Add(1)
	go func() {
		defer drv.Done()
		for {
			select {
			case <-stop:
				d.run()
				return
			default:
				d.run()
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	const epochs = 50
	var posted []*Posted
	for i := 0; i < 4; i++ {
		p, err := w.Post(make([]byte, 64), nil)
		if err != nil {
			t.Fatal(err)
		}
		posted = append(posted, p)
	}
	var wg sync.WaitGroup
	for _, p := range posted {
		wg.Add(1)
		go func(p *Posted) {
			defer wg.Done()
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := p.Wait(ctx)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				if r.Ops != 4 {
					t.Errorf("record %+v", r)
				}
				done := r.Epoch >= epochs-4
				if err := p.Release(); err != nil {
					t.Error(err)
					return
				}
				if done {
					return
				}
			}
		}(p)
	}
	// The "progress loop": arrivals for the head epoch, as a single goroutine.
	for e := uint64(0); e < epochs; e++ {
		for w.Epoch() < e || func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.st.lookup(e) == nil || !w.st.lookup(e).bound }() {
			time.Sleep(20 * time.Microsecond)
		}
		for i := 0; i < 4; i++ {
			if r := w.arrive(GenLow(e), 16); r != arriveCounted {
				t.Fatalf("epoch %d: %v", e, r)
			}
		}
	}
	wg.Wait()
	close(stop)
	drv.Wait()
	if s := w.Stats(); s.EpochsCompleted != epochs || s.Puts != 4*epochs {
		t.Fatalf("stats %+v", s)
	}
}

func TestWindowAPIWaitAfterRelease(t *testing.T) {
	w, d := newTestWindow(t, WindowOptions{Keep: 3})
	once, _ := w.Post(make([]byte, 8), &PostOptions{OneTime: true})
	p, _ := w.Post(make([]byte, 8), nil)
	d.run()
	w.arrive(0, 8)
	w.arrive(1, 8)
	d.run()
	if err := once.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := once.Wait(context.Background()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("wait on a released one-time buffer: %v", err)
	}
	if err := p.Release(); err != nil {
		t.Fatal(err)
	}
	// In the rewind ring: not re-posted; Wait waits for its next epoch,
	// which never comes because the window closes.
	res := make(chan error, 1)
	go func() { _, err := p.Wait(context.Background()); res <- err }()
	time.Sleep(5 * time.Millisecond)
	if len(res) != 0 {
		t.Fatal("wait on a released buffer returned its old record")
	}
	w.Close()
	d.run()
	if err := <-res; !errors.Is(err, ErrClosed) {
		t.Fatalf("%v", err)
	}
}
