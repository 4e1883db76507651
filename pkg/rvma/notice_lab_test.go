//go:build lab

package rvma

// Where notices travel (notice.go): over the subscriber's own link until
// this endpoint has dialled one of its own to the same peer, then over
// that one, ahead of this side's puts on the same QP; back over the
// subscriber's link when the own link fails, with the entries in flight
// pushed again.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabNotice -test.v

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// routes returns, for every subscriber of ep's windows, whether its
// notices travel on ep's own dialled link to its peer.
func routes(ep *Endpoint) (own, theirs int) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	for _, subs := range ep.subs {
		for _, s := range subs {
			if d := ep.links[s.l.peer]; d != nil && ep.noticeVia[s] == d {
				own++
			} else {
				theirs++
			}
		}
	}
	return own, theirs
}

func TestLabNoticeRoute(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// b's window takes one 64-byte put per epoch and is never released:
	// beyond the descriptors of a's view, every put of a needs b's notices.
	const round = 15
	a, b, mb, pb := replacePair(t, ctx, guestPort+54, 3*round+1, &EndpointOptions{Stripes: 1})
	const ma = Mailbox(0x5e1c) // where b puts to a
	wa, err := a.InitWindow(ma, &WindowOptions{Threshold: 64})
	if err != nil {
		t.Fatal(err)
	}
	memA, err := a.Alloc(2 * 64)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := wa.Post(ctx, memA[i*64:(i+1)*64], nil); err != nil {
			t.Fatal(err)
		}
	}
	sent := 1
	// step lets b put to a first (dialling its own link) if it should,
	// then has a put a round that needs b's notices, then checks where
	// b's notices travel.
	step := func(what string, bPuts bool, wantOwn int) {
		t.Helper()
		if bPuts {
			if err := b.Put(ctx, a.Addr(), ma, 0, patterned(64, 99)); err != nil {
				t.Fatalf("%s: b's put to a: %v", what, err)
			}
		}
		for i := 0; i < round; i++ {
			if err := a.Put(ctx, b.Addr(), mb, 0, patterned(64, sent)); err != nil {
				t.Fatalf("%s, put %d of a: %v", what, sent, err)
			}
			sent++
		}
		if own, theirs := routes(b); own != wantOwn || theirs != 1-wantOwn {
			t.Fatalf("%s: %d subscribers routed over b's own link, %d over a's; want %d and %d", what, own, theirs, wantOwn, 1-wantOwn)
		}
	}
	if own, theirs := routes(b); own != 0 || theirs != 1 {
		t.Fatalf("before b dialled a: %d subscribers routed over b's own link, %d over a's; want 0 and 1", own, theirs)
	}
	// b puts to a: its own link to a now carries its notices to a.
	step("after b dialled a", true, 1)
	// b's own link fails: the notices go back over a's link, and a's puts,
	// which need them, go on.
	b.mu.Lock()
	own := b.links[a.Addr()]
	b.mu.Unlock()
	own.fail(errPeer(a.Addr(), errors.New("test: b's own link taken down")), true)
	step("after b's own link failed", false, 0)
	// b dials a again: the route follows.
	step("after b dialled a again", true, 1)
	checkEpochs(t, ctx, pb, sent)
	if s := a.Stats(); s.StalePuts != 0 {
		t.Errorf("a: %d stale puts, want 0", s.StalePuts)
	}
	t.Logf("%d puts of a across b's notices over a's link, b's own, a's again and b's new one; b sent %d notices", sent, b.Stats().Notices)
}

