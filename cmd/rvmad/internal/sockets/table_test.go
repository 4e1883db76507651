package sockets

import (
	"errors"
	"testing"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

func tup(port uint16) sockwire.Tuple {
	return sockwire.Tuple{Family: sockwire.AFInet6, LocalPort: port, RemotePort: 9, Local: [16]byte{15: 1}, Remote: [16]byte{15: 2}}
}

func TestTable(t *testing.T) {
	tb := newTable(2)
	a1, a2, b := &client{uid: 1000}, &client{uid: 1000}, &client{uid: 1001}

	if err := tb.register(a1, tup(1), 11); err != nil {
		t.Fatal(err)
	}
	if err := tb.register(a1, tup(1), 11); err != nil || tb.len() != 1 || tb.perUID[1000] != 1 {
		t.Fatalf("registering twice: %v, %d, %v", err, tb.len(), tb.perUID)
	}
	if err := tb.register(a2, tup(2), 12); err != nil {
		t.Fatal(err)
	}
	if err := tb.register(a1, tup(3), 13); !errors.Is(err, errLimit) {
		t.Fatalf("third of uid 1000: %v, want errLimit", err)
	}
	// At the cap, a connection moving between two processes of the user is not a new one.
	if err := tb.register(a2, tup(1), 11); err != nil || tb.lookup(tup(1)).owner != a2 || tb.perUID[1000] != 2 {
		t.Fatalf("moving tup(1) to a2: %v, %+v, %v", err, tb.lookup(tup(1)), tb.perUID)
	}
	if tb.owned(a1, tup(1)) != nil || tb.owned(a2, tup(1)) == nil {
		t.Fatal("owned after the move")
	}
	// Another user takes a connection over (fd passing, setuid exec): the count moves.
	if err := tb.register(b, tup(2), 12); err != nil || tb.perUID[1000] != 1 || tb.perUID[1001] != 1 {
		t.Fatalf("moving tup(2) to uid 1001: %v, %v", err, tb.perUID)
	}
	// A refreshed inode (the tuple's socket is a new one) clears what was pending.
	tb.lookup(tup(2)).pending = 5
	if err := tb.register(b, tup(2), 99); err != nil || tb.lookup(tup(2)).pending != 0 || tb.lookup(tup(2)).inode != 99 {
		t.Fatalf("refresh: %v, %+v", err, tb.lookup(tup(2)))
	}

	gone := tb.dropClient(a2)
	if len(gone) != 1 || gone[0].tuple != tup(1) || tb.lookup(tup(1)) != nil || tb.perUID[1000] != 0 {
		t.Fatalf("dropClient: %v, %v", gone, tb.perUID)
	}
	if len(tb.dropClient(a1)) != 0 {
		t.Fatal("a1 had nothing left")
	}
	tb.remove(tb.lookup(tup(2)))
	if tb.len() != 0 || len(tb.perUID) != 0 || len(tb.byClient) != 0 {
		t.Fatalf("not empty: %d %v %v", tb.len(), tb.perUID, tb.byClient)
	}
}

// A dual-stack listener's connection (an AF_INET6 socket talking IPv4)
// is found by the tuple its IPv4 peer sends, and keeps its owner's view.
func TestTableDualStack(t *testing.T) {
	tb := newTable(4)
	c := &client{uid: 1000}
	v6 := sockwire.Tuple{Family: sockwire.AFInet6, LocalPort: 5201, RemotePort: 40000,
		Local:  [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 77, 15: 1},
		Remote: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 77, 15: 2}}
	v4 := v6
	v4.Family = sockwire.AFInet
	if err := tb.register(c, v6, 7); err != nil {
		t.Fatal(err)
	}
	r := tb.lookup(v4)
	if r == nil || r.tuple != v6 || tb.owned(c, v4) != r {
		t.Fatalf("lookup of the IPv4 view: %+v", r)
	}
	if l, rem := addrs(v6); !l.Is4() || !rem.Is4() {
		t.Fatalf("addrs of a mapped AF_INET6 tuple: %v %v, want IPv4", l, rem)
	}
	tb.remove(r)
	if tb.len() != 0 || tb.lookup(v6) != nil {
		t.Fatal("remove")
	}
	// A real IPv6 connection keeps its family.
	six := tup(1)
	if key(six) != six {
		t.Fatal("key changed an IPv6 tuple")
	}
}
