//go:build !amd64

package main

import "time"

var t0 = time.Now()

func rdtsc() uint64 { return uint64(time.Since(t0)) }
