//go:build lab

package dht_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
)

// TestLabFull: a heap too small for the collisions: the inserts that do
// not fit fail with ErrFull (RMA: from Insert; AA, AM: from Flush, with
// their count), the others are stored, the volume stays sound. Then bad
// input: key 0, a bad layout, a source of the wrong kind, and (AA) raw
// active puts that are no insert, which the handler rejects.
func TestLabFull(t *testing.T) {
	l := dht.Layout{Buckets: 64, Heap: 6}
	w, err := dht.Workload(40, l, 0.25, 9) // 10 collisions, 6 heap cells
	if err != nil {
		t.Fatal(err)
	}
	for di, d := range designs() {
		if d.name == "aa-transparent-poll" || d.name == "aa-mediated-poll" {
			continue
		}
		port := uint16(7620 + di)
		t.Run(d.name, func(t *testing.T) {
			b := barriers(t, "full-"+d.name)
			switch guest(t) {
			case 1:
				tg := serve(t, port, d, l)
				signal(t, b("ready"))
				await(t, b("done"))
				seen, err := tg.Volume().Contents()
				if err != nil {
					t.Fatal(err)
				}
				stored := 0
				for _, p := range w {
					stored += seen[p]
				}
				if stored != 36 || tg.Volume().HeapUsed() != 6 {
					t.Fatalf("%d of 40 stored (want 36), %d heap cells used", stored, tg.Volume().HeapUsed())
				}
				if _, err := dht.Serve(timeout(t, 60*time.Second), d.kind, targetAddr(t, port+100), dht.Layout{Buckets: 0}, nil); !errors.Is(err, dht.ErrInvalid) {
					t.Errorf("Serve with no buckets: %v", err)
				}
			case 2:
				await(t, b("ready"))
				defer signal(t, b("done"))
				tb := dial(t, d.kind, port)
				ctx := timeout(t, 60*time.Second)
				full := 0
				for _, p := range w {
					err := tb.Insert(ctx, p.Key, p.Value)
					if errors.Is(err, dht.ErrFull) && d.kind == dht.KindRMA {
						full++
					} else if err != nil {
						t.Fatalf("Insert: %v", err)
					}
				}
				err := tb.Flush(ctx)
				if d.kind != dht.KindRMA {
					if !errors.Is(err, dht.ErrFull) || !strings.Contains(err.Error(), "4 inserts") {
						t.Fatalf("Flush after 4 inserts too many: %v", err)
					}
				} else if err != nil || full != 4 {
					t.Fatalf("RMA: %d inserts failed with ErrFull (want 4), flush %v", full, err)
				}
				t.Logf("full heap: %v", err)
				if err := tb.Flush(ctx); err != nil {
					t.Fatalf("a second Flush reports again: %v", err)
				}
				if err := tb.Insert(ctx, 0, 1); !errors.Is(err, dht.ErrInvalid) {
					t.Errorf("Insert of key 0: %v", err)
				}
				if err := tb.Delete(ctx, 0); !errors.Is(err, dht.ErrInvalid) {
					t.Errorf("Delete of key 0: %v", err)
				}
				wrong := dht.KindAM
				if d.kind == dht.KindAM {
					wrong = dht.KindRMA
				}
				if _, err := dht.Dial(ctx, wrong, targetAddr(t, port), &dht.SourceOptions{Name: "wrong"}); !errors.Is(err, dht.ErrProtocol) {
					t.Errorf("a %s source at a %s target: %v", wrong, d.kind, err)
				}
				if aa, ok := tb.(*dht.AATable); ok {
					rogue(t, ctx, aa)
				}
				if err := tb.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if err := tb.Close(); err != nil {
					t.Errorf("Close twice: %v", err)
				}
				if err := tb.Insert(ctx, 5, 5); !errors.Is(err, dht.ErrClosed) || !strings.Contains(err.Error(), "dht: insert:") {
					t.Errorf("Insert after Close: %v, want ErrClosed naming the call", err)
				}
			}
		})
	}
}

