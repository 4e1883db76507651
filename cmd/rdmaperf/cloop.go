package main

import (
	"time"

	"github.com/rdmaplus/rdmaplus/cmd/rdmaperf/internal/cloop"
)

// The -loop c variants run perftest's loops in C (package cloop) on the
// same pkg/verbs objects; the -loop go variants (run.go) measure the
// idiomatic pkg/verbs path.

func (b *bench) cParams(size, iters int) cloop.Params {
	return cloop.Params{QP: b.qp, SendCQ: b.scq, RecvCQ: b.rcq, MR: b.mr, Send: b.mr.Addr(), Recv: b.mr.Addr() + uint64(b.max),
		RecvLen: b.max, Remote: b.peer, Size: size, Iters: iters, Client: b.client, CQMod: b.cfg.CQMod,
		Inline: size <= b.qp.Cap().MaxInlineData && size <= b.cfg.Inline}
}

func (b *bench) cWriteLat(size, iters int) ([]time.Duration, error) {
	s, err := cloop.WriteLat(b.cParams(size, iters))
	if err != nil {
		return nil, err
	}
	return cyclesToDurations(s), nil
}

func (b *bench) cReadLat(size, iters int) ([]time.Duration, error) {
	p := b.cParams(size, iters)
	p.Remote.Addr -= uint64(b.max) // the peer's send area
	s, err := cloop.ReadLat(p)
	if err != nil {
		return nil, err
	}
	return cyclesToDurations(s), nil
}

func (b *bench) cSendLat(size, iters int) ([]time.Duration, error) {
	s, err := cloop.SendLat(b.cParams(size, iters))
	if err != nil {
		return nil, err
	}
	return cyclesToDurations(s), nil
}
