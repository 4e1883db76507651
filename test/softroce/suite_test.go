package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSuite(t *testing.T) {
	s, err := parseSuite([]byte(`#!/bin/bash
# lab: guests=3 timeout=90 smp=1 mem=512
# Some prose that is not a setting.
# lab: gotest=./pkg/verbs,./pkg/rvma gobuild=./cmd/rvmad
# lab: expect-fail="g2: .*status 3"

echo hello
# lab: guests=4
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Guests != 3 || s.Timeout != 90*time.Second || s.Smp != 1 || s.MemMiB != 512 {
		t.Errorf("guests/timeout/smp/mem = %d/%s/%d/%d, want 3/1m30s/1/512 (settings after the first command are ignored)", s.Guests, s.Timeout, s.Smp, s.MemMiB)
	}
	if strings.Join(s.GoTests, " ") != "./pkg/verbs ./pkg/rvma" || strings.Join(s.GoBuilds, " ") != "./cmd/rvmad" {
		t.Errorf("gotest %q gobuild %q", s.GoTests, s.GoBuilds)
	}
	if s.ExpectFail == nil || !s.ExpectFail.MatchString("x/g2: command exited with status 3") {
		t.Errorf("expect-fail = %v", s.ExpectFail)
	}
}

func TestParseSuiteMake(t *testing.T) {
	s, err := parseSuite([]byte("# lab: guests=2 make=sockpreload\n"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(s.Makes, " ") != "sockpreload" {
		t.Errorf("make %q, want sockpreload", s.Makes)
	}
	if _, err := parseSuite([]byte("# lab: make=-j8\n")); err == nil {
		t.Error("make=-j8 accepted: a target must not be an option")
	}
}

func TestParseSuiteDefaults(t *testing.T) {
	s, err := parseSuite([]byte("echo no header\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Guests != 1 || s.Timeout != defaultTimeout || s.ExpectFail != nil {
		t.Errorf("defaults: %+v", s)
	}
}

func TestParseSuiteErrors(t *testing.T) {
	for _, bad := range []string{
		"# lab: guests=0",
		"# lab: guests=5",
		"# lab: guests=two",
		"# lab: timeout=-3",
		"# lab: timeout=soon",
		"# lab: smp=9",
		"# lab: mem=100",
		"# lab: mem=lots",
		"# lab: colour=blue",
		"# lab: expect-fail=\"(unclosed\"",
		"# lab: expect-fail=\"no end",
		"# lab: =x",
		"# lab: novalue",
	} {
		if _, err := parseSuite([]byte(bad + "\n")); err == nil {
			t.Errorf("%q: no error", bad)
		} else if !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: error %q does not name the line", bad, err)
		}
	}
}

func TestSplitSettings(t *testing.T) {
	got, err := splitSettings(` a=1  b="x y=z"	c=`)
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"a", "1"}, {"b", "x y=z"}, {"c", ""}}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("pair %d = %q, want %q", i, got[i], want[i])
		}
	}
}

func TestLoadSuiteOutsideRepo(t *testing.T) {
	root := t.TempDir()
	other := filepath.Join(t.TempDir(), "x.sh")
	if err := os.WriteFile(other, []byte("true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadSuite(root, other); err == nil || !strings.Contains(err.Error(), "inside the repository") {
		t.Fatalf("suite outside the repository: err = %v", err)
	}
	in := filepath.Join(root, "test", "a-suite.sh")
	os.MkdirAll(filepath.Dir(in), 0o755)
	os.WriteFile(in, []byte("# lab: guests=2\n"), 0o644)
	s, err := loadSuite(root, in)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "a-suite" || s.Path != "test/a-suite.sh" || s.Guests != 2 {
		t.Errorf("loaded %+v", s)
	}
}

func TestBinName(t *testing.T) {
	if got := binName("./pkg/verbs", true); got != "verbs.test" {
		t.Errorf("binName test = %q", got)
	}
	if got := binName("./cmd/rvmad/", false); got != "rvmad" {
		t.Errorf("binName = %q", got)
	}
}

// The repository's own suites must all parse.
func TestRepositorySuitesParse(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	suites, err := allSuites(root, suitesDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := allSuites(root, benchDir); err != nil {
		t.Fatal(err)
	}
	if len(suites) < 4 {
		t.Errorf("only %d suites found", len(suites))
	}
}

func TestSuiteKernels(t *testing.T) {
	s, err := parseSuite([]byte("#!/bin/bash\n# lab: guests=2 kernels=sid\ntrue\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := forKernel([]*Suite{s, {Name: "any"}}, "bookworm"); len(got) != 1 || got[0].Name != "any" {
		t.Fatalf("on bookworm: %v", got)
	}
	if got := forKernel([]*Suite{s}, "sid"); len(got) != 1 {
		t.Fatalf("on sid: %v", got)
	}
	if _, err := parseSuite([]byte("# lab: kernels=jessie\n")); err == nil {
		t.Fatal("an unknown kernel was accepted")
	}
}
