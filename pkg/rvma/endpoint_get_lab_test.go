//go:build lab

package rvma_test

// Get through the public API on one guest (the endpoint reads from its own
// windows over a link of two stripes): kept epochs read byte for byte,
// the errors of everything else, and Gets racing with the buffers'
// recycling that return either an epoch's bytes or ErrStale, never a
// mixture.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabEndpointGet -test.v

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
)

func TestLabEndpointGet(t *testing.T) {
	ep := labListen(t, 7481, &rvma.EndpointOptions{Stripes: 2})
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const mb = rvma.Mailbox(0x6E70001)
	const bufLen = 4096
	w, arena, posted := openPosted(t, ep, mb, rvma.WindowOptions{Keep: 2}, 4, 5, bufLen)
	into := make([]byte, 2*bufLen)
	if _, err := ep.Get(ctx, self, mb, rvma.LastEpoch, 0, into); !errors.Is(err, rvma.ErrNoBuffer) {
		t.Fatalf("get before any epoch: %v", err)
	}
	for e := 0; e < 3; e++ {
		if err := ep.Put(ctx, self, mb, 0, pattern(bufLen, byte(e))); err != nil {
			t.Fatal(err)
		}
		if _, err := posted[e].Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The newest kept epoch, into Go memory (read through a copy).
	res, err := ep.Get(ctx, self, mb, rvma.LastEpoch, 0, into)
	if err != nil || res.Epoch != 2 || res.Len != bufLen || res.N != bufLen || !bytes.Equal(into[:bufLen], pattern(bufLen, 2)) {
		t.Fatalf("get last: %+v %v", res, err)
	}
	// An older kept epoch, part of it, into endpoint memory (zero copy).
	direct := arena[4*bufLen : 4*bufLen+100]
	res, err = ep.Get(ctx, self, mb, 1, 1000, direct)
	if err != nil || res.Epoch != 1 || res.N != 100 || !bytes.Equal(direct, pattern(bufLen, 1)[1000:1100]) {
		t.Fatalf("get epoch 1: %+v %v", res, err)
	}
	// Reading past the epoch's length reads what is there.
	res, err = ep.Get(ctx, self, mb, 2, bufLen-96, into)
	if err != nil || res.N != 96 || !bytes.Equal(into[:96], pattern(bufLen, 2)[bufLen-96:]) {
		t.Fatalf("get the tail: %+v %v", res, err)
	}
	if res, err = ep.Get(ctx, self, mb, 2, bufLen, into); err != nil || res.N != 0 {
		t.Fatalf("get at the end: %+v %v", res, err)
	}
	for _, c := range []struct {
		epoch, off uint64
		want       error
	}{
		{0, 0, rvma.ErrStale},             // out of the ring (Keep 2)
		{3, 0, rvma.ErrNoBuffer},          // not completed
		{2, bufLen + 1, rvma.ErrTooLarge}, // beyond the epoch
		{1 << 40, 0, rvma.ErrNoBuffer},    // far ahead
		{rvma.LastEpoch, 0, nil},          // still fine
		{1, 0, nil},                       // served again by the same read-only window
		{2, bufLen - 1, nil},              // one byte
		{rvma.LastEpoch - 1, 0, rvma.ErrNoBuffer},
	} {
		if _, err := ep.Get(ctx, self, mb, c.epoch, c.off, into); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Fatalf("get epoch %d offset %d: %v, want %v", c.epoch, c.off, err, c.want)
		}
	}
	if _, err := ep.Get(ctx, self, 0xDEAD, rvma.LastEpoch, 0, into); !errors.Is(err, rvma.ErrNoMailbox) {
		t.Fatalf("get from no mailbox: %v", err)
	}

	// A partial epoch reads with its true length.
	if err := ep.Put(ctx, self, mb, 0, pattern(1000, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.IncEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = ep.Get(ctx, self, mb, rvma.LastEpoch, 0, into)
	if err != nil || res.Epoch != 3 || res.Len != 1000 || res.N != 1000 || !bytes.Equal(into[:1000], pattern(1000, 3)) {
		t.Fatalf("get partial: %+v %v", res, err)
	}
	// Epoch 1 left the ring with epoch 3.
	if _, err := ep.Get(ctx, self, mb, 1, 0, into); !errors.Is(err, rvma.ErrStale) {
		t.Fatalf("get epoch 1 after it left the ring: %v", err)
	}
	st := ep.Stats()
	if st.GetsServed < 8 || st.GetsRefused < 6 {
		t.Fatalf("stats %+v", st)
	}
	checkMetrics(t, ep, mb, map[string]float64{
		"rvma_endpoint_gets_served_total":  float64(st.GetsServed),
		"rvma_endpoint_gets_refused_total": float64(st.GetsRefused),
	})

	// A closed window's kept epochs stay readable while it lingers.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if res, err = ep.Get(ctx, self, mb, 2, 0, into); err != nil || !bytes.Equal(into[:bufLen], pattern(bufLen, 2)) {
		t.Fatalf("get from a closed window: %+v %v", res, err)
	}

	// Gets of up to 4 KiB into Go memory read through the endpoint's kept
	// chunks, as the puts' Go sources were copied into them.
	if st := ep.Stats(); st.CopyRegistrations != 0 {
		t.Fatalf("%d copies registered on their own for puts and Gets of 4 KiB at most", st.CopyRegistrations)
	}

	// A large epoch, read with many READs in flight: whole, into Go
	// memory and into endpoint memory, and from an offset that is not a
	// multiple of the path MTU.
	const big = 1<<20 + 333
	_, bigArena, bigPosted := openPosted(t, ep, mb+1, rvma.WindowOptions{Keep: 1}, 1, 2, big)
	want := pattern(big, 9)
	if err := ep.Put(ctx, self, mb+1, 0, want); err != nil {
		t.Fatal(err)
	}
	if _, err := bigPosted[0].Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		off  int
		into []byte
	}{
		{"Go memory", 0, make([]byte, big)},
		{"endpoint memory", 0, bigArena[big:]},
		{"offset", 5000, make([]byte, big)},
	} {
		res, err := ep.Get(ctx, self, mb+1, rvma.LastEpoch, uint64(c.off), c.into)
		if err != nil || res.N != big-c.off || !bytes.Equal(c.into[:res.N], want[c.off:]) {
			t.Fatalf("large get, %s: %+v %v", c.name, res, err)
		}
	}
	// The large put and the two large Gets into Go memory registered
	// their own copies; every kept chunk is back.
	if st := ep.Stats(); st.CopyRegistrations != 3 {
		t.Fatalf("%d copies registered on their own, want 3", st.CopyRegistrations)
	}
	if lent, _ := rvma.BounceLent(ep); lent != 0 {
		t.Fatalf("%d bounce chunks still lent", lent)
	}
}

