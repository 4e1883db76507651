package dht_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht"
)

// A target serving the Active Access table, with a polling handler, for
// an hour; then it checks what the sources stored.
func ExampleServe() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	l := dht.Layout{Buckets: 16384, Heap: 4096}
	tg, err := dht.Serve(ctx, dht.KindAA, netip.MustParseAddrPort("10.77.0.1:7700"), l,
		&dht.TargetOptions{Notify: activeaccess.Poll})
	if err != nil {
		log.Fatal(err)
	}
	defer tg.Close()
	<-ctx.Done()
	seen, err := tg.Volume().Contents()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d keys stored, %d in the overflow heap\n", len(seen), tg.Volume().HeapUsed())
}

// A source inserting its share of a workload into any of the three
// tables, then looking a key up.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tb, err := dht.Dial(ctx, dht.KindAA, netip.MustParseAddrPort("10.77.0.1:7700"), &dht.SourceOptions{Name: "source-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer tb.Close()
	w, err := dht.Workload(3000, tb.Layout(), 0.05, 1)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range dht.Share(w, 0, 2) { // source 0 of 2
		if err := tb.Insert(ctx, p.Key, p.Value); err != nil {
			log.Fatal(err)
		}
	}
	if err := tb.Flush(ctx); err != nil { // ErrFull: some inserts found the heap full
		log.Fatal(err)
	}
	v, ok, err := tb.Lookup(ctx, w[0].Key)
	fmt.Println(v, ok, err)
}
