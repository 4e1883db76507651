package main

import (
	"fmt"
	"io"
	"math"
	"sort"
)

// writeRVMA prints the tables of an rvma-bench run: the paper's Figure 4
// (t_typical of an RVMA put against the RDMA ways of learning that a
// WRITE completed), Figure 6, streaming bandwidth and Get against a
// READ. Columns with no result print
// "–".
func writeRVMA(w io.Writer, res map[key]map[string]float64) {
	get := func(test string, size int, tool string) (float64, bool) {
		v, ok := res[key{test, size}][tool]
		return v, ok && v > 0
	}
	num := func(v float64, ok bool) string {
		if !ok {
			return "–"
		}
		return fmt.Sprintf("%.2f", v)
	}
	ratio := func(a float64, aok bool, b float64, bok bool) string {
		if !aok || !bok {
			return "–"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	reduction := func(a float64, aok bool, b float64, bok bool) string {
		if !aok || !bok {
			return "–"
		}
		return fmt.Sprintf("%+.0f%%", (a/b-1)*100)
	}
	sizesOf := func(test string) []int {
		var s []int
		for k := range res {
			if k.test == test {
				s = append(s, k.size)
			}
		}
		sort.Ints(s)
		return s
	}
	fmt.Fprintln(w, "\n### Figure 4: put to completion seen by the receiver (t_typical [µs])")
	fmt.Fprintln(w, "\n| bytes | (a) RVMA | (a') RVMA, GuardNone | (b1) WRITE+SEND behind | (b2) WRITE, SEND after its completion | (c) WRITE, last byte polled | WRITE_WITH_IMM | perftest ib_write_lat | (a)/(c) | (a) vs (b1) | (a) vs (b2) |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, s := range sizesOf("rvma_lat") {
		a, aok := get("rvma_lat", s, "rdmaperf")
		an, anok := get("rvma_lat", s, "rdmaperf-guardnone")
		b1, b1ok := get("write_send_lat", s, "rdmaperf")
		b2, b2ok := get("write_wait_send_lat", s, "rdmaperf")
		c, cok := get("write_lat", s, "rdmaperf")
		im, imok := get("write_imm_lat", s, "rdmaperf")
		pt, ptok := get("write_lat", s, "perftest")
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s,
			num(a, aok), num(an, anok), num(b1, b1ok), num(b2, b2ok), num(c, cok), num(im, imok), num(pt, ptok),
			ratio(a, aok, c, cok), reduction(a, aok, b1, b1ok), reduction(a, aok, b2, b2ok))
	}
	if sz := sizesOf("setup_lat"); len(sz) > 0 {
		fmt.Fprintln(w, "\n### Figure 6: exchanges needed to amortise RDMA's buffer setup to within 3 %")
		fmt.Fprintln(w, "\n| bytes | RDMA setup [µs] (register + send address and key) | exchange (c) [µs] | N for (c) | exchange (b2) [µs] | N for (b2) | RVMA |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|")
		n := func(setup float64, sok bool, x float64, xok bool) string {
			if !sok || !xok {
				return "–"
			}
			return fmt.Sprintf("%.0f", math.Ceil(setup/(0.03*x)))
		}
		for _, s := range sz {
			st, sok := get("setup_lat", s, "rdmaperf")
			c, cok := get("write_lat", s, "rdmaperf")
			b2, b2ok := get("write_wait_send_lat", s, "rdmaperf")
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | 0 |\n", s, num(st, sok), num(c, cok), n(st, sok, c, cok), num(b2, b2ok), n(st, sok, b2, b2ok))
		}
	}
	fmt.Fprintln(w, "\n### Streaming bandwidth (BW average [MB/s])")
	fmt.Fprintln(w, "\n| bytes | RVMA puts | rdmaperf write_bw | perftest ib_write_bw | RVMA/rdmaperf | RVMA/perftest |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
	for _, s := range sizesOf("rvma_bw") {
		r, rok := get("rvma_bw", s, "rdmaperf")
		g, gok := get("write_bw", s, "rdmaperf")
		p, pok := get("write_bw", s, "perftest")
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s |\n", s, num(r, rok), num(g, gok), num(p, pok), ratio(r, rok, g, gok), ratio(r, rok, p, pok))
	}
	if sz := sizesOf("rvma_get_lat"); len(sz) > 0 {
		fmt.Fprintln(w, "\n### Get of a kept epoch against one RDMA READ of its size (t_typical [µs])")
		fmt.Fprintln(w, "\n| bytes | RVMA Get | rdmaperf read_lat | perftest ib_read_lat | Get/rdmaperf | Get/perftest |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
		for _, s := range sz {
			g, gok := get("rvma_get_lat", s, "rdmaperf")
			r, rok := get("read_lat", s, "rdmaperf")
			p, pok := get("read_lat", s, "perftest")
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s |\n", s, num(g, gok), num(r, rok), num(p, pok), ratio(g, gok, r, rok), ratio(g, gok, p, pok))
		}
	}
}
