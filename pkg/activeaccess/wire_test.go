package activeaccess

import (
	"bytes"
	"errors"
	"testing"
)

func TestHelloRoundTrip(t *testing.T) {
	h := hello{Version: protoVersion, Modes: 1 << ModeTransparent, Name: "guest-2", QPN: 0x123456}
	b := h.marshal()
	if len(b) != helloLen || len(b) > 56 {
		t.Fatalf("hello is %d bytes; rdma_cm carries at most 56 in a connect", len(b))
	}
	// rdma_cm pads private data with zeros.
	got, err := parseHello(append(b, make([]byte, 8)...))
	if err != nil || got != h {
		t.Fatalf("parseHello = %+v, %v; want %+v", got, err, h)
	}
	full := hello{Version: 1, Name: string(bytes.Repeat([]byte("x"), nameLen))}
	if got, _ := parseHello(full.marshal()); got.Name != full.Name {
		t.Fatalf("a %d-byte name came back as %q", nameLen, got.Name)
	}
	for _, bad := range [][]byte{nil, b[:helloLen-1], append([]byte("XXh1"), b[4:]...), []byte("first\x00\x00")} {
		if _, err := parseHello(bad); !errors.Is(err, ErrProtocol) {
			t.Errorf("parseHello(%q) = %v, want ErrProtocol", bad, err)
		}
	}
}

func validGrant() grant {
	return grant{Version: protoVersion, Mode: ModeTransparent, SourceID: 3, RKey: 0x1234, Addr: 0x7f0000001000,
		Len: 1 << 20, Credits: 65536, MaxEntry: maxEntry, Window: 16, MsgSize: msgSize}
}

func TestGrantRoundTrip(t *testing.T) {
	g := validGrant()
	b := g.marshal()
	if len(b) != grantLen || len(b) > msgSize {
		t.Fatalf("grant is %d bytes", len(b))
	}
	got, err := parseGrant(append(b, 0, 0, 0))
	if err != nil || got != g {
		t.Fatalf("parseGrant = %+v, %v; want %+v", got, err, g)
	}
	bad := map[string]func(*grant){
		"version":     func(g *grant) { g.Version = protoVersion + 1 },
		"mode":        func(g *grant) { g.Mode = 7 },
		"no inbox":    func(g *grant) { g.Mode = ModeMediated; g.InboxAddr = 0 },
		"no max get":  func(g *grant) { g.Mode = ModeMediated; g.InboxAddr = 1 },
		"empty":       func(g *grant) { g.Len = 0 },
		"wraps":       func(g *grant) { g.Addr = ^uint64(0) - 10 },
		"window":      func(g *grant) { g.Window = 0 },
		"msg size":    func(g *grant) { g.MsgSize = msgSize + 1 },
		"max entry":   func(g *grant) { g.MaxEntry = 10 },
		"few credits": func(g *grant) { g.Credits = maxEntry - 1 },
	}
	for name, f := range bad {
		g := validGrant()
		f(&g)
		if _, err := parseGrant(g.marshal()); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: parseGrant = %v, want ErrProtocol", name, err)
		}
	}
	if _, err := parseGrant(b[:grantLen-1]); !errors.Is(err, ErrProtocol) {
		t.Errorf("short grant: %v", err)
	}
	if _, err := parseGrant(marshalRefusal(RejectTooMany)); !errors.Is(err, ErrProtocol) {
		t.Errorf("a refusal parsed as a grant: %v", err)
	}
}

func TestRefusal(t *testing.T) {
	for r := RejectVersion; r <= rejectReasonLast; r++ {
		if got := parseRefusal(append(marshalRefusal(r), 0, 0)); got != r {
			t.Errorf("refusal %v came back as %v", r, got)
		}
		if r.String() == "" {
			t.Errorf("reason %d has no name", r)
		}
	}
	if got := parseRefusal([]byte("go away")); got != 0 {
		t.Errorf("foreign reject data parsed as %v", got)
	}
	b := marshalRefusal(RejectTooMany)
	le.PutUint16(b[6:], 999)
	if got := parseRefusal(b); got != 0 {
		t.Errorf("unknown reason parsed as %v", got)
	}
	e := &RejectError{Reason: RejectTooMany}
	if !errors.Is(e, ErrRejected) || e.Error() == "" {
		t.Errorf("RejectError: %v", e)
	}
}

