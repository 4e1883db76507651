package perftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// A description ib_write_bw (perftest 4.5, Debian 12) sent in the lab.
const clientKey = "0000:0001:000012:93bc02:000005bb:0000564257fc7000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:01:00000000:"

func key(s string) []byte {
	b := make([]byte, keyMsgSize)
	copy(b, s)
	return b
}

func TestDestRoundTrip(t *testing.T) {
	d, err := parseDest(key(clientKey))
	if err != nil {
		t.Fatal(err)
	}
	if d.QPN != 0x12 || d.PSN != 0x93bc02 || d.RKey != 0x5bb || d.VAddr != 0x564257fc7000 || d.OutReads != 1 ||
		d.GID.String() != "10.77.0.1" {
		t.Fatalf("parsed %+v (GID %v)", d, d.GID)
	}
	if got := d.marshal(); !bytes.Equal(got, key(clientKey)) {
		t.Fatalf("marshal:\n%q\nwant\n%q", got, key(clientKey))
	}
}

func TestParseDestErrors(t *testing.T) {
	for name, m := range map[string][]byte{
		"short":      []byte(clientKey[:50]),
		"no GID":     key("0000:0001:000012:93bc02:000005bb:0000564257fc7000:00000000"),
		"bad hex":    key(strings.Replace(clientKey, "93bc02", "93bx02", 1)),
		"wide field": key(strings.Replace(clientKey, ":0001:", ":00001:", 1)),
		"no srqn":    key(clientKey[:len(clientKey)-9]),
	} {
		if _, err := parseDest(m); err == nil {
			t.Errorf("%s: parsed %q", name, m)
		}
	}
	if !looksLikeKey([]byte(clientKey[:50])) || looksLikeKey([]byte("6.06\x00\x00")) || looksLikeKey([]byte{0, 0, 0x10, 0}) {
		t.Fatal("looksLikeKey")
	}
}

func TestParseMTU(t *testing.T) {
	for m, want := range map[string]verbs.MTU{"5\x00": verbs.MTU4096, "3\x00\x00\x00": verbs.MTU1024, "1\x00": verbs.MTU256} {
		if got, ok := parseMTU([]byte(m)); !ok || got != want {
			t.Errorf("%q: %v %v", m, got, ok)
		}
	}
	for _, m := range []string{"6\x00", "0\x00", "5", "55\x00", "\x00\x00\x10\x00", "5\x00\x00\x00\x00"} {
		if _, ok := parseMTU([]byte(m)); ok {
			t.Errorf("%q taken for an MTU", m)
		}
	}
}

type closer struct{ closed *int }

func (c closer) Close() error { *c.closed++; return nil }

// pipeSession runs a session against the client side of a pipe; connect
// gives each client QP the target QPN 0x100 + n.
func pipeSession(t *testing.T, portMTU verbs.MTU) (net.Conn, chan error, *[]verbs.QPInfo, *int) {
	t.Helper()
	cli, srv := net.Pipe()
	t.Cleanup(func() { cli.Close(); srv.Close() })
	var remotes []verbs.QPInfo
	closed := 0
	s := &session{conn: srv, portMTU: portMTU, rkey: 0xabc, vaddr: 0x7f0000001000,
		connect: func(remote verbs.QPInfo, rd int, mtu verbs.MTU) (verbs.QPInfo, int, io.Closer, error) {
			if mtu != min(portMTU, verbs.MTU4096) {
				t.Errorf("connect with MTU %v", mtu)
			}
			remotes = append(remotes, remote)
			return verbs.QPInfo{QPN: 0x100 + uint32(len(remotes)), PSN: 0x42, GID: remote.GID}, min(rd, 16), closer{&closed}, nil
		}}
	errc := make(chan error, 1)
	go func() { errc <- s.run(context.Background()) }()
	return cli, errc, &remotes, &closed
}

func exchange(t *testing.T, c net.Conn, m []byte, n int) []byte {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	r := make([]byte, n)
	if _, err := io.ReadFull(c, r); err != nil {
		t.Fatalf("reply to %q: %v", m, err)
	}
	return r
}

// TestSessionTranscript replays what ib_write_bw -q 2 sent in the lab.
func TestSessionTranscript(t *testing.T) {
	cli, errc, remotes, closed := pipeSession(t, verbs.MTU1024)
	version := []byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	for _, m := range [][]byte{version, {0, 0, 0x10, 0}, {0, 0, 0, 0x40}} {
		if r := exchange(t, cli, m, len(m)); !bytes.Equal(r, m) {
			t.Fatalf("%q echoed as %q", m, r)
		}
	}
	if r := exchange(t, cli, []byte("5\x00"), 2); string(r) != "3\x00" {
		t.Fatalf("MTU answered %q, want the lower one", r)
	}
	k1 := key(clientKey)
	k2 := key(strings.Replace(clientKey, ":000012:", ":000013:", 1))
	want1 := key("0000:0001:000101:000042:00000abc:00007f0000001000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:01:00000000:")
	// as recorded: each QP's description, then as barriers each QP's
	// and QP 0's again
	for i, k := range [][]byte{k1, k2, k1, k2, k1} {
		r := exchange(t, cli, k, keyMsgSize)
		if k[15] == '2' && !bytes.Equal(r, want1) || k[15] == '3' && !bytes.Contains(r, []byte(":000102:")) {
			t.Fatalf("description %d answered\n%q", i, r)
		}
	}
	if len(*remotes) != 2 || (*remotes)[0].QPN != 0x12 || (*remotes)[0].PSN != 0x93bc02 || (*remotes)[1].QPN != 0x13 {
		t.Fatalf("connected %+v", *remotes)
	}
	for i := 0; i < 5; i++ { // the reports
		m := []byte{0, 0, 0, 0, 0, 0, 0x10, byte(i)}
		if r := exchange(t, cli, m, 8); !bytes.Equal(r, m) {
			t.Fatalf("report %q answered %q", m, r)
		}
	}
	if r := exchange(t, cli, k1, keyMsgSize+len(doneMsg)); !bytes.Equal(r, append(want1, doneMsg...)) {
		t.Fatalf("closing handshake answered %q", r)
	}
	if *closed != 0 {
		t.Fatal("queue pairs closed before the end")
	}
	if _, err := cli.Write(doneMsg); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if *closed != 2 {
		t.Fatalf("%d queue pairs closed, want 2", *closed)
	}
}

