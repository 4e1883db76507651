package main

import (
	"bufio"
	"fmt"
	"regexp"
	"strings"
)

// parseMetaDepends finds, in `apt-cache depends <meta>` output, the versioned
// package the metapackage points at and returns the part after prefix, e.g.
// "6.1.0-56-amd64" for prefix "linux-image-".
func parseMetaDepends(out, prefix string) (string, error) {
	re := regexp.MustCompile(`^\s*Depends:\s*` + regexp.QuoteMeta(prefix) + `([0-9][0-9A-Za-z.+~-]*)\s*$`)
	for _, line := range strings.Split(out, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			return m[1], nil
		}
	}
	return "", fmt.Errorf("no dependency on %s<abi> in apt-cache output", prefix)
}

// parseShowDepends turns `modprobe --show-depends` output into the ordered,
// de-duplicated list of module files to insmod. Built-in modules ("builtin
// x") need no file and are left out.
func parseShowDepends(out string) ([]string, error) {
	var mods []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
		case f[0] == "builtin":
		case f[0] == "insmod" && len(f) >= 2:
			if !seen[f[1]] {
				seen[f[1]] = true
				mods = append(mods, f[1])
			}
		default:
			return nil, fmt.Errorf("unexpected modprobe output line %q", sc.Text())
		}
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("modprobe listed no module files")
	}
	return mods, sc.Err()
}

// parseLdd returns the library paths that `ldd` output names, the dynamic
// loader included; the vDSO has no file and is left out.
func parseLdd(out string) ([]string, error) {
	var libs []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "linux-vdso") || strings.Contains(line, "statically linked") {
			continue
		}
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("ldd: %s", line)
		}
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		p := strings.Fields(line)
		if len(p) > 0 && strings.HasPrefix(p[0], "/") {
			libs = append(libs, p[0])
		}
	}
	return libs, nil
}
