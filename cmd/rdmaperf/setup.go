package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// setupLat measures what RDMA pays before the first WRITE into a new
// buffer and RVMA does not (the paper's Figure 6): the receiver registers
// size bytes of fresh memory for remote write and sends the region's
// address, key and length to the writer, which answers once it has them
// (a 16-byte SEND and a 1-byte SEND back). The client plays the receiver
// and times registration plus the exchange; deregistration, after the
// timing, is not counted. One operation per sample (no halving).
func (b *bench) setupLat(ctx context.Context, size int) ([]time.Duration, error) {
	iters := b.cfg.Iters
	var mem *verbs.Buffer
	if b.client {
		var err error
		if mem, err = verbs.Alloc(size); err != nil {
			return nil, err
		}
		defer mem.Close()
	}
	pd := b.mr.PD()
	msg := b.mr.Bytes()[:16]
	send := verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{b.mr.SGE(0, 16)}}
	rx := &refiller{b: b, post: b.postNotifyRecvs}
	recv := func() error { return rx.recv(ctx) }
	samples := make([]time.Duration, 0, iters)
	for i := 0; i < iters; i++ {
		send.Flags = b.flags(16, i+1, iters) &^ verbs.SendInline
		if !b.client {
			if err := recv(); err != nil {
				return nil, err
			}
			if err := b.qp.PostSend(send); err != nil {
				return nil, err
			}
		} else {
			t0 := rdtsc()
			mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				return nil, fmt.Errorf("registering %d bytes: %w", size, err)
			}
			binary.LittleEndian.PutUint64(msg, mr.Addr())
			binary.LittleEndian.PutUint32(msg[8:], mr.RKey())
			binary.LittleEndian.PutUint32(msg[12:], uint32(size))
			if err := b.qp.PostSend(send); err != nil {
				return nil, err
			}
			if err := recv(); err != nil {
				return nil, err
			}
			samples = append(samples, time.Duration(float64(rdtsc()-t0)/cyclesPerUsec*float64(time.Microsecond)))
			if err := mr.Close(); err != nil {
				return nil, err
			}
		}
		if send.Flags&verbs.SendSignaled != 0 {
			if err := b.spinCQ(ctx, b.scq, 1); err != nil {
				return nil, err
			}
		}
	}
	if err := rx.flush(); err != nil {
		return nil, err
	}
	return samples, nil
}
