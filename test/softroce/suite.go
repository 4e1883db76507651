package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A Suite is one lab run: a bash script run in every guest of one boot.
//
// Its settings come from header lines in the script's leading comments:
//
//	# lab: guests=2 timeout=120
//	# lab: gotest=./pkg/verbs gobuild=./cmd/rvmad
//	# lab: expect-fail="guest 2: .*status 3"
//
// guests (1..4, default 1), timeout (seconds or a Go duration, default 120s),
// gotest (packages whose lab tests are compiled with -tags lab into $LAB_BIN
// as <name>.test), gobuild (commands built into $LAB_BIN), make (targets of
// the top-level Makefile run on the host before the boot, for what is not
// Go: their outputs under build/ are in the guests at $LAB_DIR/build/), and expect-fail
// (a regular expression: the suite passes only if the run fails with a
// message that matches; used by the lab's own self-tests), and kernels
// (the guest kernels the suite is for, e.g. kernels=sid for what only 7.x
// has; default: every kernel).
type Suite struct {
	Name       string
	Path       string // the script, relative to the repository root
	Guests     int
	Timeout    time.Duration
	GoTests    []string
	GoBuilds   []string
	Makes      []string // top-level Makefile targets, e.g. sockpreload
	ExpectFail *regexp.Regexp
	Smp        int      // vCPUs per guest; 0 means the lab's default
	MemMiB     int      // memory per guest; 0 means the lab's (-mem)
	Kernels    []string // the guest kernels it is for; nil: every one
	// Command, when set, replaces the script: the lab runs it with bash -c.
	Command string
}

const (
	maxGuests      = 4
	defaultTimeout = 120 * time.Second
)

// loadSuite reads a suite script and its header.
func loadSuite(root, path string) (*Suite, error) {
	abs := path
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(root, path)
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("suite: %w", err)
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("suite %s: must live inside the repository %s (guests see only that)", path, root)
	}
	s, err := parseSuite(data)
	if err != nil {
		return nil, fmt.Errorf("suite %s: %w", rel, err)
	}
	s.Path = rel
	s.Name = strings.TrimSuffix(filepath.Base(rel), filepath.Ext(rel))
	return s, nil
}

// parseSuite parses the "# lab:" header lines of a suite script. Header
// lines may appear anywhere in the leading block of comments and blank lines.
func parseSuite(data []byte) (*Suite, error) {
	s := &Suite{Guests: 1, Timeout: defaultTimeout}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 0; sc.Scan(); {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#!") {
			continue
		}
		if !strings.HasPrefix(t, "#") {
			break
		}
		rest, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(t, "#")), "lab:")
		if !ok {
			continue
		}
		kvs, err := splitSettings(rest)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		for _, kv := range kvs {
			if err := s.set(kv[0], kv[1]); err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
		}
	}
	return s, sc.Err()
}

func (s *Suite) set(key, val string) error {
	switch key {
	case "guests":
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 || n > maxGuests {
			return fmt.Errorf("guests=%q: want 1 to %d", val, maxGuests)
		}
		s.Guests = n
	case "smp":
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 || n > 4 {
			return fmt.Errorf("smp=%q: want 1 to 4", val)
		}
		s.Smp = n
	case "mem":
		n, err := strconv.Atoi(val)
		if err != nil || n < 256 || n > 4096 {
			return fmt.Errorf("mem=%q: want 256 to 4096 (MiB)", val)
		}
		s.MemMiB = n
	case "timeout":
		d, err := parseSeconds(val)
		if err != nil {
			return fmt.Errorf("timeout=%q: %w", val, err)
		}
		s.Timeout = d
	case "gotest":
		s.GoTests = append(s.GoTests, splitList(val)...)
	case "gobuild":
		s.GoBuilds = append(s.GoBuilds, splitList(val)...)
	case "make":
		for _, t := range splitList(val) {
			if !makeTarget.MatchString(t) {
				return fmt.Errorf("make=%q: %q is not a Makefile target name", val, t)
			}
			s.Makes = append(s.Makes, t)
		}
	case "kernels":
		for _, k := range splitList(val) {
			if _, ok := kernelFlavours[k]; !ok {
				return fmt.Errorf("kernels=%q: %q is not a guest kernel (%s)", val, k, kernelNames())
			}
			s.Kernels = append(s.Kernels, k)
		}
	case "expect-fail":
		re, err := regexp.Compile(val)
		if err != nil {
			return fmt.Errorf("expect-fail: %w", err)
		}
		s.ExpectFail = re
	default:
		return fmt.Errorf("unknown setting %q (known: guests, smp, mem, timeout, gotest, gobuild, make, kernels, expect-fail)", key)
	}
	return nil
}

// makeTarget is a target a suite may name: a plain name, never an option.
var makeTarget = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// parseSeconds accepts a plain number of seconds or a Go duration.
func parseSeconds(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		if n <= 0 {
			return 0, fmt.Errorf("must be positive")
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("want seconds or a duration like 90s")
	}
	if d <= 0 {
		return 0, fmt.Errorf("must be positive")
	}
	return d, nil
}

func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// splitSettings splits `a=1 b="x y" c=z` into key/value pairs.
func splitSettings(s string) ([][2]string, error) {
	var out [][2]string
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return out, nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || strings.ContainsAny(s[:eq], " \t\"") {
			return nil, fmt.Errorf("want key=value, got %q", s)
		}
		key := s[:eq]
		s = s[eq+1:]
		var val string
		if strings.HasPrefix(s, `"`) {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				return nil, fmt.Errorf("unterminated quote in %s", key)
			}
			val, s = s[1:1+end], s[2+end:]
		} else {
			end := strings.IndexAny(s, " \t")
			if end < 0 {
				end = len(s)
			}
			val, s = s[:end], s[end:]
		}
		out = append(out, [2]string{key, val})
	}
}

// binName is the file name under $LAB_BIN of a built package: the last
// element of its import path, with ".test" for test binaries.
func binName(pkg string, test bool) string {
	name := filepath.Base(filepath.Clean(pkg))
	if test {
		name += ".test"
	}
	return name
}

// forKernel returns the suites that are for guest kernel k.
func forKernel(suites []*Suite, k string) []*Suite {
	var out []*Suite
	for _, s := range suites {
		if len(s.Kernels) == 0 || slices.Contains(s.Kernels, k) {
			out = append(out, s)
		}
	}
	return out
}
