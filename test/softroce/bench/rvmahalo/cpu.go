package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// cpuSample is the guest's CPU time so far, from the first line of
// /proc/stat in USER_HZ ticks (1/100 s) summed over every CPU, and this
// process's read and write system calls (/proc/self/io; on rxe every
// doorbell, a post or a bind, is a write to the uverbs device). The guest
// runs nothing but the benchmark, so what a run adds is the exchange's
// cost in the program and in the kernel (rxe's packet work included).
type cpuSample struct{ user, sys, irq, total, reads, writes uint64 }

func readCPU() (cpuSample, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 5 || string(f[0]) != "cpu" {
		return cpuSample{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var s cpuSample
	for i, v := range f[1:min(len(f), 8)] { // not steal, guest, guest_nice: not this guest's work
		n, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return cpuSample{}, fmt.Errorf("/proc/stat: %w", err)
		}
		s.total += n
		switch i {
		case 0, 1: // user, nice
			s.user += n
		case 2: // system
			s.sys += n
		case 5, 6: // irq, softirq
			s.irq += n
		}
	}
	io, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return cpuSample{}, err
	}
	for _, line := range bytes.Split(io, []byte("\n")) {
		k, v, _ := bytes.Cut(line, []byte(":"))
		n, _ := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		switch string(k) {
		case "syscr":
			s.reads = n
		case "syscw":
			s.writes = n
		}
	}
	return s, nil
}

// cpuUse is what a run took: CPU time in seconds, the busy share of the
// CPUs' time, and system calls.
type cpuUse struct {
	user, sys, irq, share float64
	reads, writes         uint64
}

func (u cpuUse) busy() float64 { return u.user + u.sys + u.irq }

// since returns the CPU time spent since s.
func (s cpuSample) since() cpuUse {
	now, err := readCPU()
	if err != nil || now.total <= s.total {
		return cpuUse{}
	}
	user, sys, irq := now.user-s.user, now.sys-s.sys, now.irq-s.irq
	return cpuUse{
		user: float64(user) / 100, sys: float64(sys) / 100, irq: float64(irq) / 100,
		share: float64(user+sys+irq) / float64(now.total-s.total),
		reads: now.reads - s.reads, writes: now.writes - s.writes,
	}
}