// TestSessionSplitMessages: a description or a report that TCP delivers
// in pieces is read whole; a client that closes right after the closing
// handshake, without its own "done", ends the session without error.
func TestSessionSplitMessages(t *testing.T) {
	cli, errc, remotes, _ := pipeSession(t, verbs.MTU4096)
	k := key(clientKey)
	cli.SetDeadline(time.Now().Add(5 * time.Second))
	cli.Write(k[:40])
	if r := exchange(t, cli, k[40:], keyMsgSize); !bytes.Contains(r, []byte(":000101:")) {
		t.Fatalf("split description answered %q", r)
	}
	cli.Write([]byte{0, 0, 0})
	if r := exchange(t, cli, []byte{0, 0, 0, 0, 0}, 8); !bytes.Equal(r, make([]byte, 8)) {
		t.Fatalf("split report answered %q", r)
	}
	exchange(t, cli, k, keyMsgSize+len(doneMsg))
	cli.Close()
	if err := <-errc; err != nil {
		t.Fatalf("a client closing after the handshake: %v", err)
	}
	if len(*remotes) != 1 {
		t.Fatalf("connected %+v", *remotes)
	}
}

func TestSessionErrors(t *testing.T) {
	t.Run("malformed description", func(t *testing.T) {
		cli, errc, _, _ := pipeSession(t, verbs.MTU4096)
		cli.Write(key(strings.Replace(clientKey, "93bc02", "zzzzzz", 1)))
		if err := <-errc; !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("client leaves early", func(t *testing.T) {
		cli, errc, _, closed := pipeSession(t, verbs.MTU4096)
		exchange(t, cli, key(clientKey), keyMsgSize)
		cli.Close()
		if err := <-errc; !errors.Is(err, ErrClientLeft) {
			t.Fatalf("got %v", err)
		}
		if *closed != 1 {
			t.Fatalf("%d queue pairs closed, want 1", *closed)
		}
	})
	t.Run("described again differently", func(t *testing.T) {
		cli, errc, _, _ := pipeSession(t, verbs.MTU4096)
		exchange(t, cli, key(clientKey), keyMsgSize)
		cli.Write(key(strings.Replace(clientKey, "93bc02", "93bc03", 1)))
		if err := <-errc; !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("too many queue pairs", func(t *testing.T) {
		cli, errc, _, _ := pipeSession(t, verbs.MTU4096)
		for i := 0; i < MaxQPs; i++ {
			exchange(t, cli, key(fmt.Sprintf("0000:0001:%06x:%s", 0x100+i, clientKey[17:])), keyMsgSize)
		}
		cli.Write(key(clientKey))
		if err := <-errc; !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("too long", func(t *testing.T) {
		cli, errc, _, _ := pipeSession(t, verbs.MTU4096)
		go cli.Write(make([]byte, 2*maxMsg))
		if err := <-errc; !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("connect fails", func(t *testing.T) {
		cli, srv := net.Pipe()
		defer cli.Close()
		boom := errors.New("boom")
		s := &session{conn: srv, portMTU: verbs.MTU4096, connect: func(verbs.QPInfo, int, verbs.MTU) (verbs.QPInfo, int, io.Closer, error) {
			return verbs.QPInfo{}, 0, nil, boom
		}}
		errc := make(chan error, 1)
		go func() { errc <- s.run(context.Background()) }()
		cli.Write(key(clientKey))
		if err := <-errc; !errors.Is(err, boom) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("context ends", func(t *testing.T) {
		cli, srv := net.Pipe()
		defer cli.Close()
		ctx, cancel := context.WithCancel(context.Background())
		s := &session{conn: srv, portMTU: verbs.MTU4096}
		errc := make(chan error, 1)
		go func() { errc <- s.run(ctx) }()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
	})
}

// A call whose context is already done returns its error before doing
// anything: Serve accepts nothing (and closes its listener), ServeConn
// reads nothing and touches no target (this nil one would crash).
func TestDoneContext(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := Serve(c.ctx, ln, nil, nil); !errors.Is(err, c.want) || !strings.Contains(err.Error(), "perftest: serve:") {
			t.Errorf("Serve: %v, want %v", err, c.want)
		}
		if _, err := ln.Accept(); err == nil {
			t.Error("Serve left its listener open")
		}
		cli, srv := net.Pipe()
		if err := ServeConn(c.ctx, srv, nil, nil); !errors.Is(err, c.want) || !strings.Contains(err.Error(), "perftest: serve conn:") {
			t.Errorf("ServeConn: %v, want %v", err, c.want)
		}
		cli.Close()
		srv.Close()
	}
}