// TestLabNoticeRing is the halo exchange on three endpoints of one guest:
// each puts a face to both others every step, into windows of byte
// thresholds that the two fill together, alternating between two windows
// by step parity. A sender cannot tell by its own count that an epoch
// completed; the receiver's notice of it travels ahead of the receiver's
// own next face to that sender on one QP, so the sender knows before it
// can put to that window again, and no put is ever refused as stale once
// the routes are set (the first steps may still go over the peers' links).
func TestLabNoticeRing(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n, face, buffers, warm, steps = 3, 1024, 4, 10, 80
	eps := make([]*Endpoint, n)
	for i := range eps {
		eps[i] = guestListen(t, guestPort+56+uint16(i), &EndpointOptions{Stripes: 1})
	}
	mailbox := func(parity int) Mailbox { return Mailbox(0x4a110000 + parity) }
	posted := make([][2][]*Posted, n)
	for i, ep := range eps {
		for parity := 0; parity < 2; parity++ {
			w, err := ep.InitWindow(mailbox(parity), &WindowOptions{Threshold: 2 * face})
			if err != nil {
				t.Fatal(err)
			}
			mem, err := ep.Alloc(buffers * 2 * face)
			if err != nil {
				t.Fatal(err)
			}
			for k := 0; k < buffers; k++ {
				p, err := w.Post(ctx, mem[k*2*face:(k+1)*2*face], nil)
				if err != nil {
					t.Fatal(err)
				}
				posted[i][parity] = append(posted[i][parity], p)
			}
		}
	}
	faceOf := func(from, step, side int) []byte { return patterned(face, (step*n+from)*2+side) }
	var warmed sync.WaitGroup
	warmed.Add(n)
	staleAtWarm := make(chan uint64, 1)
	run := func(i int) error {
		warming := true
		defer func() {
			if warming { // failed before: let the others past the barrier
				warmed.Done()
			}
		}()
		ep := eps[i]
		right, left := eps[(i+1)%n].Addr(), eps[(i+n-1)%n].Addr()
		src, err := ep.Alloc(2 * 2 * face)
		if err != nil {
			return err
		}
		var pending [2][]*PutOp
		for s := 0; s < steps; s++ {
			if s == warm {
				warming = false
				warmed.Done()
				warmed.Wait()
				if i == 0 {
					var stale uint64
					for _, e := range eps {
						stale += e.Stats().StalePuts
					}
					staleAtWarm <- stale
				}
			}
			parity := s % 2
			for _, op := range pending[parity] {
				if err := op.Wait(ctx); err != nil {
					return fmt.Errorf("step %d's put: %w", s-2, err)
				}
			}
			area := src[parity*2*face : (parity+1)*2*face]
			copy(area[:face], faceOf(i, s, 0))
			copy(area[face:], faceOf(i, s, 1))
			pending[parity] = []*PutOp{
				ep.PutAsync(ctx, right, mailbox(parity), 0, area[:face]),
				ep.PutAsync(ctx, left, mailbox(parity), face, area[face:]),
			}
			p := posted[i][parity][(s/2)%buffers]
			rec, err := p.Wait(ctx)
			if err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
			// The left neighbour's face for its right lands at 0, the
			// right neighbour's for its left at face.
			got := p.Bytes()
			if rec.Len != 2*face || !bytes.Equal(got[:face], faceOf((i+n-1)%n, s, 0)) || !bytes.Equal(got[face:], faceOf((i+1)%n, s, 1)) {
				return fmt.Errorf("step %d: record %+v, faces %x... and %x...", s, rec, got[:4], got[face:face+4])
			}
			if err := p.Release(ctx); err != nil {
				return err
			}
		}
		for _, ops := range pending {
			for _, op := range ops {
				if err := op.Wait(ctx); err != nil {
					return err
				}
			}
		}
		return nil
	}
	errs := make(chan error, n)
	for i := range eps {
		go func() { errs <- run(i) }()
	}
	var warmStale uint64
	select {
	case warmStale = <-staleAtWarm:
	case err := <-errs:
		t.Fatalf("before step %d: %v", warm, err)
	}
	for range eps {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var stale, notices uint64
	for i, ep := range eps {
		s := ep.Stats()
		stale += s.StalePuts
		notices += s.Notices
		if own, theirs := routes(ep); own != 4 || theirs != 0 {
			t.Errorf("endpoint %d: %d subscribers routed over its own links, %d over the peers'; want 4 and 0", i, own, theirs)
		}
	}
	t.Logf("%d endpoints, %d steps of two %d-byte faces each: %d stale puts in the first %d steps, %d after; %.2f notices per step and endpoint",
		n, steps, face, warmStale, warm, stale-warmStale, float64(notices)/float64(n*steps))
	if stale != warmStale {
		t.Errorf("%d stale puts after the routes were set, want 0", stale-warmStale)
	}
}
