package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/getlog"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// Memory: three regions of 64 pages: plain, RLD with a handler that only
// counts (the module's logging and the runtime's reading), and RLD with
// pkg/activeaccess/getlog (also the records written to files).
const (
	glPort = 7700
	half   = 64 * 4096 // one region
)

var kinds = []string{"plain", "rld-only", "getlog"}

func benchGetLog(rounds, gets, size int) error {
	if size <= 0 || size > half || gets <= 0 || rounds <= 0 {
		return errors.New("getlog: bad -rounds, -gets or -size")
	}
	tgt, err := isTarget()
	if err != nil {
		return err
	}
	addr, err := target(glPort)
	if err != nil {
		return err
	}
	if tgt {
		tg, err := activeaccess.Listen(context.Background(), addr, 3*half, &activeaccess.TargetOptions{LogSize: 8 << 20, MaxSources: 1})
		if err != nil {
			return err
		}
		defer tg.Close()
		dir, err := os.MkdirTemp("", "getlog-bench")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		var counted int
		d, err := tg.NewDomain(func(*activeaccess.Access) { counted++ }, nil)
		if err != nil {
			return err
		}
		if err := d.Associate(half, half, activeaccess.W|activeaccess.R|activeaccess.RL|activeaccess.RLD); err != nil {
			return err
		}
		l, err := getlog.New(tg, 2*half, half, dir, nil)
		if err != nil {
			return err
		}
		defer l.Close()
		if err := labenv.Signal(fmt.Sprint("getlog-ready-", size)); err != nil {
			return err
		}
		if err := await(fmt.Sprint("getlog-done-", size)); err != nil {
			return err
		}
		d.Close()
		fmt.Printf("target: %d entries handled without persisting, %d logged by getlog\n", counted, l.Count("bench"))
		if err := errors.Join(l.Err(), tg.Err()); err != nil {
			return err
		}
		return nil
	}
	if err := await(fmt.Sprint("getlog-ready-", size)); err != nil {
		return err
	}
	defer labenv.Signal(fmt.Sprint("getlog-done-", size))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := activeaccess.Dial(ctx, addr, &activeaccess.SourceOptions{Name: "bench"})
	if err != nil {
		return err
	}
	defer s.Close()
	ser := newSeries(kinds, 0)
	run := func(kind int) (float64, error) { return getRate(ctx, s, kind*half, gets, size) }
	for k := range kinds { // warm up every path
		if _, err := run(k); err != nil {
			return err
		}
	}
	for r := 0; r < rounds; r++ {
		got := make([]float64, len(kinds))
		for i := range kinds { // rotate which goes first
			k := (i + r) % len(kinds)
			var err error
			if got[k], err = run(k); err != nil {
				return err
			}
		}
		ser.add(fmt.Sprintf("round %d: %d-byte gets/s:", r+1, size), got)
	}
	ser.figures(fmt.Sprintf("getlog_%dB", size), "gets_per_s", "gets/s")
	return nil
}

// getRate issues n gets of size bytes spread over the 64 pages at base,
// as many in flight as the source allows, then flushes (so the logged
// ones were handled and written), and returns gets per second.
func getRate(ctx context.Context, s *activeaccess.Source, base, n, size int) (float64, error) {
	const depth = 32
	ops := make([]*activeaccess.Op, depth)
	bufs := make([][]byte, depth)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		j := i % depth
		if ops[j] != nil {
			if err := ops[j].Wait(ctx); err != nil {
				return 0, err
			}
		}
		off := base + (i*4096+i*64)%(half-size)
		var err error
		if ops[j], err = s.Get(ctx, off, bufs[j]); err != nil {
			return 0, err
		}
	}
	if err := s.Flush(ctx); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
