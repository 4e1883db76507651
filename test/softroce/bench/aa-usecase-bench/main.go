// Command aa-usecase-bench measures the Active Access use cases in the
// lab (test/softroce/bench/aa-usecases.sh runs it on two guests, guest 1
// the target, guest 2 the source; it coordinates them with the lab's
// barriers, so it runs only in a lab guest):
//
//	aa-usecase-bench getlog [-rounds N] [-gets N] [-size B]
//	    gets per second from one source on pages whose gets are logged
//	    with their data (RLD, pkg/activeaccess/getlog writing its files)
//	    and on pages without logging, alternating in rounds; the medians
//	    and their ratio
//	aa-usecase-bench perftest [-verb read|write] [-rounds N] [-iters N] [-size B]
//	    unmodified ib_read_bw (or ib_write_bw) against a stock perftest
//	    server and against five pages of a target served by
//	    pkg/activeaccess/perftest: no actions, metadata logged (RL|WL),
//	    data logged (RLD|WLD), each logged kind with the handler woken
//	    per entry and coalesced (64 entries or 1 ms); messages/s per kind
//	    in rounds, the medians and their ratios to the page without actions
//	aa-usecase-bench drain [-entries N]
//	    entries per second one handler goroutine drains from a full log,
//	    polling and with the eventfd (two domains, drained chunk by chunk,
//	    alternating)
//
// Either command takes -cpuprofile FILE: each guest writes a CPU profile
// of its run to FILE.<role> (server or client).
//
// Figures are printed as "FIGURE <name> <value> <unit>" lines. Exit status
// 1 on any failure (a failed access, a lost entry), 2 on bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime/pprof"
	"sort"
	"time"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	prof := fs.String("cpuprofile", "", "write a CPU profile to this file, suffixed with the guest's role")
	var run func() error
	switch os.Args[1] {
	case "getlog":
		rounds := fs.Int("rounds", 25, "rounds of logged and unlogged gets (which goes first alternates)")
		gets := fs.Int("gets", 400, "gets per round and kind")
		size := fs.Int("size", 8, "bytes per get")
		run = func() error { return benchGetLog(*rounds, *gets, *size) }
	case "perftest":
		verb := fs.String("verb", "read", "read (ib_read_bw) or write (ib_write_bw)")
		rounds := fs.Int("rounds", 9, "rounds of the six kinds (which goes first rotates)")
		iters := fs.Int("iters", 2000, "perftest iterations (-n) per run")
		size := fs.Int("size", 4096, "bytes per message (-s), at most 4096")
		run = func() error { return benchPerftest(*verb, *rounds, *iters, *size) }
	case "drain":
		entries := fs.Int("entries", 30000, "entries in the log before the handler starts")
		run = func() error { return benchDrain(*entries) }
	default:
		usage()
	}
	fs.Parse(os.Args[2:])
	err := profiled(*prof, run)
	if err != nil {
		fmt.Fprintln(os.Stderr, "aa-usecase-bench:", err)
		os.Exit(1)
	}
}

// profiled runs f, under a CPU profile written to file.<role> if file is
// not empty.
func profiled(file string, f func() error) error {
	if file == "" {
		return f()
	}
	out, err := os.Create(file + "." + labenv.Role())
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return err
	}
	err = f()
	pprof.StopCPUProfile()
	return errors.Join(err, out.Close())
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: aa-usecase-bench getlog|perftest|drain [flags] (in a two-guest lab boot)")
	os.Exit(2)
}

// target is guest 1's address with port p.
func target(p uint16) (netip.AddrPort, error) {
	a, err := labenv.AddrOf(1)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ip, err := netip.ParseAddr(a)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(ip, p), nil
}

func isTarget() (bool, error) {
	n, err := labenv.Guests()
	if err != nil {
		return false, err
	}
	if n != 2 {
		return false, fmt.Errorf("needs two guests, have %d", n)
	}
	return labenv.Role() == "server", nil
}

func await(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return labenv.Wait(ctx, name)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func figure(name string, v float64, unit string) { fmt.Printf("FIGURE %s %.4g %s\n", name, v, unit) }

// series collects a rate per kind and round, and each rate's ratio to the
// base kind's in the same round.
type series struct {
	kinds  []string
	base   int
	rates  [][]float64
	ratios [][]float64
}

func newSeries(kinds []string, base int) *series {
	return &series{kinds: kinds, base: base, rates: make([][]float64, len(kinds)), ratios: make([][]float64, len(kinds))}
}

// add records one round's rates (indexed like kinds) and prints them,
// after head, with their ratios.
func (s *series) add(head string, got []float64) {
	fmt.Print(head)
	for k, name := range s.kinds {
		r := got[k] / got[s.base]
		s.rates[k] = append(s.rates[k], got[k])
		s.ratios[k] = append(s.ratios[k], r)
		fmt.Printf(" %s %.0f (%.3f)", name, got[k], r)
	}
	fmt.Println()
}

// figures prints the medians: <prefix>_<what>_<kind> in unit, and
// <prefix>_ratio_<kind>_to_<base kind> for the other kinds.
func (s *series) figures(prefix, what, unit string) {
	for k, name := range s.kinds {
		figure(fmt.Sprintf("%s_%s_%s", prefix, what, name), median(s.rates[k]), unit)
		if k != s.base {
			figure(fmt.Sprintf("%s_ratio_%s_to_%s", prefix, name, s.kinds[s.base]), median(s.ratios[k]), "(median of per-round ratios)")
		}
	}
}
