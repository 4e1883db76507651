//go:build race

package proto

// The race detector slows the model checker about tenfold: its default
// bounds shrink.
const raceEnabled = true
