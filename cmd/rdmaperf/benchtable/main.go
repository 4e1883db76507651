// Command benchtable turns the "BENCH <tool> <test> <bytes> <value> [rate]"
// lines of a verbs-bench lab run into the Markdown tables of
// docs/benchmarks.md: for each test and size, the median over the
// repetitions of each tool and its ratio to perftest (for bandwidth tests
// the ratio of the message rates, when the lines carry them).
//
// Usage:
//
//	go run ./cmd/rdmaperf/benchtable build/lab/runs/verbs-bench/guest1/console.log
//	go run ./cmd/rdmaperf/benchtable -rvma build/lab/runs/rvma-bench/guest1/console.log
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

func main() {
	args := os.Args[1:]
	rvmaTables := len(args) > 0 && args[0] == "-rvma"
	if rvmaTables {
		args = args[1:]
	}
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: benchtable [-rvma] CONSOLE_LOG")
		os.Exit(2)
	}
	f, err := os.Open(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	defer f.Close()
	res, err := parse(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	if len(res) == 0 {
		fmt.Fprintln(os.Stderr, "benchtable: no BENCH lines in", args[0])
		os.Exit(1)
	}
	if rvmaTables {
		writeRVMA(os.Stdout, res)
		return
	}
	write(os.Stdout, res)
}

type key struct {
	test string
	size int
}

// rateKey holds a bandwidth test's message rate (the sixth field of its
// BENCH lines). Bandwidth ratios are taken from the rates, which keep
// their digits where perftest's MB/s rounds to 0.02 or 0.03.
func rateKey(test string, size int) key { return key{test + " msgrate", size} }

// parse collects the finite values of every BENCH line (the lab prefixes
// console lines with "[suite] ", which is skipped) and returns the median
// per test, size and tool.
func parse(r io.Reader) (map[key]map[string]float64, error) {
	runs := map[key]map[string][]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, "BENCH ")
		if i < 0 {
			continue
		}
		f := strings.Fields(line[i:])
		if len(f) != 5 && len(f) != 6 {
			continue
		}
		size, err := strconv.Atoi(f[3])
		if err != nil {
			continue
		}
		add := func(k key, field string) {
			v, err := strconv.ParseFloat(field, 64)
			if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
				return // perftest sometimes prints inf under TCG
			}
			if runs[k] == nil {
				runs[k] = map[string][]float64{}
			}
			runs[k][f[1]] = append(runs[k][f[1]], v)
		}
		add(key{f[2], size}, f[4])
		if len(f) == 6 {
			add(rateKey(f[2], size), f[5])
		}
	}
	res := map[key]map[string]float64{}
	for k, tools := range runs {
		res[k] = map[string]float64{}
		for tool, vs := range tools {
			res[k][tool] = median(vs)
		}
	}
	return res, sc.Err()
}

func median(vs []float64) float64 {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func write(w io.Writer, res map[key]map[string]float64) {
	for _, test := range []string{"write_lat", "read_lat", "send_lat", "write_bw", "read_bw"} {
		var sizes []int
		for k := range res {
			if k.test == test {
				sizes = append(sizes, k.size)
			}
		}
		if len(sizes) == 0 {
			continue
		}
		sort.Ints(sizes)
		lat := strings.HasSuffix(test, "_lat")
		if lat {
			fmt.Fprintf(w, "\n### %s (t_typical [µs])\n\n", test)
			fmt.Fprintln(w, "| bytes | perftest | rdmaperf C loop | ratio C/perftest | rdmaperf Go loop | ratio Go/perftest |")
			fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
		} else {
			fmt.Fprintf(w, "\n### %s (BW average [MB/s]; ratio of the message rates)\n\n", test)
			fmt.Fprintln(w, "| bytes | perftest | rdmaperf | ratio rdmaperf/perftest |")
			fmt.Fprintln(w, "|---:|---:|---:|---:|")
		}
		for _, s := range sizes {
			r := res[key{test, s}]
			rates := res[rateKey(test, s)]
			p, hasP := r["perftest"]
			cell := func(tool string) string {
				name := tool
				v, ok := r[name]
				if !ok && tool == "rdmaperf-go" {
					// guests-bench.sh names its Go-loop runs
					// "rdmaperf", as -rvma mode expects.
					name = "rdmaperf"
					v, ok = r[name]
				}
				if !ok {
					return "– | –"
				}
				if pr, tr := rates["perftest"], rates[name]; pr > 0 && tr > 0 {
					return fmt.Sprintf("%.2f | %.2f", v, tr/pr)
				}
				if !hasP || p == 0 {
					return fmt.Sprintf("%.2f | –", v)
				}
				return fmt.Sprintf("%.2f | %.2f", v, v/p)
			}
			pt := "–"
			if hasP {
				pt = fmt.Sprintf("%.2f", p)
			}
			if lat {
				fmt.Fprintf(w, "| %d | %s | %s | %s |\n", s, pt, cell("rdmaperf-c"), cell("rdmaperf-go"))
			} else {
				fmt.Fprintf(w, "| %d | %s | %s |\n", s, pt, cell("rdmaperf-go"))
			}
		}
	}
}
