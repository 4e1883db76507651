//go:build lab

package activeaccess_test

import (
	"hash/fnv"
	"os"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/internal/aalab"
)

const page = 4096

// TestMain lets a test run a target in a child process it can kill.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childTarget())
	}
	os.Exit(m.Run())
}

// The two-guest layout, barriers, targets and sources the use cases'
// lab tests share (pkg/activeaccess/internal/aalab).
var (
	server     = aalab.Server
	targetAddr = aalab.TargetAddr
	signal     = aalab.Signal
	await      = aalab.Await
	timeout    = aalab.Timeout
	pattern    = aalab.Pattern
	listen     = aalab.Listen
	dial       = aalab.Dial
	forModes   = aalab.ForModes
)

func sum(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}
