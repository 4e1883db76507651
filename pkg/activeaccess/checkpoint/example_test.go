package checkpoint_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/checkpoint"
)

// A target that checkpoints its 1 MiB into numbered files, each holding
// only the pages written (remotely or locally) since the one before, and
// how memory is restored from them.
func Example() {
	tg, err := activeaccess.Listen(context.Background(), netip.MustParseAddrPort("10.77.0.1:7600"), 1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tg.Close()
	tr, err := checkpoint.New(tg, 0, 1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	var files []*os.File
	for i := 1; i <= 3; i++ {
		// ... the application computes, sources put; then at a
		// synchronisation point (every source flushed):
		f, err := os.Create(fmt.Sprintf("/var/lib/ckpt/%d", i))
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		info, err := tr.Checkpoint(context.Background(), f)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("checkpoint %d: %d pages\n", info.Seq, info.Pages)
		files = append(files, f)
	}
	// After a failure: the full image, then the incremental ones in order.
	mem := tg.Memory()
	for _, f := range files {
		f.Seek(0, 0)
	}
	if _, err := checkpoint.Restore(context.Background(), mem, files[0], files[1], files[2]); err != nil {
		log.Fatal(err)
	}
}
