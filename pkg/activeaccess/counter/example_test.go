package counter_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/counter"
)

// A target that exposes 1 MiB and counts the remote puts and gets of its
// first 64 pages, printing the busiest page every ten seconds.
func Example() {
	tg, err := activeaccess.Listen(context.Background(), netip.MustParseAddrPort("10.77.0.1:7600"), 1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tg.Close()
	c, err := counter.New(tg, 0, 64*counter.Page, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for range time.Tick(10 * time.Second) {
		best, most := 0, uint64(0)
		for p, n := range c.All() {
			if n.Puts+n.Gets > most {
				best, most = p, n.Puts+n.Gets
			}
		}
		fmt.Printf("page %d: %+v\n", best, c.All()[best])
	}
}
