package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"
)

// LatStats are perftest's latency statistics over one run.
type LatStats struct {
	Iters      int
	Min, Max   float64 // µs
	Typical    float64 // median, µs
	Avg, Stdev float64 // µs
	P99, P999  float64 // µs
}

// latStats computes the statistics of samples (each a round trip or a
// single operation), dividing each by factor (2 for ping-pong tests, where
// perftest reports half the round trip; 1 for READ). It sorts samples.
func latStats(samples []time.Duration, factor float64) LatStats {
	n := len(samples)
	if n == 0 {
		return LatStats{}
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / factor }
	var sum, sq float64
	for _, s := range samples {
		v := us(s)
		sum += v
		sq += v * v
	}
	avg := sum / float64(n)
	return LatStats{
		Iters:   n,
		Min:     us(samples[0]),
		Max:     us(samples[n-1]),
		Typical: us(samples[n/2]),
		Avg:     avg,
		Stdev:   math.Sqrt(math.Max(sq/float64(n)-avg*avg, 0)),
		P99:     us(samples[min(int(float64(n)*0.99), n-1)]),
		P999:    us(samples[min(int(float64(n)*0.999), n-1)]),
	}
}

const latHeader = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99%% percentile[usec]   99.9%% percentile[usec] \n"

func printLat(w io.Writer, size int, s LatStats) {
	fmt.Fprintf(w, " %-7d %-10d %-7.2f        %-7.2f      %-7.2f            %-7.2f        %-7.2f          %-7.2f                %-7.2f\n",
		size, s.Iters, s.Min, s.Max, s.Typical, s.Avg, s.Stdev, s.P99, s.P999)
}

// BWStats are perftest's bandwidth figures for one run.
type BWStats struct {
	Iters    int
	MBps     float64 // average, MB = 2^20 bytes, as perftest prints
	PeakMBps float64
	Gbps     float64 // average, 10^9 bits per second
	Mpps     float64
}

// bwStats computes bandwidth from iters messages of size bytes in elapsed;
// peak is the best rate seen over any signaled batch (0 if unknown).
func bwStats(size, iters int, elapsed time.Duration, peak float64) BWStats {
	if elapsed <= 0 {
		return BWStats{Iters: iters}
	}
	bytes := float64(size) * float64(iters)
	sec := elapsed.Seconds()
	mbps := bytes / sec / (1 << 20)
	if peak < mbps {
		peak = mbps
	}
	return BWStats{Iters: iters, MBps: mbps, PeakMBps: peak, Gbps: bytes * 8 / sec / 1e9, Mpps: float64(iters) / sec / 1e6}
}

const bwHeader = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]    BW average[Gb/sec]\n"

func printBW(w io.Writer, size int, s BWStats) {
	fmt.Fprintf(w, " %-10d %-10d     %-7.2f            %-7.2f              %-10.6f       %-7.4f\n",
		size, s.Iters, s.PeakMBps, s.MBps, s.Mpps, s.Gbps)
}
