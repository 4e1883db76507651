package main

import "time"

// cyclesPerUsec is the rdtsc rate, calibrated against the wall clock at
// start-up (perftest reads the CPU frequency from /proc/cpuinfo instead).
var cyclesPerUsec float64

func calibrate() {
	if cyclesPerUsec != 0 {
		return
	}
	t0, c0 := time.Now(), rdtsc()
	time.Sleep(200 * time.Millisecond)
	t1, c1 := time.Now(), rdtsc()
	cyclesPerUsec = float64(c1-c0) / (float64(t1.Sub(t0)) / float64(time.Microsecond))
	if cyclesPerUsec <= 0 {
		cyclesPerUsec = 1000
	}
}

// cyclesToDurations converts consecutive time stamp differences into
// durations.
func cyclesToDurations(stamps []uint64) []time.Duration {
	d := make([]time.Duration, 0, len(stamps))
	for i := 1; i < len(stamps); i++ {
		d = append(d, time.Duration(float64(stamps[i]-stamps[i-1])/cyclesPerUsec*float64(time.Microsecond)))
	}
	return d
}
