package getlog

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func entries(offs ...int) []Entry {
	var es []Entry
	for i, o := range offs {
		es = append(es, Entry{Seq: uint64(i + 1), Offset: o, Data: bytes.Repeat([]byte{byte(i + 1)}, 100)})
	}
	return es
}

func encode(es []Entry) []byte {
	var b []byte
	for _, e := range es {
		b = appendRecord(b, e)
	}
	return b
}

func TestRecords(t *testing.T) {
	es := entries(0, 100, 5000)
	b := encode(es)
	got, err := readRecords(bytes.NewReader(b), 1, ^uint64(0))
	if err != nil || len(got) != 3 || got[2].Offset != 5000 || !bytes.Equal(got[1].Data, es[1].Data) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if got, err := readRecords(bytes.NewReader(b), 1, 2); err != nil || len(got) != 2 {
		t.Fatalf("max 2: %d, %v", len(got), err)
	}
	flip := func(i int) []byte { c := bytes.Clone(b); c[i] ^= 1; return c }
	for name, in := range map[string][]byte{
		"truncated header": b[:len(b)-recHeader-110],
		"truncated data":   b[:len(b)-3],
		"flipped data":     flip(recHeader + 5),
		"flipped crc":      flip(recHeader - 1),
		"flipped seq":      flip(4),
		"huge length":      flip(3),
	} {
		got, err := readRecords(bytes.NewReader(in), 1, ^uint64(0))
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
		for i, e := range got { // what precedes the damage is returned intact
			if e.Seq != uint64(i+1) || !bytes.Equal(e.Data, es[i].Data) {
				t.Errorf("%s: entry %d damaged", name, i)
			}
		}
	}
	if _, err := readRecords(bytes.NewReader(b), 2, ^uint64(0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("records starting at seq 1 read as from 2: %v", err)
	}
}

func TestReplayer(t *testing.T) {
	// Gets: [0, 100) in one entry, [100, 300) in two, then [1000, 1100)
	// and [0, 100) again.
	r := NewReplayer(entries(0, 100, 200, 1000, 0))
	dst := make([]byte, 200)
	if err := r.Get(0, dst[:100]); err != nil || dst[0] != 1 {
		t.Fatalf("first get: %v", err)
	}
	if err := r.Get(100, make([]byte, 150)); !errors.Is(err, ErrDiverged) || r.Remaining() != 4 {
		t.Fatalf("a shorter get than was made: %v, %d left", err, r.Remaining())
	}
	if err := r.Get(100, dst); err != nil || dst[0] != 2 || dst[199] != 3 {
		t.Fatalf("get over two entries: %v", err)
	}
	if err := r.Get(2000, dst[:100]); !errors.Is(err, ErrDiverged) {
		t.Fatalf("a get that was not made: %v", err)
	}
	if err := r.Get(1000, dst[:100]); err != nil || dst[0] != 4 {
		t.Fatalf("third get: %v", err)
	}
	if err := r.Get(0, dst[:100]); err != nil || dst[0] != 5 {
		t.Fatalf("a repeated range as a new get: %v", err)
	}
	if err := r.Get(0, dst[:100]); !errors.Is(err, io.EOF) {
		t.Fatalf("past the end: %v", err)
	}
	if err := r.Get(0, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty get: %v", err)
	}
	// A retransmitted READ: [100, 300) served as 100, 200, then 200 again.
	r = NewReplayer(entries(100, 200, 200, 5000))
	if err := r.Get(100, dst); err != nil {
		t.Fatal(err)
	}
	if err := r.Get(5000, dst[:100]); err != nil || r.Skipped() != 1 || dst[0] != 4 {
		t.Fatalf("after a repeated entry: %v, skipped %d", err, r.Skipped())
	}
}

// logger builds a Logger without a target: its files and replay service.
func logger(t *testing.T, dir string) *Logger {
	t.Helper()
	l := &Logger{dir: dir, readers: map[string]*readerLog{}, lns: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}, stop: make(chan struct{})}
	if err := l.openExisting(); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestReplayService(t *testing.T) {
	dir := t.TempDir()
	es := entries(0, 4096, 300)
	if err := os.WriteFile(filepath.Join(dir, fileName("reader one")), encode(es), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "zz-not-hex.getlog"), []byte("ignored"), 0o644)
	l := logger(t, dir)
	if l.Count("reader one") != 3 {
		t.Fatalf("counted %d entries", l.Count("reader one"))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { served <- l.ServeReplay(ctx, ln) }()
	addr := ln.Addr().String()
	got, err := Fetch(ctx, addr, "reader one", 0)
	if err != nil || len(got) != 3 || got[1].Offset != 4096 || !bytes.Equal(got[2].Data, es[2].Data) {
		t.Fatalf("Fetch: %+v, %v", got, err)
	}
	if got, err := Fetch(ctx, addr, "reader one", 3); err != nil || len(got) != 1 || got[0].Seq != 3 {
		t.Fatalf("Fetch from 3: %+v, %v", got, err)
	}
	if got, err := Fetch(ctx, addr, "nobody", 1); err != nil || len(got) != 0 {
		t.Fatalf("Fetch of an unknown reader: %+v, %v", got, err)
	}
	// Garbage to the service: an error answer, the service goes on.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	ans, err := readAnswer(c, 1)
	c.Close()
	if !errors.Is(err, ErrInvalid) || ans != nil {
		t.Fatalf("answer to garbage: %v", err)
	}
	if err := l.Clear("reader one"); err != nil || l.Count("reader one") != 0 {
		t.Fatalf("Clear: %v", err)
	}
	if got, err := Fetch(ctx, addr, "reader one", 1); err != nil || len(got) != 0 {
		t.Fatalf("Fetch after Clear: %+v, %v", got, err)
	}
	// A peer that is not a replay service.
	bad, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() {
		c, err := bad.Accept()
		if err == nil {
			c.Write([]byte("SSH-2.0-OpenSSH\r\n"))
			c.Close()
		}
	}()
	if _, err := Fetch(ctx, bad.Addr().String(), "x", 1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Fetch from a foreign service: %v", err)
	}
	bad.Close()
	// Close stops the service.
	l.mu.Lock()
	l.closed = true
	close(l.stop)
	for ln := range l.lns {
		ln.Close()
	}
	l.mu.Unlock()
	if err := <-served; err != nil {
		t.Fatalf("ServeReplay after close: %v", err)
	}
	l.closeFiles()
	// After Close: the calls fail with ErrClosed and name themselves,
	// and a second Close returns nil.
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	if err := l.ServeReplay(ctx, ln2); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "getlog: serve replay:") {
		t.Errorf("ServeReplay after Close: %v", err)
	}
	if _, err := ln2.Accept(); err == nil {
		t.Error("ServeReplay left its listener open")
	}
	if _, err := l.Entries("reader one", 1); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "getlog: entries:") {
		t.Errorf("Entries after Close: %v", err)
	}
	if err := l.Clear("reader one"); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "getlog: clear:") {
		t.Errorf("Clear after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// ServeReplay returns ctx's error when ctx ends, and closes its listener.
func TestServeReplayContextEnds(t *testing.T) {
	l := logger(t, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- l.ServeReplay(ctx, ln) }()
	if _, err := Fetch(context.Background(), ln.Addr().String(), "x", 1); err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "getlog: serve replay:") {
		t.Fatalf("ServeReplay after its context ended: %v", err)
	}
	if _, err := ln.Accept(); err == nil {
		t.Error("ServeReplay left its listener open")
	}
}

// A call whose context is already done returns its error before doing
// anything: before checking its arguments, before connecting or flushing
// (the nil Source would crash), before serving (the listener is closed).
func TestDoneContext(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	l := logger(t, t.TempDir())
	defer l.closeFiles()
	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		if _, err := Fetch(c.ctx, "127.0.0.1:1", strings.Repeat("x", 300), 1); !errors.Is(err, c.want) || errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "getlog: fetch:") {
			t.Errorf("Fetch: %v, want %v", err, c.want)
		}
		if _, err := Recover(c.ctx, nil, "127.0.0.1:1", "x"); !errors.Is(err, c.want) || !strings.Contains(err.Error(), "getlog: recover:") {
			t.Errorf("Recover: %v, want %v", err, c.want)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.ServeReplay(c.ctx, ln); !errors.Is(err, c.want) || !strings.Contains(err.Error(), "getlog: serve replay:") {
			t.Errorf("ServeReplay: %v, want %v", err, c.want)
		}
		if _, err := ln.Accept(); err == nil {
			t.Error("ServeReplay left its listener open")
		}
	}
	if _, err := Recover(context.Background(), nil, "127.0.0.1:1", "x"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Recover with a nil Source: %v", err)
	}
}

func TestDamagedLogRefused(t *testing.T) {
	dir := t.TempDir()
	b := encode(entries(0, 100))
	os.WriteFile(filepath.Join(dir, fileName("r")), b[:len(b)-1], 0o644)
	l := &Logger{dir: dir, readers: map[string]*readerLog{}}
	if err := l.openExisting(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a damaged log: %v", err)
	}
	l.closeFiles()
}
