package perftest_test

import (
	"context"
	"log"
	"net"
	"net/netip"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/perftest"
)

// A target whose first page counts every write perftest makes to it:
// run "ib_write_bw -x 1 -s 4096 -n 1000 10.77.0.1" on another host.
func Example() {
	tg, err := activeaccess.Listen(context.Background(), netip.MustParseAddrPort("10.77.0.1:7500"), 1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tg.Close()
	var writes, bytes atomic.Int64 // the handler runs on the domain's goroutine
	d, err := tg.NewDomain(func(a *activeaccess.Access) {
		writes.Add(1)
		bytes.Add(int64(a.Length))
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Associate(0, 4096, activeaccess.Count); err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "10.77.0.1:18515") // perftest's default port
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT)
	defer stop()
	err = perftest.Serve(ctx, ln, tg, &perftest.Options{Offset: 0})
	log.Printf("%v; %d writes, %d bytes", err, writes.Load(), bytes.Load())
}
