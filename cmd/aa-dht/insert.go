package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht"
)

// insert inserts this source's share of the workload, flushes, and prints
// the rate; then looks some keys up.
func insert(args []string) error {
	var c common
	fs := flag.NewFlagSet("insert", flag.ExitOnError)
	c.register(fs)
	source := fs.Int("source", 0, "this source's index")
	sources := fs.Int("sources", 1, "how many sources share the workload")
	lookups := fs.Int("lookups", 0, "look this many of the inserted keys up afterwards, and print them")
	fs.Parse(args)
	if _, err := c.options(); err != nil {
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
	if *source < 0 || *source >= *sources {
		return fmt.Errorf("-source %d of -sources %d", *source, *sources)
	}
	share := dht.Share(w, *source, *sources)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tb, err := dht.Dial(ctx, dht.Kind(c.table), addr, &dht.SourceOptions{Name: fmt.Sprintf("aa-dht-%d", *source)})
	if err != nil {
		return err
	}
	defer tb.Close()
	stop, err := c.profile()
	if err != nil {
		return err
	}
	start := time.Now()
	for _, p := range share {
		if err := tb.Insert(ctx, p.Key, p.Value); err != nil {
			return err
		}
	}
	if err := tb.Flush(ctx); err != nil {
		return err
	}
	d := time.Since(start)
	stop()
	fmt.Printf("inserts=%d seconds=%.4f rate=%.1f table=%s collisions=%.2f", len(share), d.Seconds(),
		float64(len(share))/d.Seconds(), c.table, c.collisions)
	if aa, ok := tb.(*dht.AATable); ok {
		// How the Source posted: chains (system calls) and completions asked for.
		st := aa.Source().Stats()
		fmt.Printf(" posts=%d signaled=%d unsignaled=%d markers=%d", st.Posts, st.Signaled, st.Unsignaled, st.Markers)
	}
	fmt.Println()
	for _, p := range share[:min(*lookups, len(share))] {
		v, ok, err := tb.Lookup(ctx, p.Key)
		if err != nil {
			return err
		}
		if !ok || v != p.Value {
			return fmt.Errorf("lookup of key %d: found %v, value %d, want %d", p.Key, ok, v, p.Value)
		}
		fmt.Printf("lookup %d -> %d (bucket %d)\n", p.Key, v, tb.Layout().Bucket(p.Key))
	}
	return nil
}
