package labenv

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"
)

func TestOutsideTheLab(t *testing.T) {
	t.Setenv(EnvIndex, "")
	if _, err := Index(); !errors.Is(err, ErrNotInLab) {
		t.Errorf("Index outside the lab: %v", err)
	}
	if InLab() {
		t.Error("InLab() on the host")
	}
}

func TestEnvironment(t *testing.T) {
	t.Setenv(EnvIndex, "2")
	t.Setenv(EnvGuests, "3")
	t.Setenv(EnvAddrs, "10.77.0.1 10.77.0.2 10.77.0.3")
	t.Setenv(EnvPeers, "10.77.0.1 10.77.0.3")
	if i, err := Index(); err != nil || i != 2 {
		t.Errorf("Index = %d, %v", i, err)
	}
	if n, err := Guests(); err != nil || n != 3 {
		t.Errorf("Guests = %d, %v", n, err)
	}
	if a, err := AddrOf(3); err != nil || a != "10.77.0.3" {
		t.Errorf("AddrOf(3) = %q, %v", a, err)
	}
	if _, err := AddrOf(4); err == nil {
		t.Error("AddrOf(4) in a boot of 3: no error")
	}
	if p := Peers(); len(p) != 2 || p[1] != "10.77.0.3" {
		t.Errorf("Peers = %q", p)
	}
}

func TestBarrier(t *testing.T) {
	t.Setenv(EnvShared, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := Wait(ctx, "ready"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait before Signal: %v", err)
	}
	go func() {
		time.Sleep(30 * time.Millisecond)
		_ = Signal("ready")
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := Wait(ctx2, "ready"); err != nil {
		t.Fatalf("Wait after Signal: %v", err)
	}
	for _, bad := range []string{"", "../x", ".hidden", "a/b", "sp ace"} {
		if err := Signal(bad); err == nil {
			t.Errorf("Signal(%q): no error", bad)
		}
		if err := Publish(bad, 1); err == nil {
			t.Errorf("Publish(%q): no error", bad)
		}
	}
}

func TestPublish(t *testing.T) {
	t.Setenv(EnvShared, t.TempDir())
	type info struct{ QPN uint32 }
	var got info
	if err := Load("peer", &got); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load before Publish: %v", err)
	}
	if err := Publish("peer", info{QPN: 17}); err != nil {
		t.Fatal(err)
	}
	if err := Load("peer", &got); err != nil || got.QPN != 17 {
		t.Fatalf("Load: %+v %v", got, err)
	}
	if err := Publish("bad", func() {}); err == nil {
		t.Fatal("Publish of a func: no error")
	}
	t.Setenv(EnvShared, "")
	if err := Publish("peer", 1); !errors.Is(err, ErrNotInLab) {
		t.Fatalf("Publish outside the lab: %v", err)
	}
}
