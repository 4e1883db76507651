//go:build lab

package activeaccess_test

import (
	"encoding/binary"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// TestLabRogue: a source that ignores credits (plain puts aimed at an
// intercepting page whose handler is stuck) fills the log; the module
// refuses the write that does not fit, the source sees ErrRefused (then
// ErrDisconnected: RC breaks the connection), and every put that
// succeeded reaches the handler, exactly once: nothing is dropped
// silently. Transparent mode only: a mediated target never refuses.
func TestLabRogue(t *testing.T) {
	const port, n = 7550, 400
	if server(t) {
		tg := listen(t, port, 4*page, &activeaccess.TargetOptions{LogSize: 1 << 14, MaxSources: 1})
		release := make(chan struct{})
		var once sync.Once
		unblock := func() { once.Do(func() { close(release) }) }
		defer unblock() // before the target's Close waits for the handler
		var mu sync.Mutex
		var got []int
		d, err := tg.NewDomain(func(a *activeaccess.Access) {
			<-release
			mu.Lock()
			got = append(got, int(binary.LittleEndian.Uint32(a.Data)))
			mu.Unlock()
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Associate(0, page, activeaccess.Intercept); err != nil {
			t.Fatal(err)
		}
		defer signal(t, "rogue-checked")
		signal(t, "rogue-ready")
		await(t, "rogue-flooded")
		var ok []int
		readShared(t, "rogue-ok", &ok)
		refused, _ := d.Refused()
		if refused == 0 {
			t.Fatal("the log refused nothing")
		}
		unblock()
		for i := 0; i < 200 && d.Processed() < uint64(len(ok)); i++ {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		sort.Ints(got)
		if len(got) != len(ok) {
			t.Fatalf("the handler saw %d puts, %d succeeded at the source", len(got), len(ok))
		}
		for i := range got {
			if got[i] != ok[i] {
				t.Fatalf("handled puts differ from the successful ones at %d: %d vs %d", i, got[i], ok[i])
			}
		}
		t.Logf("%d puts logged and handled, %d refused by the module", len(got), refused)
		return
	}
	await(t, "rogue-ready")
	defer signal(t, "rogue-flooded")
	s := dial(t, port, "rogue")
	ctx := timeout(t, 60*time.Second)
	var ops []*activeaccess.Op
	for i := 0; i < n; i++ {
		b := make([]byte, 64)
		binary.LittleEndian.PutUint32(b, uint32(i))
		o, err := s.PutPlain(ctx, (i%64)*64, b)
		if err != nil {
			if !errors.Is(err, activeaccess.ErrDisconnected) {
				t.Fatalf("put %d: %v", i, err)
			}
			break
		}
		ops = append(ops, o)
	}
	var ok []int
	var first error
	for i, o := range ops {
		err := o.Wait(ctx)
		switch {
		case err == nil && first == nil:
			ok = append(ok, i)
		case err == nil:
			t.Fatalf("put %d succeeded after an earlier one failed (%v)", i, first)
		case first == nil:
			first = err
			if !errors.Is(err, activeaccess.ErrRefused) {
				t.Fatalf("first failure: %v, want ErrRefused", err)
			}
		case !errors.Is(err, activeaccess.ErrDisconnected) && !errors.Is(err, activeaccess.ErrRefused):
			t.Fatalf("put %d after the refusal: %v", i, err)
		}
	}
	if first == nil {
		t.Fatalf("all %d plain puts succeeded: the log never filled", len(ops))
	}
	if _, err := s.Put(ctx, 0, []byte("x")); !errors.Is(err, activeaccess.ErrDisconnected) {
		t.Fatalf("Put after the refusal: %v", err)
	}
	t.Logf("%d puts succeeded, then: %v", len(ok), first)
	writeShared(t, "rogue-ok", ok)
	signal(t, "rogue-flooded")
	await(t, "rogue-checked")
}

func writeShared(t *testing.T, name string, v any) {
	t.Helper()
	if err := labenv.Publish(name, v); err != nil {
		t.Fatal(err)
	}
}

func readShared(t *testing.T, name string, v any) {
	t.Helper()
	if err := labenv.Load(name, v); err != nil {
		t.Fatalf("the source published no %s: %v", name, err)
	}
}
