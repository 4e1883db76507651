//go:build lab

package sockets_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/sockets"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// The suite test/softroce/suites/sockets-interop.sh runs these against
// the C shim (cmd/sockpreload) on the other guest, both guests running
// rvmad's sockets broker, to show that the two implementations of
// docs/sockets.md talk to each other over RDMA. The peer is the
// unmodified program bulk (cmd/sockpreload/test/bulk.c) under the shim;
// these tests speak its protocol: the client sends a 24-byte header
// {bytes, rounds, size} (little-endian uint64s), then bytes bytes of the
// pattern with seed 1; the server sends bytes bytes with seed 2; then
// rounds ping-pongs of size bytes (client seed 10+i, server 20+i); then
// the client closes. Every byte is checked.
//
//	SOCKETS_INTEROP_DIAL=ADDR:PORT  TestLabInteropClient dials a bulk server there
//	SOCKETS_INTEROP_LISTEN=PORT     TestLabInteropServer serves one bulk client
//	SOCKETS_INTEROP_BYTES, _ROUNDS, _SIZE  the transfer (default 16 MiB, 1000, 64)
//	SOCKETS_INTEROP_RING            the Go side's Options.RingSize (default: the default)
//
// Without their variable the tests skip (they need the suite's peer).

// bulkPat is bulk.c's pat(): the byte at stream offset off of seed.
func bulkPat(off uint64, seed uint64) byte {
	return byte(((off+1)*0x9e3779b97f4a7c15 ^ seed) >> 29)
}

func bulkPattern(n, seed uint64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = bulkPat(uint64(i), seed)
	}
	return b
}

type bulkParams struct{ bytes, rounds, size uint64 }

// interopOptions are the Go side's options: its ring size from
// SOCKETS_INTEROP_RING.
func interopOptions(t *testing.T) *sockets.Options {
	t.Helper()
	o := &sockets.Options{}
	if s := os.Getenv("SOCKETS_INTEROP_RING"); s != "" {
		n, err := strconv.ParseUint(s, 0, 32)
		if err != nil {
			t.Fatalf("SOCKETS_INTEROP_RING=%q: %v", s, err)
		}
		o.RingSize = int(n)
	}
	return o
}

func interopParams(t *testing.T) bulkParams {
	t.Helper()
	p := bulkParams{bytes: 16 * mib, rounds: 1000, size: 64}
	for _, v := range []struct {
		name string
		to   *uint64
	}{{"SOCKETS_INTEROP_BYTES", &p.bytes}, {"SOCKETS_INTEROP_ROUNDS", &p.rounds}, {"SOCKETS_INTEROP_SIZE", &p.size}} {
		if s := os.Getenv(v.name); s != "" {
			n, err := strconv.ParseUint(s, 0, 64)
			if err != nil {
				t.Fatalf("%s=%q: %v", v.name, s, err)
			}
			*v.to = n
		}
	}
	return p
}

// writeAll writes p in pieces of at most 64 KiB (as bulk.c does).
func writeAll(t *testing.T, c *sockets.Conn, p []byte, what string) {
	t.Helper()
	for off := 0; off < len(p); {
		n, err := c.Write(p[off:min(len(p), off+64<<10)])
		off += n
		if err != nil {
			t.Fatalf("%s: write at %d of %d: %v (path %+v, stats %+v)", what, off, len(p), err, c.Path(), c.Stats())
		}
	}
}

// readCheck reads exactly len(want) bytes and checks each.
func readCheck(t *testing.T, c *sockets.Conn, buf, want []byte, what string) {
	t.Helper()
	got := buf[:len(want)]
	for off := 0; off < len(got); {
		n, err := c.Read(got[off:min(len(got), off+64<<10)])
		off += n
		if err != nil {
			t.Fatalf("%s: read at %d of %d: %v (path %+v, stats %+v)", what, off, len(want), err, c.Path(), c.Stats())
		}
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("%s: byte %d of %d is %d, want %d (stats %+v)", what, i, len(want), got[i], want[i], c.Stats())
	}
}

// expectEOF reads once more and wants end of file.
func expectEOF(t *testing.T, c *sockets.Conn, what string) {
	t.Helper()
	var b [1]byte
	if n, err := c.Read(b[:]); n != 0 || err != io.EOF {
		t.Fatalf("%s: after the last byte: %d, %v; want end of file (stats %+v)", what, n, err, c.Stats())
	}
}

