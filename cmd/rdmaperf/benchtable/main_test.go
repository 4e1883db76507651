package main

import (
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	log := `[verbs-bench] BENCH perftest write_lat 2 10.0
[verbs-bench] BENCH perftest write_lat 2 12.0
[verbs-bench] BENCH perftest write_lat 2 inf
[verbs-bench] BENCH rdmaperf-go write_lat 2 11.0
[verbs-bench] BENCH rdmaperf-c write_lat 2 22.0
[verbs-bench] BENCH perftest write_bw 65536 40
[verbs-bench] BENCH rdmaperf-go write_bw 65536 36
[verbs-bench] some other line
BENCH broken line
`
	res, err := parse(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if got := res[key{"write_lat", 2}]["perftest"]; got != 11.0 {
		t.Errorf("median of 10, 12 (inf dropped) = %v, want 11", got)
	}
	var b strings.Builder
	write(&b, res)
	out := b.String()
	for _, want := range []string{
		"| 2 | 11.00 | 22.00 | 2.00 | 11.00 | 1.00 |",
		"| 65536 | 40.00 | 36.00 | 0.90 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestMedian(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median odd = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
}
