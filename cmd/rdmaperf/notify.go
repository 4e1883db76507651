package main

import (
	"context"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// notifyLat is the spec-compliant RDMA completion the RVMA paper compares
// against (its section V-A1): each side RDMA WRITEs size bytes into the
// peer's buffer and then SENDs a 1-byte message, and the receiver learns
// that the data is complete from the SEND's receive completion, never
// from the data itself (on an unordered network the last byte may land
// first). Ping-pong of iters round trips; latency is half the round trip.
//
// wait selects where the SEND goes: false posts it right behind the WRITE
// on the same QP, in one chain (RC orders the SEND's placement after the
// WRITE's); true posts it only after the WRITE's own completion arrived,
// the variant that stays correct when the WRITE and the SEND take
// different paths.
//
// writeImmLat (imm) is RDMA's own one-operation notification, the
// transport RVMA's puts ride on: an RDMA WRITE WITH IMMEDIATE, whose
// receive completion says that its own data is placed.
func (b *bench) notifyLat(ctx context.Context, size, iters int, wait, imm bool) ([]time.Duration, error) {
	stamps := make([]uint64, iters)
	write := verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{b.mr.SGE(0, size)}, RemoteAddr: b.peer.Addr, RKey: b.peer.RKey}
	send := verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{b.mr.SGE(2*b.max, 1)}}
	chain := []verbs.SendWR{write, send}
	if imm {
		chain = []verbs.SendWR{{Op: verbs.OpWriteImm, SGL: write.SGL, RemoteAddr: write.RemoteAddr, RKey: write.RKey, Imm: 1}}
	}
	rx := &refiller{b: b, post: b.postNotifyRecvs}
	recv := func() error { return rx.recv(ctx) }
	mem := b.mr.Bytes()
	for i := 0; i < iters; i++ {
		if !b.client {
			if err := recv(); err != nil {
				return nil, err
			}
		}
		stamps[i] = rdtsc()
		mem[size-1] = byte(i + 1)
		if wait {
			write.Flags = verbs.SendSignaled
			if err := b.qp.PostSend(write); err != nil {
				return nil, err
			}
			if err := b.spinCQ(ctx, b.scq, 1); err != nil {
				return nil, err
			}
			send.Flags = b.flags(1, i+1, iters) &^ verbs.SendInline
			if err := b.post(ctx, send); err != nil {
				return nil, err
			}
		} else {
			chain[0].Flags = 0
			chain[len(chain)-1].Flags = b.flags(1, i+1, iters) &^ verbs.SendInline
			if err := b.post(ctx, chain...); err != nil {
				return nil, err
			}
		}
		if b.client {
			if err := recv(); err != nil {
				return nil, err
			}
		}
	}
	if err := rx.flush(); err != nil {
		return nil, err
	}
	return cyclesToDurations(stamps), nil
}

// postNotifyRecvs posts n receives for the 1-byte completion messages of
// notifyLat, into the notification area behind the receive area so they
// never overwrite the data being checked.
func (b *bench) postNotifyRecvs(n int) error {
	wrs := make([]verbs.RecvWR, n)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{b.mr.SGE(2*b.max+64, 64)}}
	}
	return b.qp.PostRecv(wrs...)
}

// refiller waits for one receive completion at a time and re-posts the
// consumed receives 16 at a time, as perftest does.
type refiller struct {
	b        *bench
	post     func(n int) error
	consumed int
}

func (r *refiller) recv(ctx context.Context) error {
	if err := r.b.spinCQ(ctx, r.b.rcq, 1); err != nil {
		return err
	}
	if r.consumed++; r.consumed == 16 {
		r.consumed = 0
		return r.post(16)
	}
	return nil
}

// flush re-posts what was consumed since the last refill.
func (r *refiller) flush() error {
	if r.consumed == 0 {
		return nil
	}
	n := r.consumed
	r.consumed = 0
	return r.post(n)
}