func TestMarkerRoundTrip(t *testing.T) {
	b := make([]byte, msgSize)
	for _, m := range []marker{{Epoch: 1}, {Epoch: 1 << 40, Flush: true}} {
		n := m.put(b)
		got, err := parseMarker(b[:n])
		if err != nil || got != m {
			t.Errorf("marker %+v came back as %+v, %v", m, got, err)
		}
	}
	marker{Epoch: 5}.put(b)
	le.PutUint64(b[8:], 0)
	if _, err := parseMarker(b[:markerLen]); !errors.Is(err, ErrProtocol) {
		t.Errorf("epoch 0: %v", err)
	}
	if _, err := parseMarker(b[:markerLen-1]); !errors.Is(err, ErrProtocol) {
		t.Errorf("short marker: %v", err)
	}
	status{Acked: 1}.put(b)
	if _, err := parseMarker(b[:markerLen]); !errors.Is(err, ErrProtocol) {
		t.Errorf("a status parsed as a marker: %v", err)
	}
}

func TestStatusRoundTrip(t *testing.T) {
	b := make([]byte, msgSize)
	var reps []Reply
	for i := 0; i < maxReplies; i++ {
		reps = append(reps, Reply{Offset: uint64(i * 64), Value: uint64(i) << 33})
	}
	for _, s := range []status{{}, {Acked: 7, Processed: 1000}, {Acked: 0, Processed: 3, Replies: reps[:1]}, {Acked: 9, Replies: reps}} {
		n := s.put(b)
		if n > msgSize {
			t.Fatalf("status of %d replies is %d bytes", len(s.Replies), n)
		}
		prev := []Reply{{Offset: 1, Value: 1}}
		got, all, err := parseStatus(b[:n], prev)
		if err != nil || got.Acked != s.Acked || got.Processed != s.Processed {
			t.Fatalf("status %+v came back as %+v, %v", s, got, err)
		}
		if len(all) != 1+len(s.Replies) || all[0] != prev[0] {
			t.Fatalf("replies appended wrongly: %v", all)
		}
		for i, r := range s.Replies {
			if all[1+i] != r {
				t.Fatalf("reply %d: %+v, want %+v", i, all[1+i], r)
			}
		}
	}
	n := status{Replies: reps[:3]}.put(b)
	if _, _, err := parseStatus(b[:n-1], nil); !errors.Is(err, ErrProtocol) {
		t.Errorf("truncated replies: %v", err)
	}
	b[1] = maxReplies + 1
	if _, _, err := parseStatus(b, nil); !errors.Is(err, ErrProtocol) {
		t.Errorf("too many replies: %v", err)
	}
	marker{Epoch: 1}.put(b)
	if _, _, err := parseStatus(b, nil); !errors.Is(err, ErrProtocol) {
		t.Errorf("a marker parsed as a status: %v", err)
	}
}

func TestWCErrorMapping(t *testing.T) {
	if wcError(nil, nil) != nil {
		t.Error("nil completion error mapped to an error")
	}
}

func TestMediatedGrant(t *testing.T) {
	g := validGrant()
	g.Mode, g.InboxAddr, g.InboxRKey, g.MaxGet, g.MaxEntry = ModeMediated, 0x7f0000200000, 77, 1<<18, 0
	got, err := parseGrant(g.marshal())
	if err != nil || got != g {
		t.Fatalf("parseGrant = %+v, %v; want %+v", got, err, g)
	}
}

func TestEntryRoundTrip(t *testing.T) {
	b := make([]byte, 4096)
	for _, e := range []entry{{Kind: entryPut, Off: 100, Len: 3000}, {Kind: entryGet, Off: 0, Len: 1 << 16, ReplyAddr: 0x1000, ReplyRKey: 9, Op: 1 << 31}} {
		e.put(b)
		got, err := parseEntry(b, 1<<20)
		if err != nil || got != e {
			t.Errorf("entry %+v came back as %+v, %v", e, got, err)
		}
	}
	bad := []struct {
		e    entry
		left int
	}{
		{entry{Kind: 3, Len: 1}, 4096},
		{entry{Kind: entryPut, Len: 0}, 4096},
		{entry{Kind: entryPut, Off: 1 << 20, Len: 1}, 4096},
		{entry{Kind: entryGet, Off: 1<<20 - 10, Len: 11}, 4096},
		{entry{Kind: entryPut, Len: 4096 - 63}, 4096},
		{entry{Kind: entryPut, Len: 8}, 63},
	}
	for _, c := range bad {
		c.e.put(b)
		if _, err := parseEntry(b[:c.left], 1<<20); !errors.Is(err, ErrProtocol) {
			t.Errorf("entry %+v with %d bytes left: %v", c.e, c.left, err)
		}
	}
	if inboxCost(true, 1) != 128 || inboxCost(true, 64) != 128 || inboxCost(false, 1<<20) != 64 {
		t.Error("inboxCost")
	}
}
