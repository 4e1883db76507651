// Command aa-dht runs the distributed hash table of the Active Access
// paper (pkg/activeaccess/dht) between hosts: a target serving a volume,
// sources inserting a random workload with a given collision rate, timing
// it, and looking keys up. The demo and the benchmark
// (test/softroce/bench/aa-dht-bench.sh) use it.
//
// Usage:
//
//	aa-dht serve  -table aa -mode transparent -notify poll -addr 10.77.0.1:7700 -n 3000 -collisions 0.25 -until FILE
//	aa-dht insert -table aa -addr 10.77.0.1:7700 -n 3000 -collisions 0.25 [-source 0 -sources 1] [-lookups 5]
//
// Tables: aa (Active Access; -mode transparent or mediated, -notify event
// or poll), rma (remote atomics, the paper's Listing 2), am (active
// messages; -notify event or poll). serve runs until the file -until
// exists (or, without it, until SIGINT/SIGTERM), then checks that the
// volume holds the workload (-n, -collisions, -seed) exactly, and exits 1
// if not. insert prints one line: the inserts, the seconds from the first
// insert to the end of the Flush that covers the last, and their rate
// (for aa also how its Source posted: chains, that is system calls, and
// work requests with and without a completion).
// Both sides must agree on -n, -collisions, -seed, -buckets and -heap.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht"
)

// common are the flags both subcommands take.
type common struct {
	table, mode, notify, addr string
	n, buckets, heap          int
	collisions                float64
	seed                      uint64
	cpuprofile                string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.table, "table", "aa", "table design: aa, rma or am")
	fs.StringVar(&c.mode, "mode", "transparent", "aa: transparent or mediated")
	fs.StringVar(&c.notify, "notify", "event", "aa, am: the handler's driver, event or poll")
	fs.StringVar(&c.addr, "addr", "", "the target's address and port (required)")
	fs.IntVar(&c.n, "n", 3000, "inserts in the workload (all sources)")
	fs.Float64Var(&c.collisions, "collisions", 0.05, "the workload's collision rate, 0 to <1")
	fs.Uint64Var(&c.seed, "seed", 1, "the workload's seed")
	fs.IntVar(&c.buckets, "buckets", 16384, "table cells")
	fs.IntVar(&c.heap, "heap", 4096, "overflow heap cells")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile here")
}

// options returns the target's options the flags ask for.
func (c *common) options() (*dht.TargetOptions, error) {
	cfg := &dht.TargetOptions{}
	switch c.mode {
	case "transparent":
		cfg.Mode = activeaccess.ModeTransparent
	case "mediated":
		cfg.Mode = activeaccess.ModeMediated
	default:
		return cfg, fmt.Errorf("-mode %q: transparent or mediated", c.mode)
	}
	switch c.notify {
	case "event":
		cfg.Notify = activeaccess.Event
	case "poll":
		cfg.Notify = activeaccess.Poll
	default:
		return cfg, fmt.Errorf("-notify %q: event or poll", c.notify)
	}
	return cfg, nil
}

// layout is the volume's layout the flags ask for.
func (c *common) layout() dht.Layout { return dht.Layout{Buckets: c.buckets, Heap: c.heap} }

func (c *common) workload() ([]dht.Pair, error) {
	return dht.Workload(c.n, c.layout(), c.collisions, c.seed)
}

// profile starts the CPU profile if asked; the returned func stops it.
func (c *common) profile() (func(), error) {
	if c.cpuprofile == "" {
		return func() {}, nil
	}
	f, err := os.Create(c.cpuprofile)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: aa-dht serve|insert [flags] (aa-dht serve -h)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "insert":
		err = insert(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: serve or insert", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "aa-dht:", err)
		os.Exit(1)
	}
}
