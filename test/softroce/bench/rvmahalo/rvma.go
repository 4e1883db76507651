package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
)

const haloPort = 7610

// haloOptions says how the RVMA exchange is set up and waited for.
type haloOptions struct {
	bufs    int  // buffers posted per window
	spin    bool // wait with Posted.Spin instead of Posted.Wait
	perPeer bool // one window per neighbour and parity instead of one per parity
	share   bool // windows promise each neighbour's share (WindowOptions.Share)
}

// inbox is one window of a guest: the buffers posted to it, and the
// neighbours whose faces fill its epochs, from[i]'s face at offset i*face.
type inbox struct {
	posted []*rvma.Posted
	from   []int // neighbour indexes, 1-based
}

// runRVMA runs the exchange over RVMA puts. By default each guest opens
// one window per step parity, which both neighbours fill: the left
// neighbour's face lands at offset 0, the right one's at offset face, and
// an epoch is both faces; with share the windows promise that each
// neighbour puts one face into every epoch (WindowOptions.Share), so that
// each moves on by its own count and needs no notice per epoch. With
// perPeer each guest opens one window per parity and neighbour, each
// filled by that neighbour alone (an epoch is one face): the library's
// one-sender case.
func runRVMA(ctx context.Context, r *ring, face, steps int, o haloOptions) (result, error) {
	start := time.Now()
	ep, err := rvma.Listen(ctx, netip.AddrPortFrom(r.self, haloPort), nil)
	if err != nil {
		return result{}, err
	}
	defer ep.Close()
	// What each parity's windows expect, and where this guest's faces go.
	layout := []inbox{{from: []int{r.left, r.right}}}
	// This guest is its right neighbour's left one and its left
	// neighbour's right one.
	toRight, toLeft := 0, 0 // window index at each neighbour
	offRight, offLeft := uint64(0), uint64(face)
	if o.perPeer {
		layout = []inbox{{from: []int{r.left}}, {from: []int{r.right}}}
		toLeft, offLeft = 1, 0
	}
	var boxes [2][]inbox
	for parity := 0; parity < 2; parity++ {
		for i, l := range layout {
			size := len(l.from) * face
			wo := rvma.WindowOptions{Threshold: uint64(size)}
			if o.share {
				wo.Share = uint64(face)
			}
			w, err := ep.InitWindow(mailbox(parity, i), &wo)
			if err != nil {
				return result{}, err
			}
			mem, err := ep.Alloc(o.bufs * size)
			if err != nil {
				return result{}, err
			}
			box := inbox{from: l.from}
			for k := 0; k < o.bufs; k++ {
				p, err := w.Post(ctx, mem[k*size:(k+1)*size], nil)
				if err != nil {
					return result{}, err
				}
				box.posted = append(box.posted, p)
			}
			boxes[parity] = append(boxes[parity], box)
		}
	}
	// Send faces from endpoint memory (no copy), one area per step in
	// flight: a step's puts are waited for two steps later.
	src, err := ep.Alloc(2 * 2 * face)
	if err != nil {
		return result{}, err
	}
	setup := time.Since(start)
	if err := r.barrier(ctx, "halo-rvma-ready"); err != nil {
		return result{}, err
	}
	left := netip.AddrPortFrom(r.addrs[r.left-1], haloPort)
	right := netip.AddrPortFrom(r.addrs[r.right-1], haloPort)
	var pending [2][]*rvma.PutOp
	cpu0, err := readCPU()
	if err != nil {
		return result{}, err
	}
	t0 := time.Now()
	for s := 0; s < steps; s++ {
		parity := s % 2
		for _, op := range pending[parity] {
			if err := op.Wait(ctx); err != nil {
				return result{}, fmt.Errorf("step %d: %w", s-2, err)
			}
		}
		area := src[parity*2*face : (parity+1)*2*face]
		fill(area[:face], r.index, s)
		fill(area[face:], r.index, s)
		pending[parity] = []*rvma.PutOp{
			ep.PutAsync(ctx, right, mailbox(parity, toRight), offRight, area[:face]),
			ep.PutAsync(ctx, left, mailbox(parity, toLeft), offLeft, area[face:]),
		}
		for _, box := range boxes[parity] {
			if err := box.take(ctx, s, face, o); err != nil {
				return result{}, err
			}
		}
	}
	run := time.Since(t0)
	cpu := cpu0.since()
	for _, ops := range pending {
		for _, op := range ops {
			if err := op.Wait(ctx); err != nil {
				return result{}, err
			}
		}
	}
	// Counted before the barrier, after which a neighbour's Close would
	// count as a link failure.
	st := ep.Stats()
	// Nobody leaves while a neighbour may still put to it.
	err = r.barrier(ctx, "halo-rvma-done")
	return result{setup: setup, run: run, cpu: cpu, rvma: &st}, err
}

// take waits for step s's epoch of the window, checks every face in it and
// releases the buffer.
func (b inbox) take(ctx context.Context, s, face int, o haloOptions) error {
	p := b.posted[(s/2)%len(b.posted)]
	wait := p.Wait
	if o.spin {
		wait = p.Spin
	}
	rec, err := wait(ctx)
	if err != nil {
		return fmt.Errorf("step %d: %w", s, err)
	}
	if rec.Len != uint64(len(b.from)*face) || rec.Ops != uint64(len(b.from)) {
		return fmt.Errorf("step %d: epoch %d completed with %d bytes in %d puts", s, rec.Epoch, rec.Len, rec.Ops)
	}
	buf := p.Bytes()
	for i, from := range b.from {
		if err := check(buf[i*face:(i+1)*face], from, s); err != nil {
			return err
		}
	}
	return p.Release(ctx)
}

// mailbox names window i of a step parity.
func mailbox(parity, i int) rvma.Mailbox { return rvma.Mailbox(0x4A10_0000 + parity<<4 + i) }
