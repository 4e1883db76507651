//go:build lab

package rvma

import (
	"bytes"
	"context"
	"flag"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

var stressRounds = flag.Int("rvma.rounds", 25, "rounds of TestLabStressGuests")

// TestLabStressGuests repeats TestLabGuests' ordering traffic between two
// guests for -rvma.rounds rounds: each round 9 epochs into the window that
// counts bytes and 6 into the one that counts operations, 8 puts each over
// 4 stripes, issued in order, reversed and shuffled, every byte checked. At
// 25 rounds each buffer serves 75 and 50 generations (TestLabGuests 3 and
// 2), and about 1.2 GB cross the lab network. It is a stress run, not part of the
// suites: test/softroce/bench/rvma-stress.sh.
func TestLabStressGuests(t *testing.T) {
	labenv.Device(t)
	idx, _ := labenv.Index()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Second)
	defer cancel()
	_, _, total := orderSizes()
	kinds := []struct {
		mb     Mailbox
		epochs int
		seed   int
		opts   WindowOptions
	}{
		{mbOrder, orderEpochs, 0, WindowOptions{Threshold: uint64(total)}},
		{mbOpsOrd, opsEpochs, opsSeed, WindowOptions{Kind: EpochOps, Threshold: 8}},
	}
	if idx == 1 {
		ep := guestListen(t, guestPort, &EndpointOptions{Stripes: 4})
		var posted [2][]*Posted
		for k, kd := range kinds {
			w, err := ep.InitWindow(kd.mb, &kd.opts)
			if err != nil {
				t.Fatal(err)
			}
			posted[k] = postOrdering(t, ep, w)
		}
		if err := labenv.Signal(*countingFlag + "-stress-ready"); err != nil {
			t.Fatal(err)
		}
		next := [2]int{}
		for r := 0; r < *stressRounds; r++ {
			for k, kd := range kinds {
				for e := 0; e < kd.epochs; e++ {
					g := next[k]
					p := posted[k][g%3]
					wctx, wc := context.WithTimeout(ctx, 60*time.Second)
					rec, err := p.Wait(wctx)
					wc()
					if err != nil {
						t.Fatalf("round %d kind %d epoch %d (gen %d): %v\n%s", r, k, e, g, err, labDump(ep))
					}
					if rec.Epoch != uint64(g) || rec.Len != uint64(total) || rec.Ops != 8 {
						t.Fatalf("round %d kind %d gen %d: record %+v", r, k, g, rec)
					}
					if !bytes.Equal(p.Bytes(), patterned(total, kd.seed+e)) {
						t.Fatalf("round %d kind %d gen %d: bytes differ", r, k, g)
					}
					p.Release(ctx)
					next[k]++
				}
			}
		}
		t.Logf("receiver: %d rounds ok; stats %+v", *stressRounds, ep.Stats())
		if err := labenv.Signal(*countingFlag + "-stress-done"); err != nil {
			t.Fatal(err)
		}
		return
	}
	if idx != 2 {
		t.Fatalf("this test runs on two guests, not on guest %d", idx)
	}
	ep := guestListen(t, guestPort, &EndpointOptions{Stripes: 4})
	dst := guestAddr(t, 1, guestPort)
	if err := labenv.Wait(ctx, *countingFlag+"-stress-ready"); err != nil {
		t.Fatal(err)
	}
	src, _ := ep.Alloc(orderEpochs * total)
	for r := 0; r < *stressRounds; r++ {
		for _, kd := range kinds {
			for i, op := range putOrdering(ctx, ep, dst, kd.mb, src, kd.epochs, kd.seed) {
				wctx, wc := context.WithTimeout(ctx, 60*time.Second)
				err := op.Wait(wctx)
				wc()
				if err != nil {
					t.Fatalf("round %d put %d to %v: %v\n%s", r, i, kd.mb, err, labDump(ep))
				}
			}
		}
	}
	t.Logf("sender: %d rounds ok; stats %+v", *stressRounds, ep.Stats())
	if err := labenv.Wait(ctx, *countingFlag+"-stress-done"); err != nil {
		t.Fatal(err)
	}
}
