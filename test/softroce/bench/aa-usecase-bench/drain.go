package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

const (
	drainPort   = 7710
	drainChunks = 10
)

var drainModes = []struct {
	name string
	n    activeaccess.Notification
}{{"poll", activeaccess.Poll}, {"event", activeaccess.Event}}

// benchDrain: the target has one counting page per notification mode,
// each its own domain and log. The source on guest 2 fills both logs
// (8-byte puts, one metadata entry each, alternating pages) while the
// handlers are held; once every put completed (so it is logged), the
// target lets each handler drain one chunk of its backlog at a time,
// alternating the modes, and times each chunk from its release to its
// last entry: entries per second one handler goroutine drains, the median
// over the chunks.
func benchDrain(entries int) error {
	if entries < 2*drainChunks || entries*128 > 15<<20 {
		return errors.New("drain: -entries must be in [20, 122880] (a 16 MiB grant)")
	}
	tgt, err := isTarget()
	if err != nil {
		return err
	}
	addr, err := target(drainPort)
	if err != nil {
		return err
	}
	if tgt {
		return drainTarget(addr, entries/2/drainChunks)
	}
	return drainSource(addr, entries/2/drainChunks*drainChunks)
}

// gated is a handler that stops before every chunk until released, and
// records when it finished each chunk.
type gated struct {
	chunk   int
	seen    int
	release chan struct{}
	done    chan time.Time
}

func (g *gated) handle(*activeaccess.Access) {
	if g.seen%g.chunk == 0 {
		<-g.release
	}
	if g.seen++; g.seen%g.chunk == 0 {
		g.done <- time.Now()
	}
}

func drainTarget(addr netip.AddrPort, chunk int) error {
	tg, err := activeaccess.Listen(context.Background(), addr, 2*4096, &activeaccess.TargetOptions{LogSize: 16 << 20, MaxSources: 1})
	if err != nil {
		return err
	}
	defer tg.Close()
	gs := make([]*gated, len(drainModes))
	ds := make([]*activeaccess.Domain, len(drainModes))
	for i, m := range drainModes {
		gs[i] = &gated{chunk: chunk, release: make(chan struct{}), done: make(chan time.Time, 1)}
		// PollIdle: once drained, the polling runtime must not starve the
		// other domain of the guest's one vCPU.
		if ds[i], err = tg.NewDomain(gs[i].handle, &activeaccess.DomainOptions{Notify: m.n, PollIdle: time.Millisecond}); err != nil {
			return err
		}
		if err := ds[i].Associate(i*4096, 4096, activeaccess.W|activeaccess.R|activeaccess.WL); err != nil {
			return err
		}
	}
	if err := labenv.Signal("drain-ready"); err != nil {
		return err
	}
	if err := await("drain-filled"); err != nil {
		return err
	}
	rates := make([][]float64, len(drainModes))
	for c := 0; c < drainChunks; c++ {
		for i := range drainModes {
			start := time.Now()
			gs[i].release <- struct{}{}
			select {
			case end := <-gs[i].done:
				rates[i] = append(rates[i], float64(chunk)/end.Sub(start).Seconds())
			case <-time.After(time.Minute):
				return fmt.Errorf("%s: chunk %d not drained after a minute (%d entries processed)", drainModes[i].name, c, ds[i].Processed())
			}
		}
	}
	for i, m := range drainModes {
		if ref, lost := ds[i].Refused(); ref != 0 || lost != 0 {
			return fmt.Errorf("%s: log refused %d, lost %d", m.name, ref, lost)
		}
		fmt.Printf("target: %s: %d chunks of %d entries, entries/s:", m.name, drainChunks, chunk)
		for _, r := range rates[i] {
			fmt.Printf(" %.0f", r)
		}
		fmt.Println()
		figure("drain_entries_per_s_"+m.name, median(rates[i]), "entries/s (median of chunks)")
	}
	if err := labenv.Signal("drain-done"); err != nil {
		return err
	}
	return tg.Err()
}

func drainSource(addr netip.AddrPort, perMode int) error {
	if err := await("drain-ready"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := activeaccess.Dial(ctx, addr, &activeaccess.SourceOptions{Name: "drain"})
	if err != nil {
		return err
	}
	defer s.Close()
	start := time.Now()
	var last *activeaccess.Op
	b := make([]byte, 8)
	n := perMode * len(drainModes)
	for i := 0; i < n; i++ {
		off := (i%len(drainModes))*4096 + (i/len(drainModes)%500)*8
		if last, err = s.Put(ctx, off, b); err != nil {
			return fmt.Errorf("put %d: %w", i, err)
		}
	}
	if err := last.Wait(ctx); err != nil { // RC completes in order: all are logged
		return err
	}
	fmt.Printf("source: %d puts logged in %v (%.0f/s)\n", n, time.Since(start).Round(time.Millisecond), float64(n)/time.Since(start).Seconds())
	if err := labenv.Signal("drain-filled"); err != nil {
		return err
	}
	return await("drain-done")
}
