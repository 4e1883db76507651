package activeaccess_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
)

// A target whose first 16 pages take inserts: writes never reach memory,
// the handler gets them (the paper's active put, as in its hash table),
// adds each 8-byte key to a local set and replies with the set's size.
func ExampleListen() {
	ctx := context.Background()
	tg, err := activeaccess.Listen(ctx, netip.MustParseAddrPort("10.77.0.1:7500"), 1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tg.Close()
	var mu sync.Mutex
	set := map[uint64]bool{}
	d, err := tg.NewDomain(func(a *activeaccess.Access) {
		mu.Lock()
		defer mu.Unlock()
		for b := a.Data; len(b) >= 8; b = b[8:] {
			set[binary.LittleEndian.Uint64(b)] = true
		}
		a.Reply(uint64(len(set)))
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Associate(0, 16*4096, activeaccess.Intercept); err != nil {
		log.Fatal(err)
	}
	time.Sleep(time.Minute) // serve
}

// A source inserting keys with active puts, then waiting until the
// target's handler processed them all and reading the replies.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := activeaccess.Dial(ctx, netip.MustParseAddrPort("10.77.0.1:7500"), &activeaccess.SourceOptions{Name: "inserter"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	for k := uint64(1); k <= 100; k++ {
		b := binary.LittleEndian.AppendUint64(nil, k)
		if _, err := s.Put(ctx, int(k%512)*8, b); err != nil {
			log.Fatal(err)
		}
	}
	if err := s.Flush(ctx); err != nil { // every insert was handled
		log.Fatal(err)
	}
	var last activeaccess.Reply
	for s.Replies() > 0 {
		if last, err = s.Reply(ctx); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("keys at the target:", last.Value)
}

// A target in the library-mediated mode (no kernel module needed), with
// a polling domain that counts every access to its pages without their
// data and leaves memory behaving as usual.
func ExampleTarget_NewDomain() {
	ctx := context.Background()
	tg, err := activeaccess.Listen(ctx, netip.MustParseAddrPort("10.77.0.1:7500"), 1<<20,
		&activeaccess.TargetOptions{Mode: activeaccess.ModeMediated, MaxSources: 8})
	if err != nil {
		log.Fatal(err)
	}
	defer tg.Close()
	var puts, gets atomic.Int64
	d, err := tg.NewDomain(func(a *activeaccess.Access) {
		switch a.Kind {
		case activeaccess.KindPut:
			puts.Add(1)
		case activeaccess.KindGet:
			gets.Add(1)
		}
	}, &activeaccess.DomainOptions{Notify: activeaccess.Poll, PollIdle: time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	if err := d.Associate(0, 1<<20, activeaccess.Count); err != nil {
		log.Fatal(err)
	}
	mem := tg.Memory() // the exposed memory, off the Go heap
	copy(mem, "hello")
	time.Sleep(time.Minute) // serve
	fmt.Println("puts:", puts.Load(), "gets:", gets.Load())
}

// Active and plain accesses side by side: an active get, which the
// target's handler sees, waited for on its own; plain puts, which no
// handler sees, covered by their own flush.
func ExampleSource_GetWait() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := activeaccess.Dial(ctx, netip.MustParseAddrPort("10.77.0.1:7500"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	buf := make([]byte, 64)
	if err := s.GetWait(ctx, 128, buf); err != nil { // buf is filled
		log.Fatal(err)
	}
	for off := 64 << 10; off < 128<<10; off += 4096 {
		if _, err := s.PutPlain(ctx, off, buf); err != nil {
			log.Fatal(err)
		}
	}
	if err := s.FlushPlain(ctx); err != nil { // the plain puts are in memory
		log.Fatal(err)
	}
}

// The errors a caller branches on: the target's refusal to connect, the
// end of the connection, and the caller's own context.
func ExampleRejectError() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := activeaccess.Dial(ctx, netip.MustParseAddrPort("10.77.0.1:7500"), nil)
	var rej *activeaccess.RejectError
	switch {
	case errors.As(err, &rej) && rej.Reason == activeaccess.RejectTooMany:
		log.Fatal("the target serves its maximum of sources; try later")
	case err != nil:
		log.Fatal(err)
	}
	defer s.Close()
	err = s.PutWait(ctx, 0, []byte("ping"))
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		log.Print("our deadline passed; the put may still complete")
	case errors.Is(err, activeaccess.ErrDisconnected):
		log.Print("the target went away")
	case err != nil:
		log.Fatal(err)
	}
}