// Gets of the newest epoch while a sender streams epochs and the receiver
// releases every buffer at once, so that each leaves the one-deep ring and
// is posted again within an epoch: every Get returns exactly one epoch's
// bytes or fails with ErrStale, and nothing hangs (the Gets' refused READs
// put stripes in the error state under the sender's puts, which are
// issued again on the replacements).
func TestLabEndpointGetRacesRecycling(t *testing.T) {
	ep := labListen(t, 7482, &rvma.EndpointOptions{Stripes: 2})
	self := ep.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	const mb = rvma.Mailbox(0x6E70002)
	const bufLen, epochs = 16 << 10, 60
	w, _, posted := openPosted(t, ep, mb, rvma.WindowOptions{Keep: 1}, 3, 3, bufLen)
	dump := time.AfterFunc(40*time.Second, func() {
		buf := make([]byte, 1<<20)
		t.Logf("stuck after 40 s (window %+v, endpoint %+v); goroutines:\n%s", w.Stats(), ep.Stats(), buf[:runtime.Stack(buf, true)])
	})
	defer dump.Stop()
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	stop := make(chan struct{})
	wg.Add(3)
	go func() { // receiver
		defer wg.Done()
		for e := 0; e < epochs; e++ {
			p := posted[e%3]
			rec, err := p.Wait(ctx)
			if err == nil && (rec.Epoch != uint64(e) || !bytes.Equal(p.Bytes(), pattern(bufLen, byte(e)))) {
				err = errors.New("epoch handed over with the wrong bytes")
			}
			if err == nil {
				err = p.Release(ctx)
			}
			if err != nil {
				errc <- err
				return
			}
		}
	}()
	go func() { // sender
		defer wg.Done()
		defer close(stop)
		for e := 0; e < epochs; e++ {
			if err := ep.Put(ctx, self, mb, 0, pattern(bufLen, byte(e))); err != nil {
				errc <- err
				return
			}
			if e%2 == 1 {
				// Every second epoch lives long enough for a Get of its
				// 16 packets; the others are recycled under the Gets.
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	var ok, stale int
	go func() { // getter
		defer wg.Done()
		into := make([]byte, bufLen)
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := ep.Get(ctx, self, mb, rvma.LastEpoch, 0, into)
			switch {
			case err == nil:
				if res.N != bufLen || !bytes.Equal(into, pattern(bufLen, byte(res.Epoch))) {
					errc <- fmt.Errorf("a get of epoch %d returned bytes that are not its epoch's: KiB by KiB from epochs %v", res.Epoch, whichEpochs(into, epochs))
					return
				}
				ok++
			case errors.Is(err, rvma.ErrStale), errors.Is(err, rvma.ErrNoBuffer):
				stale++
			default:
				errc <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Errorf("%v (window %+v, endpoint %+v)", err, w.Stats(), ep.Stats())
	}
	if t.Failed() {
		return
	}
	if ok == 0 {
		t.Fatalf("no get succeeded (%d refused)", stale)
	}
	st := ep.Stats()
	t.Logf("%d gets read an epoch, %d refused or stale; endpoint %+v", ok, stale, st)
}

// whichEpochs says, for each KiB of got, which epoch's pattern it holds
// (-1: none).
func whichEpochs(got []byte, epochs int) []int {
	var out []int
	for off := 0; off < len(got); off += 1024 {
		end := min(off+1024, len(got))
		e := -1
		for c := 0; c < epochs; c++ {
			if bytes.Equal(got[off:end], pattern(len(got), byte(c))[off:end]) {
				e = c
				break
			}
		}
		out = append(out, e)
	}
	return out
}