// proveRDMA checks the transfer of p went by RDMA: rxe's counters moved
// by at least its packets each way, TCP by (almost) nothing, and the
// connection's counters say the bytes went through rings.
//
// The header may go over TCP: the shim's bulk client writes it right
// after connecting, before its attachment is up (it waits afterwards);
// every byte of the timed transfer must go through rings.
func proveRDMA(t *testing.T, who string, c *sockets.Conn, p bulkParams, before, after counters, el time.Duration, wantWritten, wantRead uint64) {
	t.Helper()
	st := c.Stats()
	mtu := uint64(activeMTU(t))
	sent, rcvd := after.rdmaSent-before.rdmaSent, after.rdmaRcvd-before.rdmaRcvd
	out, in := after.tcpOut-before.tcpOut, after.tcpIn-before.tcpIn
	ring := os.Getenv("SOCKETS_INTEROP_RING")
	if ring == "" {
		ring = "default"
	}
	fmt.Printf("interop %s (guest %s, ring %s): %d bytes each way and %d ping-pongs of %d B in %v: rxe sent_pkts +%d rcvd_pkts +%d; TCP OutSegs +%d InSegs +%d; Go stats ReadRDMA=%d WrittenRDMA=%d ReadTCP=%d WrittenTCP=%d RDMAWrites=%d Upgrades=%d Demotes=%v Fallbacks=%v\n",
		who, labenv.Role(), ring, p.bytes, p.rounds, p.size, el.Round(time.Millisecond), sent, rcvd, out, in,
		st.ReadRDMA, st.WrittenRDMA, st.ReadTCP, st.WrittenTCP, st.RDMAWrites, st.Upgrades, st.Demotes, st.Fallbacks)
	pkts := p.bytes / mtu
	if sent < pkts || rcvd < pkts {
		t.Errorf("rxe moved %d and %d packets, fewer than the %d packets of %d bytes at MTU %d: RDMA did not carry the bytes", sent, rcvd, pkts, p.bytes, mtu)
	}
	// Over TCP, 16 MiB each way would be more than 11,000 segments
	// each way; the ping-pongs alone 2 per round.
	if out+in > 400 {
		t.Errorf("TCP moved %d segments out and %d in during the transfer: TCP carried bytes", out, in)
	}
	if st.ReadTCP > 24 || st.WrittenTCP > 24 || st.ReadRDMA+st.ReadTCP != wantRead ||
		st.WrittenRDMA+st.WrittenTCP != wantWritten || st.Upgrades != 1 || len(st.Demotes) != 0 {
		t.Errorf("stats %+v: want %d bytes read and %d written, all by RDMA but the header, one upgrade, no demote", st, wantRead, wantWritten)
	}
}

// TestLabInteropClient dials the C program bulk (a server, under the
// shim, on the other guest) with pkg/sockets and runs its protocol over
// the attached connection.
func TestLabInteropClient(t *testing.T) {
	addr := os.Getenv("SOCKETS_INTEROP_DIAL")
	if addr == "" {
		t.Skip("SOCKETS_INTEROP_DIAL not set (run by the suite sockets-interop)")
	}
	labenv.Device(t)
	p := interopParams(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := interopOptions(t)
	o.WaitAttach = true
	c, err := sockets.Dial(ctx, "tcp4", addr, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The shim's SWITCH answers ours once its program's thread polls
	// its CQ (it reads the header meanwhile): both directions on RDMA
	// before the first byte.
	waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
	c.SetDeadline(time.Now().Add(240 * time.Second))
	fmt.Printf("interop go-client: attached to the shim's bulk server at %s: path %+v\n", addr, c.Path())

	before := readCounters(t)
	t0 := time.Now()
	var hdr [24]byte
	binary.LittleEndian.PutUint64(hdr[0:], p.bytes)
	binary.LittleEndian.PutUint64(hdr[8:], p.rounds)
	binary.LittleEndian.PutUint64(hdr[16:], p.size)
	writeAll(t, c, hdr[:], "header")
	writeAll(t, c, bulkPattern(p.bytes, 1), "bulk")
	buf := make([]byte, max(p.bytes, p.size))
	readCheck(t, c, buf, bulkPattern(p.bytes, 2), "bulk")
	for i := uint64(0); i < p.rounds; i++ {
		writeAll(t, c, bulkPattern(p.size, 10+i), fmt.Sprintf("round %d", i))
		readCheck(t, c, buf, bulkPattern(p.size, 20+i), fmt.Sprintf("round %d", i))
	}
	// bulk's server reads end of file, then closes: ours comes after.
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	expectEOF(t, c, "the end")
	el := time.Since(t0)
	after := readCounters(t)
	moved := p.bytes + p.rounds*p.size
	proveRDMA(t, "go-client", c, p, before, after, el, 24+moved, moved)
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestLabInteropServer serves one connection of the C program bulk (a
// client, under the shim, on the other guest) with pkg/sockets.
func TestLabInteropServer(t *testing.T) {
	port := os.Getenv("SOCKETS_INTEROP_LISTEN")
	if port == "" {
		t.Skip("SOCKETS_INTEROP_LISTEN not set (run by the suite sockets-interop)")
	}
	labenv.Device(t)
	l, err := sockets.Listen("tcp4", net.JoinHostPort(labenv.Addr(), port), interopOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, err := l.AcceptContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(240 * time.Second))
	before := readCounters(t)
	t0 := time.Now()
	var hdr [24]byte
	for off := 0; off < len(hdr); {
		n, err := c.Read(hdr[off:])
		off += n
		if err != nil {
			t.Fatalf("header: read at %d: %v (stats %+v)", off, err, c.Stats())
		}
	}
	p := bulkParams{binary.LittleEndian.Uint64(hdr[0:]), binary.LittleEndian.Uint64(hdr[8:]), binary.LittleEndian.Uint64(hdr[16:])}
	if want := interopParams(t); p != want {
		t.Fatalf("header %+v, want %+v", p, want)
	}
	fmt.Printf("interop go-server: header %+v from the shim's bulk client at %v: path %+v\n", p, c.RemoteAddr(), c.Path())
	buf := make([]byte, max(p.bytes, p.size))
	readCheck(t, c, buf, bulkPattern(p.bytes, 1), "bulk")
	writeAll(t, c, bulkPattern(p.bytes, 2), "bulk")
	for i := uint64(0); i < p.rounds; i++ {
		readCheck(t, c, buf, bulkPattern(p.size, 10+i), fmt.Sprintf("round %d", i))
		writeAll(t, c, bulkPattern(p.size, 20+i), fmt.Sprintf("round %d", i))
	}
	expectEOF(t, c, "the end")
	el := time.Since(t0)
	after := readCounters(t)
	moved := p.bytes + p.rounds*p.size
	proveRDMA(t, "go-server", c, p, before, after, el, moved, 24+moved)
	if err := c.CloseWrite(); err != nil {
		t.Errorf("CloseWrite: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
