package activeaccess_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
)

// A target whose first 16 pages take inserts: writes never reach memory,
// the handler gets them (the paper's active put, as in its hash table),
// adds each 8-byte key to a local set and replies with the set's size.
func ExampleListen() {
	tg, err := activeaccess.Listen(netip.MustParseAddrPort("10.77.0.1:7500"), &activeaccess.TargetConfig{Size: 1 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer tg.Close()
	var mu sync.Mutex
	set := map[uint64]bool{}
	d, err := tg.NewDomain(activeaccess.DomainConfig{Handler: func(a *activeaccess.Access) {
		mu.Lock()
		defer mu.Unlock()
		for b := a.Data; len(b) >= 8; b = b[8:] {
			set[binary.LittleEndian.Uint64(b)] = true
		}
		a.Reply(uint64(len(set)))
	}})
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Associate(0, 16*4096, activeaccess.Intercept); err != nil {
		log.Fatal(err)
	}
	time.Sleep(time.Minute) // serve
}

// A source inserting keys with active puts, then waiting until the
// target's handler processed them all.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := activeaccess.Dial(ctx, netip.MustParseAddrPort("10.77.0.1:7500"), &activeaccess.SourceConfig{Name: "inserter"})
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
