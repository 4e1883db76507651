package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
)

const haloPort = 7610

// runRVMA runs the exchange over RVMA puts. Guest i's face for its right
// neighbour lands at offset 0 of that neighbour's buffer, its face for
// its left neighbour at offset face; an epoch is both faces. Each parity
// window has bufs buffers posted. With spin it waits for each epoch with
// Posted.Spin instead of Posted.Wait.
func runRVMA(ctx context.Context, r *ring, face, steps, bufs int, spin bool) (result, error) {
	start := time.Now()
	ep, err := rvma.Listen(ctx, netip.AddrPortFrom(r.self, haloPort), nil)
	if err != nil {
		return result{}, err
	}
	defer ep.Close()
	var posted [2][]*rvma.Posted
	for parity := 0; parity < 2; parity++ {
		w, err := ep.InitWindow(mailbox(parity), rvma.WindowOptions{Threshold: uint64(2 * face)})
		if err != nil {
			return result{}, err
		}
		mem, err := ep.Alloc(bufs * 2 * face)
		if err != nil {
			return result{}, err
		}
		for k := 0; k < bufs; k++ {
			p, err := w.Post(mem[k*2*face:(k+1)*2*face], nil)
			if err != nil {
				return result{}, err
			}
			posted[parity] = append(posted[parity], p)
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
		fill(area, r.index, s)
		pending[parity] = []*rvma.PutOp{
			ep.PutAsync(ctx, right, mailbox(parity), 0, area[:face]),
			ep.PutAsync(ctx, left, mailbox(parity), uint64(face), area[face:]),
		}
		p := posted[parity][(s/2)%bufs]
		wait := p.Wait
		if spin {
			wait = p.Spin
		}
		rec, err := wait(ctx)
		if err != nil {
			return result{}, fmt.Errorf("step %d: %w", s, err)
		}
		if rec.Len != uint64(2*face) || rec.Ops != 2 {
			return result{}, fmt.Errorf("step %d: epoch %d completed with %d bytes in %d puts", s, rec.Epoch, rec.Len, rec.Ops)
		}
		b := p.Bytes()
		if err := check(b[:face], r.left, s); err != nil { // the left neighbour puts at 0
			return result{}, err
		}
		if err := check(b[face:2*face], r.right, s); err != nil {
			return result{}, err
		}
		if err := p.Release(); err != nil {
			return result{}, err
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

func mailbox(parity int) rvma.Mailbox { return rvma.Mailbox(0x4A10_0000 + parity) }
