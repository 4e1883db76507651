// Package jbmt is the application's interface to JBMT, an RDMA service
// over memory that is never pinned for long (docs/jbmt.md): a process
// registers any range of its memory, of any size and whatever its
// RLIMIT_MEMLOCK, and hands the region's token to peers, which get from it
// and put into it. Pages are pinned, on both hosts, for the sections of a
// transfer that move them, under each host's pin budget; the module may
// keep them pinned after (its pin cache) while their mapping is unchanged,
// and Service.Advise and Region.Advise pin a range ahead of use.
//
//	s, _ := jbmt.Open(nil)
//	mem, _ := jbmt.Alloc(1 << 30)       // outside the Go heap
//	r, _ := s.Register(mem, jbmt.Read)  // pins nothing, O(1)
//	tok, _ := r.Token().MarshalBinary() // give it to peers
//
//	// on a peer host:
//	p, _ := s.Dial(ctx, netip.MustParseAddrPort("10.0.0.1:0"))
//	n, err := p.Get(ctx, dst, tok, 0)    // blocking, any []byte
//	err = p.StartGet(dst, tok, 0, 7)     // asynchronous: tag 7
//	err = s.Wait(ctx)                    // parks in the netpoller
//	k := s.Poll(completions)             // Completion{Tag: 7, N: ...}
//
// Memory to register must stay mapped while it is registered: Alloc gives
// such memory outside the Go heap. Memory of the Go heap must not be
// registered (the collector may free it and reuse it for another object).
// The local buffer of a transfer may be any memory, the Go heap included:
// a blocking call pins it while it runs, and an asynchronous one keeps it
// reachable until its completion is polled.
//
// A refused transfer (a bad or revoked token, missing rights, a range
// outside the region, unmapped pages) fails alone, and the connection
// stays up; only ErrPeerGone means it went down. Errors a caller must
// branch on wrap the sentinel errors below (errors.Is).
package jbmt
