package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht"
)

// serve runs a target until -until exists or a signal, then checks the
// volume against the workload.
func serve(args []string) error {
	var c common
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	c.register(fs)
	until := fs.String("until", "", "serve until this file exists")
	nocheck := fs.Bool("nocheck", false, "do not check the volume against the workload at the end")
	fs.Parse(args)
	opts, err := c.options()
	if err != nil {
		return err
	}
	addr, err := netip.ParseAddrPort(c.addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	w, err := c.workload()
	if err != nil {
		return err
	}
	sctx, cancelSetUp := context.WithTimeout(context.Background(), time.Minute)
	tg, err := dht.Serve(sctx, dht.Kind(c.table), addr, c.layout(), opts)
	cancelSetUp()
	if err != nil {
		return err
	}
	defer tg.Close()
	stop, err := c.profile()
	if err != nil {
		return err
	}
	fmt.Printf("serving the %s table (%d buckets, %d heap cells) on %v\n", c.table, c.buckets, c.heap, addr)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	for ctx.Err() == nil {
		if *until != "" {
			if _, err := os.Stat(*until); err == nil {
				break
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond): // a stat on the lab's 9p share costs the target CPU
		}
	}
	stop()
	if err := tg.Err(); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if *nocheck {
		return nil
	}
	return check(tg.Volume(), w)
}

// check verifies that v holds exactly the workload w, each key once with
// its value.
func check(v *dht.Volume, w []dht.Pair) error {
	seen, err := v.Contents()
	if err != nil {
		return err
	}
	total := 0
	for _, n := range seen {
		total += n
	}
	var errs []error
	for _, p := range w {
		if n := seen[p]; n != 1 {
			errs = append(errs, fmt.Errorf("key %d with value %d found %d times", p.Key, p.Value, n))
			if len(errs) > 5 {
				break
			}
		}
	}
	if total != len(w) {
		errs = append(errs, fmt.Errorf("%d elements stored, the workload has %d", total, len(w)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("checked: all %d keys found exactly once with their values; %d in the overflow heap\n", len(w), v.HeapUsed())
	return nil
}
