package kmod_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Make the first page of a registered region an active-put page (the
// paper's W=0, WL=1, WLD=1): remote writes land in the log, not in memory,
// and a handler consumes them.
func Example() {
	dev, err := kmod.Open() // checks the module's ABI
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close() // closes the domain too

	ctx, err := verbs.Open("")
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	pd, _ := ctx.AllocPD()
	mr, err := pd.AllocMR(1<<20, verbs.AccessAll)
	if err != nil {
		log.Fatal(err)
	}

	dom, err := dev.NewDomain(1 << 20) // 1 MiB of log entries
	if err != nil {
		log.Fatal(err)
	}
	if err := dom.Arm(mr.RKey(), mr.Addr(), kmod.PageSize, kmod.WL|kmod.WLD|kmod.R); err != nil {
		log.Fatal(err) // ErrNoRegion if the region were another process's
	}
	// Wake up every 16 entries, or every millisecond while some arrived.
	if err := dom.Notify(kmod.NotifyOptions{Threshold: 16, Interval: time.Millisecond}); err != nil {
		log.Fatal(err)
	}

	// ... peers issue RDMA WRITEs to mr.Remote() ...

	wctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var entries []kmod.Entry
	for wctx.Err() == nil {
		if entries, err = dom.Read(entries[:0], 0); err != nil {
			log.Fatal(err)
		}
		for _, e := range entries {
			fmt.Printf("seq %d: %v of %d bytes at %#x from QP %d\n", e.Seq, e.Op, e.Length, e.IOVA, e.SrcQPN)
		}
		dom.Wait(wctx) // parks in the netpoller until the kernel signals
	}
}

// Module-wide counters, for a daemon's metrics.
func ExampleDevice_Stats() {
	dev, err := kmod.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	st, err := dev.Stats()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Domains, st.Pages, st.Entries, st.RefusedWrites, st.Missed)
}
