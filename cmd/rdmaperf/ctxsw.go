package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// showSwitches is -ctxsw.
var showSwitches bool

// procStat is what -ctxsw compares before and after a test: the context
// switches of every thread (threadSwitches) and the process's read and
// write system calls (/proc/self/io; on rxe every doorbell, a post or a
// bind, is a write to the uverbs device).
type procStat struct {
	sw         map[int][2]int
	sysr, sysw int
}

// readProcStat returns nil where /proc is unavailable.
func readProcStat() *procStat {
	sw := threadSwitches()
	if sw == nil {
		return nil
	}
	ps := &procStat{sw: sw}
	if b, err := os.ReadFile("/proc/self/io"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			switch k {
			case "syscr":
				ps.sysr = n
			case "syscw":
				ps.sysw = n
			}
		}
	}
	return ps
}

// printProcStat prints printSwitches' line and the read and write system
// calls per iteration.
func printProcStat(w io.Writer, before, after *procStat, iters int) {
	if before == nil || after == nil {
		return
	}
	printSwitches(w, before.sw, after.sw, iters)
	fmt.Fprintf(w, "# system calls per iteration: read %.2f, write %.2f\n",
		float64(after.sysr-before.sysr)/float64(iters), float64(after.sysw-before.sysw)/float64(iters))
}

// threadSwitches reads the voluntary and involuntary context switches of
// every thread of this process from /proc/self/task/*/status, keyed by
// thread id. It returns nil where /proc is unavailable.
func threadSwitches() map[int][2]int {
	dirs, err := filepath.Glob("/proc/self/task/*")
	if err != nil {
		return nil
	}
	m := make(map[int][2]int, len(dirs))
	for _, d := range dirs {
		tid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "status"))
		if err != nil {
			continue // the thread exited
		}
		var sw [2]int
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			switch k {
			case "voluntary_ctxt_switches":
				sw[0] = n
			case "nonvoluntary_ctxt_switches":
				sw[1] = n
			}
		}
		m[tid] = sw
	}
	return m
}

// printSwitches prints, per iteration, the context switches each thread
// made between before and after (-ctxsw): where a Go loop loses time to
// the runtime's thread hand-offs, they show up here.
func printSwitches(w io.Writer, before, after map[int][2]int, iters int) {
	tids := make([]int, 0, len(after))
	for t := range after {
		tids = append(tids, t)
	}
	sort.Ints(tids)
	var tv, ti int
	var per []string
	for _, t := range tids {
		v, i := after[t][0]-before[t][0], after[t][1]-before[t][1]
		tv, ti = tv+v, ti+i
		if v+i > 0 {
			per = append(per, fmt.Sprintf("%d:%.2f/%.2f", t, float64(v)/float64(iters), float64(i)/float64(iters)))
		}
	}
	fmt.Fprintf(w, "# context switches per iteration: voluntary %.2f, involuntary %.2f; threads %d; busy tid:vol/invol %s\n",
		float64(tv)/float64(iters), float64(ti)/float64(iters), len(tids), strings.Join(per, " "))
}

// procSum adds up procStat differences over several blocks of one tool
// (rvma_lat -ab -ctxsw), so that tools alternating in one process are
// counted apart.
type procSum struct {
	total procStat
	iters int
}

// add counts the block between before and after, of iters iterations;
// nil stats (no /proc) add nothing.
func (s *procSum) add(before, after *procStat, iters int) {
	if before == nil || after == nil {
		return
	}
	if s.total.sw == nil {
		s.total.sw = map[int][2]int{}
	}
	for t, a := range after.sw {
		b := before.sw[t] // a thread born during the block counts from zero
		c := s.total.sw[t]
		s.total.sw[t] = [2]int{c[0] + a[0] - b[0], c[1] + a[1] - b[1]}
	}
	s.total.sysr += after.sysr - before.sysr
	s.total.sysw += after.sysw - before.sysw
	s.iters += iters
}

// print prints printProcStat's lines for the blocks added, each headed by
// name.
func (s *procSum) print(w io.Writer, name string) {
	if s.iters == 0 {
		return
	}
	fmt.Fprintf(w, "# %s:\n", name)
	printProcStat(w, &procStat{sw: map[int][2]int{}}, &s.total, s.iters)
}
