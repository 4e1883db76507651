//go:build lab

package rvma_test

// Overshoot: two senders share each epoch of an operation-count window
// without dividing its threshold, so every epoch is offered twice its
// threshold. Puts that land after the threshold but before the buffer's
// memory window is unbound are placed and counted into that epoch
// (FlagLate); the receiver reports each to its sender (LATE), which
// counts it and calls Options.OnLate. Puts that come after the unbind are
// refused by the NIC and retried into the next epoch, so no byte is lost:
// a put refused eight times fails with ErrStale, and the epochs' records
// count exactly the puts that succeeded. When the kernel module counts,
// it closes the buffer at the packet that reaches the threshold: no put
// is late, the rest are refused (counted as stale at the receiver) and
// retried.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabEndpointOvershoot -test.v

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
)

func TestLabEndpointOvershoot(t *testing.T) {
	const (
		mb     = rvma.Mailbox(0x0e5)
		th     = 8  // puts per epoch
		rounds = 24 // each sender puts th per round
		size   = 64
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var mu sync.Mutex
	reports := map[int][]rvma.LateReport{}
	onLate := func(i int) func(rvma.LateReport) {
		return func(r rvma.LateReport) {
			mu.Lock()
			reports[i] = append(reports[i], r)
			mu.Unlock()
		}
	}
	recv := labListen(t, 7491, nil)
	senders := []*rvma.Endpoint{
		labListen(t, 7492, &rvma.Options{OnLate: onLate(0)}),
		labListen(t, 7493, &rvma.Options{OnLate: onLate(1), Stripes: 2}),
	}

	// Room for every epoch: each has at least th puts, and at most 2*th
	// land in one buffer (th counted, th late); up to four more are ended by
	// IncEpoch at the end.
	const epochs = 2 * rounds
	w, _, posted := openPosted(t, recv, mb, rvma.WindowOptions{Kind: rvma.EpochOps, Threshold: th, Keep: epochs + 4}, epochs+4, epochs+4, 2*th*size)

	// Each put carries its sender, round and index, so that every one can
	// be found again in exactly one buffer.
	tag := func(s, r, k int) []byte {
		b := pattern(size, byte(s*97+r*13+k))
		b[0], b[1], b[2] = byte(s), byte(r), byte(k)
		return b
	}
	// A put refused as stale is issued again into a later epoch, at most
	// eight times: a sender that keeps losing the race for epochs the
	// other fills alone then gets ErrStale, and its put is in no buffer.
	// Both senders start each round together: left alone, they can fall
	// into step one epoch apart, each filling its own, and then no epoch
	// is offered more than its threshold.
	var wg sync.WaitGroup
	var gaveUp [2]int
	var start [rounds]sync.WaitGroup
	for r := range start {
		start[r].Add(len(senders))
	}
	for s, ep := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reached := 0 // rounds whose start this sender has reached
			defer func() {
				for ; reached < rounds; reached++ {
					start[reached].Done() // the other sender does not wait for one that failed
				}
			}()
			for r := 0; r < rounds; r++ {
				start[r].Done()
				reached++
				start[r].Wait()
				var ops []*rvma.PutOp
				for k := 0; k < th; k++ {
					off := uint64((s*th + k) * size)
					ops = append(ops, ep.PutAsync(ctx, recv.Addr(), mb, off, tag(s, r, k)))
				}
				for k, op := range ops {
					err := op.Wait(ctx)
					switch {
					case errors.Is(err, rvma.ErrStale):
						gaveUp[s]++
					case err != nil:
						t.Errorf("sender %d round %d put %d: %v", s, r, k, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	placed := uint64(2*th*rounds - gaveUp[0] - gaveUp[1])

	// Hand over what the last epochs hold: puts retried after a refusal
	// may leave the head short of its threshold, and a sender that put
	// the threshold into it by its own count has moved on to the next
	// ones. A sender targets at most three generations from the first
	// that still accepts puts, and the head may be one before it that
	// reached its threshold and is not handed over yet: four IncEpochs
	// reach every generation a put can have landed in.
	for i := 0; i < 4; i++ {
		if _, err := w.IncEpoch(ctx); err != nil {
			t.Fatalf("IncEpoch: %v", err)
		}
	}
	st := w.Stats()
	if st.Puts != placed {
		t.Fatalf("window counted %d puts, want %d (%d given up as stale): %+v", st.Puts, placed, gaveUp[0]+gaveUp[1], st)
	}
	// Reports travel after the puts completed: wait for them.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := senders[0].Stats().LatePuts + senders[1].Stats().LatePuts
		if got == st.Late {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("senders counted %d late puts, the window %d (receiver lost %d notices; senders' unknown arrivals %d, %d)",
				got, st.Late, recv.Stats().LostNotices, senders[0].Stats().UnknownRecv, senders[1].Stats().UnknownRecv)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if recv.Counting() == rvma.CountModule {
		// Refused puts are reported by their senders (REFUSED), through
		// the queue that is sent again after the refusal broke a stripe:
		// the receiver counts every one.
		refused := senders[0].Stats().StalePuts + senders[1].Stats().StalePuts
		for st = w.Stats(); st.Stale != refused && time.Now().Before(deadline); st = w.Stats() {
			time.Sleep(10 * time.Millisecond)
		}
		// The module refused some of them itself (for the buffer it had
		// closed), the NIC the others (for the key already dead).
		if st.Late != 0 || refused == 0 || st.Stale != refused || st.RefusedPackets > refused {
			t.Fatalf("counted by the module: %d late puts (want none), %d refused as stale at the receiver, %d at the senders (want some, as many at the receiver) (%+v; receiver %+v; senders %+v, %+v)",
				st.Late, st.Stale, refused, st, recv.Stats(), senders[0].Stats(), senders[1].Stats())
		}
		t.Logf("counted by the module: no late put; %d puts refused as stale (%d by the module), all reported to the receiver", refused, st.RefusedPackets)
	}
	if recv.Counting() != rvma.CountModule && st.Late == 0 {
		t.Fatalf("no put arrived late in %d epochs offered twice their threshold: the test shows nothing (%+v)", rounds, st)
	}

	lateIn := map[uint64]int{}
	calls := map[int]int{}
	mu.Lock()
	for s, rs := range reports {
		for _, r := range rs {
			if r.Peer != recv.Addr() || r.Mailbox != mb || r.Puts < 1 || r.Bytes != uint64(r.Puts*size) || r.Stale {
				t.Errorf("sender %d: report %+v", s, r)
			}
			lateIn[r.Epoch] += r.Puts
			calls[s] += r.Puts
		}
		if uint64(calls[s]) != senders[s].Stats().LatePuts {
			t.Errorf("sender %d: OnLate reported %d puts, LatePuts %d", s, calls[s], senders[s].Stats().LatePuts)
		}
	}
	mu.Unlock()

	// Every epoch's record: the late puts reported for it are exactly its
	// puts beyond the threshold, it is flagged late exactly then, and its
	// length counts every put it holds.
	var total, flagged int
	var seen strings.Builder // epoch:ops[flags] of every record, for a failure
	for i, p := range posted {
		rec, ok := p.Load()
		if !ok {
			fmt.Fprintf(&seen, " buffer%d:none", i)
			continue
		}
		fmt.Fprintf(&seen, " %d:%d[%v]", rec.Epoch, rec.Ops, rec.Flags)
		total += int(rec.Ops)
		flagged += lateIn[rec.Epoch]
		// The last epoch, ended by IncEpoch, may count a put whose
		// completion the receiver took after IncEpoch: late as well.
		if rec.Flags&rvma.FlagPartial == 0 && int(rec.Ops)-th != lateIn[rec.Epoch] {
			t.Errorf("epoch %d: %d puts for a threshold of %d, %d reported late", rec.Epoch, rec.Ops, th, lateIn[rec.Epoch])
		}
		if (rec.Flags&rvma.FlagLate != 0) != (lateIn[rec.Epoch] > 0) {
			t.Errorf("epoch %d: flags %v with %d late puts", rec.Epoch, rec.Flags, lateIn[rec.Epoch])
		}
		if rec.Len != rec.Ops*size {
			t.Errorf("epoch %d: %d bytes for %d puts", rec.Epoch, rec.Len, rec.Ops)
		}
	}
	if uint64(total) != placed || uint64(flagged) != st.Late {
		t.Fatalf("records hold %d puts (want %d) and %d late ones (window: %d); epoch:ops[flags]:%s; window %+v",
			total, placed, flagged, st.Late, seen.String(), st)
	}
	mu.Lock()
	nrep := len(reports[0]) + len(reports[1])
	mu.Unlock()
	t.Logf("%d puts from 2 senders into %d-put epochs: %d late (placed, counted, reported to their senders: %d and %d, in %d reports), %d refused and retried, %d and %d given up as stale; receiver's lost notices %d",
		2*th*rounds, th, st.Late, senders[0].Stats().LatePuts, senders[1].Stats().LatePuts, nrep,
		senders[0].Stats().StalePuts+senders[1].Stats().StalePuts, gaveUp[0], gaveUp[1], recv.Stats().LostNotices)
	if n := recv.Stats().LostNotices; n != 0 {
		t.Errorf("receiver lost %d notices", n)
	}
}
