package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

// bw measures Get and Put bandwidth against a region of the service at
// addr (registered by this process: over a loopback connection when addr
// is this host's).
func bw(addr string, minSize, maxSize, total int) error {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	s, err := jbmt.Open(nil)
	if err != nil {
		return err
	}
	defer s.Close()
	mem, err := jbmt.Alloc(maxSize)
	if err != nil {
		return err
	}
	defer jbmt.Free(mem)
	for i := range mem {
		mem[i] = byte(i)
	}
	reg, err := s.Register(mem, jbmt.Read|jbmt.Write)
	if err != nil {
		return err
	}
	defer reg.Close()
	ctx := context.Background()
	p, err := s.Dial(ctx, netip.AddrPortFrom(a, 0))
	if err != nil {
		return err
	}
	buf := make([]byte, maxSize)
	fmt.Printf("%-4s %10s %10s %8s\n", "op", "bytes", "MB/s", "ops")
	for size := minSize; size <= maxSize; size *= 4 {
		for _, op := range []string{"get", "put"} {
			n := max(total/size, 1)
			t0 := time.Now()
			for range n {
				if op == "get" {
					_, err = p.Get(ctx, buf[:size], reg.Token(), 0)
				} else {
					_, err = p.Put(ctx, buf[:size], reg.Token(), 0)
				}
				if err != nil {
					return fmt.Errorf("%s of %d bytes: %w", op, size, err)
				}
			}
			el := time.Since(t0)
			fmt.Printf("%-4s %10d %10.1f %8d\n", op, size, float64(n*size)/el.Seconds()/1e6, n)
		}
	}
	return nil
}

// lat measures the latency of single Gets and Puts of sizes from minSize
// to maxSize (by factors of 8) against a region of the service at addr:
// the median and the 99th percentile of n transfers each, in µs.
func lat(addr string, minSize, maxSize, n int) error {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	s, err := jbmt.Open(nil)
	if err != nil {
		return err
	}
	defer s.Close()
	mem, err := jbmt.Alloc(maxSize)
	if err != nil {
		return err
	}
	defer jbmt.Free(mem)
	reg, err := s.Register(mem, jbmt.Read|jbmt.Write)
	if err != nil {
		return err
	}
	defer reg.Close()
	ctx := context.Background()
	p, err := s.Dial(ctx, netip.AddrPortFrom(a, 0))
	if err != nil {
		return err
	}
	buf, err := jbmt.Alloc(maxSize) // page-aligned, as perftest's buffers
	if err != nil {
		return err
	}
	defer jbmt.Free(buf)
	fmt.Printf("%-4s %10s %10s %10s\n", "op", "bytes", "median_us", "p99_us")
	for size := minSize; size <= maxSize; size *= 8 {
		for _, op := range []string{"get", "put"} {
			v := make([]float64, 0, n)
			for range n {
				t0 := time.Now()
				if op == "get" {
					_, err = p.Get(ctx, buf[:size], reg.Token(), 0)
				} else {
					_, err = p.Put(ctx, buf[:size], reg.Token(), 0)
				}
				if err != nil {
					return fmt.Errorf("%s of %d bytes: %w", op, size, err)
				}
				v = append(v, float64(time.Since(t0).Nanoseconds())/1e3)
			}
			slices.Sort(v)
			fmt.Printf("%-4s %10d %10.1f %10.1f\n", op, size, v[len(v)/2], v[len(v)*99/100])
		}
	}
	return nil
}
