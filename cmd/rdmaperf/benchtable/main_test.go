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
[verbs-bench] BENCH perftest write_bw 2 0.03 0.015000
[verbs-bench] BENCH rdmaperf-go write_bw 2 0.02 0.012000
[verbs-bench] BENCH perftest send_lat 8 20
[verbs-bench] BENCH rdmaperf send_lat 8 30
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
		"| 2 | 0.03 | 0.02 | 0.80 |",           // the ratio of the message rates
		"| 8 | 20.00 | – | – | 30.00 | 1.50 |", // "rdmaperf" counts as the Go loop
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

func TestRVMATable(t *testing.T) {
	in := `[rvma-bench] BENCH rdmaperf rvma_lat 8 300
BENCH rdmaperf rvma_lat 8 200
BENCH rdmaperf write_lat 8 50
BENCH rdmaperf write_send_lat 8 100
BENCH rdmaperf write_wait_send_lat 8 500
BENCH rdmaperf rvma_bw 65536 9
BENCH rdmaperf setup_lat 8 30
BENCH perftest write_bw 65536 10
BENCH rdmaperf rvma_get_lat 4096 400
BENCH perftest read_lat 4096 100
`
	res, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	writeRVMA(&b, res)
	for _, want := range []string{"| 8 | 250.00 | – | 100.00 | 500.00 | 50.00 | – | – | 5.00 | +150% | -50% |", "| 65536 | 9.00 | – | 10.00 | – | 0.90 |", "| 8 | 30.00 | 50.00 | 20 | 500.00 | 2 | 0 |", "| 4096 | 400.00 | – | 100.00 | – | 4.00 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
}
