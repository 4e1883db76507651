package jbmt_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

// A host serves 1 GiB it never pins: registering takes the same time at
// any size, and the token is all a peer needs.
func ExampleService_Register() {
	s, err := jbmt.Open(nil)
	if err != nil {
		log.Fatal(err) // ErrNotSupported without the rdmaplus module
	}
	defer s.Close()
	mem, err := jbmt.Alloc(1 << 30) // outside the Go heap, no swap reserved
	if err != nil {
		log.Fatal(err)
	}
	defer jbmt.Free(mem)
	r, err := s.Register(mem, jbmt.Read|jbmt.Write)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	tok, _ := r.Token().MarshalBinary()
	fmt.Printf("give the peer these %d bytes: %x\n", len(tok), tok)
}

// A peer gets 4 MiB of a region into a Go slice and puts them back at
// another offset. A refused transfer fails alone; only ErrPeerGone means
// the connection is down.
func ExamplePeer_Get() {
	var tok jbmt.Token // from the region's owner (Token.UnmarshalBinary)
	s, err := jbmt.Open(nil)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := s.Dial(ctx, netip.MustParseAddrPort("10.77.0.1:0")) // port 0: the module's
	if err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 4<<20)
	n, err := p.Get(ctx, buf, tok, 0)
	switch {
	case errors.Is(err, jbmt.ErrStale):
		log.Printf("the owner revoked the region after %d bytes: ask it for a new token", n)
	case errors.Is(err, jbmt.ErrBadToken), errors.Is(err, jbmt.ErrRange):
		log.Printf("refused after %d bytes: %v", n, err) // the connection is still up
	case errors.Is(err, jbmt.ErrPeerGone):
		log.Fatal(err) // Dial again to make a new connection
	case err != nil:
		log.Fatal(err)
	}
	if _, err := p.Put(ctx, buf, tok, 4<<20); err != nil {
		log.Fatal(err)
	}
}

// Eight gets in flight at once, their completions found by Wait (which
// parks in the netpoller) and Poll.
func ExamplePeer_StartGet() {
	var tok jbmt.Token // from the region's owner
	s, err := jbmt.Open(nil)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	p, err := s.Dial(ctx, netip.MustParseAddrPort("10.77.0.1:0"))
	if err != nil {
		log.Fatal(err)
	}
	const each = 1 << 20
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, each) // not to be touched until its completion
		if err := p.StartGet(bufs[i], tok, uint64(i*each), uint64(i)); err != nil {
			log.Fatal(err) // ErrBusy: the ring is full; Poll first
		}
	}
	cs := make([]jbmt.Completion, 8)
	for done := 0; done < 8; {
		if err := s.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		n := s.Poll(cs)
		for _, c := range cs[:n] {
			if c.Err != nil {
				log.Printf("get %d: %v", c.Tag, c.Err)
			}
			fmt.Printf("get %d: %d bytes, first answer after %v\n", c.Tag, c.N, c.FirstAnswer-c.Started)
		}
		done += n
	}
}

// The owner of a region about to be read by peers, and a reader about to
// get into a buffer many times, pin ahead of use: the first transfer then
// finds every section's pages pinned on both hosts. Advice is a hint: it
// stops where the pin budget ends, without an error.
func ExampleRegion_Advise() {
	s, err := jbmt.Open(nil)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	mem, err := jbmt.Alloc(64 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer jbmt.Free(mem)
	r, err := s.Register(mem, jbmt.Read)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	n, err := r.Advise(0, len(mem)) // served to peers
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d of %d bytes pinned ahead\n", n, len(mem))

	// on the reader: its buffer, for gets into it
	buf, err := jbmt.Alloc(4 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer jbmt.Free(buf)
	if _, err := s.Advise(buf, jbmt.Write); err != nil {
		log.Fatal(err)
	}
}
