package main

// rdtsc reads the time stamp counter, as perftest's get_cycles does: it
// costs a few instructions where time.Now may be a system call reading an
// emulated HPET (the lab guests' clocksource under TCG).
func rdtsc() uint64
