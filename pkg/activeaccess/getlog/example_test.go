package getlog_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/getlog"
)

// The target: 1 MiB whose gets are logged to /var/lib/getlog, replays
// served on TCP port 7601.
func ExampleNew() {
	tg, err := activeaccess.Listen(context.Background(), netip.MustParseAddrPort("10.77.0.1:7600"), 1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tg.Close()
	l, err := getlog.New(tg, 0, 1<<20, "/var/lib/getlog", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ln, err := net.Listen("tcp", "10.77.0.1:7601")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(l.ServeReplay(context.Background(), ln))
}

// A restarted reader: it replays the gets it made before its crash from
// the target's log, then goes on live.
func ExampleRecover() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := activeaccess.Dial(ctx, netip.MustParseAddrPort("10.77.0.1:7600"), &activeaccess.SourceOptions{Name: "reader-7"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	r, err := getlog.Recover(ctx, s, "10.77.0.1:7601", "reader-7")
	if err != nil {
		log.Fatal(err)
	}
	get := func(off int, dst []byte) error { // the reader's gets, replayed first
		if r != nil {
			err := r.Get(off, dst)
			if !errors.Is(err, io.EOF) {
				return err
			}
			r = nil // caught up
		}
		return s.GetWait(ctx, off, dst)
	}
	buf := make([]byte, 64)
	for off := 0; off < 4096; off += 64 { // re-execute the work
		if err := get(off, buf); err != nil {
			log.Fatal(err)
		}
	}
}
