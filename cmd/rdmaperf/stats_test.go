package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

func TestLatStats(t *testing.T) {
	var s []time.Duration
	for i := 1000; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Microsecond)
	}
	st := latStats(s, 2)
	if st.Iters != 1000 || st.Min != 0.5 || st.Max != 500 || st.Typical != 250.5 || st.P99 != 495.5 || st.P999 != 500 {
		t.Fatalf("%+v", st)
	}
	if math.Abs(st.Avg-250.25) > 1e-9 {
		t.Fatalf("avg %v", st.Avg)
	}
	if (latStats(nil, 1) != LatStats{}) {
		t.Fatal("empty")
	}
	var b bytes.Buffer
	printLat(&b, 2, st)
	if !strings.HasPrefix(b.String(), " 2       1000") {
		t.Fatalf("%q", b.String())
	}
}

func TestBWStats(t *testing.T) {
	st := bwStats(1<<20, 100, time.Second, 0)
	if st.MBps != 100 || st.PeakMBps != 100 || math.Abs(st.Gbps-0.8388608) > 1e-9 || st.Mpps != 1e-4 {
		t.Fatalf("%+v", st)
	}
	if s := bwStats(1, 1, 0, 0); s.MBps != 0 {
		t.Fatal(s)
	}
}

func TestSizes(t *testing.T) {
	got := sizes(2, 65536, true)
	if len(got) != 16 || got[0] != 2 || got[15] != 65536 {
		t.Fatal(got)
	}
	if got := sizes(64, 0, false); len(got) != 1 || got[0] != 64 {
		t.Fatal(got)
	}
}

func TestConfigRoundTrip(t *testing.T) {
	c := config{Test: "read_bw", Size: 64, MaxSize: 4096, All: true, Iters: 10, TxDepth: 4, CQMod: 2, Inline: 0, Warmup: 3, MTU: 1024, QPTimeout: 14}
	var d config
	if err := d.unmarshal(c.marshal()); err != nil || d != c {
		t.Fatalf("%+v %v", d, err)
	}
	ab := config{Test: "rvma_lat", Size: 8, MaxSize: 8, Iters: 100, TxDepth: 1, CQMod: 1, AB: 10, NoGuard: true, HeapSrc: true, QPTimeout: 19}
	if err := d.unmarshal(ab.marshal()); err != nil || d != ab {
		t.Fatalf("%+v %v", d, err)
	}
	for _, bad := range []config{
		{Test: "write_lat", Size: 8, MaxSize: 8, Iters: 100, TxDepth: 1, CQMod: 1, AB: 10, QPTimeout: 14}, // -ab is rvma_lat's
		{Test: "rvma_lat", Size: 8, MaxSize: 8, Iters: 100, TxDepth: 1, CQMod: 1, AB: 60, QPTimeout: 14},  // one iteration per block
		{Test: "rvma_lat", Size: 8, MaxSize: 8, Iters: 100, TxDepth: 1, CQMod: 1, AB: -1, QPTimeout: 14},
		{Test: "write_lat", Size: 8, MaxSize: 8, Iters: 100, TxDepth: 1, CQMod: 1},                // no ACK timeout
		{Test: "write_lat", Size: 8, MaxSize: 8, Iters: 100, TxDepth: 1, CQMod: 1, QPTimeout: 32}, // beyond the field
	} {
		if err := bad.check(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := d.unmarshal([]byte{3, 'a'}); err == nil {
		t.Fatal("short message accepted")
	}
}

func TestCycles(t *testing.T) {
	calibrate()
	if cyclesPerUsec <= 0 {
		t.Fatal(cyclesPerUsec)
	}
	a := rdtsc()
	time.Sleep(10 * time.Millisecond)
	d := cyclesToDurations([]uint64{a, rdtsc()})
	if d[0] < 5*time.Millisecond || d[0] > 200*time.Millisecond {
		t.Fatalf("10ms measured as %v", d[0])
	}
}