// rogue sends active puts that are no insert: a wrong size, an element
// put to another bucket, a put to a chain word; the handler rejects
// each and stores nothing.
func rogue(t *testing.T, ctx context.Context, aa *dht.AATable) {
	l := layout.Layout(aa.Layout()) // the offsets of the volume's parts
	s := aa.Source()
	var e [8]byte
	key := uint32(77)
	binary.LittleEndian.PutUint64(e[:], layout.Elem(key, 1))
	wrongBucket := (l.Bucket(key) + 1) % l.Buckets
	puts := []struct {
		off  int
		data []byte
	}{
		{l.CellOff(l.Bucket(key)), e[:4]},
		{l.CellOff(wrongBucket), e[:]},
		{l.CellOff(l.Bucket(key)) + 8, e[:]},
		{l.CellOff(l.Buckets), e[:]}, // a heap cell
	}
	for _, p := range puts {
		if _, err := s.Put(ctx, p.off, p.data); err != nil {
			t.Fatalf("raw put: %v", err)
		}
	}
	err := aa.Flush(ctx)
	if !errors.Is(err, dht.ErrRejected) || !strings.Contains(err.Error(), fmt.Sprintf("%d requests", len(puts))) {
		t.Fatalf("Flush after %d malformed puts: %v", len(puts), err)
	}
	if _, ok, err := aa.Lookup(ctx, key); ok || err != nil {
		t.Fatalf("a rejected put was stored: %v %v", ok, err)
	}
}

const childEnv = "DHT_LAB_CHILD"

// childTarget serves a table of kind k until killed (TestLabTargetDies).
func childTarget(k dht.Kind) int {
	port, addr := os.Getenv("DHT_LAB_PORT"), os.Getenv("DHT_LAB_ADDR")
	ap, err := parseAddrPort(addr, port)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err = dht.Serve(ctx, k, ap, dht.Layout{Buckets: 1024, Heap: 256}, &dht.TargetOptions{Notify: activeaccess.Event})
		cancel()
	}
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Println("READY")
	select {}
}

// TestLabTargetDies: the target process is killed while a source works:
// its next insert or flush fails with ErrDisconnected, promptly, and so
// does every later call; nothing hangs.
func TestLabTargetDies(t *testing.T) {
	for i, k := range []dht.Kind{dht.KindAA, dht.KindRMA, dht.KindAM} {
		port := uint16(7640 + i)
		t.Run(string(k), func(t *testing.T) {
			b := barriers(t, "dies-"+string(k))
			switch guest(t) {
			case 1:
				cmd := exec.Command(os.Args[0], "-test.run", "^$")
				cmd.Env = append(os.Environ(), childEnv+"="+string(k), "DHT_LAB_PORT="+fmt.Sprint(port),
					"DHT_LAB_ADDR="+targetAddr(t, port).Addr().String())
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				defer cmd.Wait()
				defer cmd.Process.Kill()
				line, _ := bufio.NewReader(out).ReadString('\n')
				if line != "READY\n" {
					t.Fatalf("child target: %q", line)
				}
				signal(t, b("ready"))
				await(t, b("working"))
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
				signal(t, b("killed"))
			case 2:
				await(t, b("ready"))
				tb := dial(t, k, port)
				ctx := timeout(t, 60*time.Second)
				if err := tb.Insert(ctx, 5, 5); err != nil {
					t.Fatal(err)
				}
				if err := tb.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				signal(t, b("working"))
				await(t, b("killed"))
				start := time.Now()
				var err error
				for key := uint32(6); err == nil && time.Since(start) < 30*time.Second; key++ {
					if err = tb.Insert(ctx, key, 1); err == nil {
						err = tb.Flush(ctx)
					}
				}
				d := time.Since(start)
				if !errors.Is(err, dht.ErrDisconnected) || d > 20*time.Second {
					t.Fatalf("after the target died: %v after %v", err, d)
				}
				t.Logf("after the target died: %v after %v", err, d)
				if _, _, err := tb.Lookup(ctx, 5); !errors.Is(err, dht.ErrDisconnected) {
					t.Fatalf("a later Lookup: %v", err)
				}
				if err := tb.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
		})
	}
}
