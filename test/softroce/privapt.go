package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// A privateApt is an apt configuration of the lab's own, for suites the
// host's apt does not know (trixie, sid): its own sources.list, lists and
// download cache under the lab's cache, and an empty dpkg status, so that
// nothing the host's apt sees changes. It uses the host's Debian mirror.
type privateApt struct {
	dir     string   // <cache>/apt/<flavour>
	sources []string // sources.list lines
}

// debianMirrors are the archive and security mirrors of the host's apt
// sources ("" when none is configured).
type debianMirrors struct{ archive, security string }

// hostMirrors reads the Debian mirrors from the host's apt sources (one-line
// and deb822 formats).
func hostMirrors() (debianMirrors, error) {
	var texts []string
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	for _, f := range append([]string{"/etc/apt/sources.list"}, files...) {
		if !strings.HasSuffix(f, ".list") && !strings.HasSuffix(f, ".sources") {
			continue
		}
		if b, err := os.ReadFile(f); err == nil {
			texts = append(texts, string(b))
		}
	}
	m := parseAptMirrors(strings.Join(texts, "\n\n"))
	if m.archive == "" {
		return m, fmt.Errorf("no Debian mirror in /etc/apt/sources.list(.d): the lab fetches newer kernels from the host's Debian mirror")
	}
	return m, nil
}

// debianSuite matches the suites of Debian's archive and of its security
// archive.
var debianSuite = regexp.MustCompile(`^(buster|bullseye|bookworm|trixie|forky|duke|sid|stable|testing|unstable|oldstable)(-updates|-backports|-proposed-updates)?$|^[a-z]+-security$|^[a-z]+/updates$`)

// parseAptMirrors finds, in apt sources (one-line "deb URI SUITE COMP..."
// entries and deb822 stanzas), the URI serving Debian's main archive and the
// one serving its security archive.
func parseAptMirrors(text string) debianMirrors {
	var m debianMirrors
	note := func(uri, suite string) {
		if !debianSuite.MatchString(suite) {
			return
		}
		uri = strings.TrimRight(uri, "/")
		if strings.HasSuffix(suite, "-security") || strings.HasSuffix(suite, "/updates") {
			if m.security == "" {
				m.security = uri
			}
		} else if m.archive == "" {
			m.archive = uri
		}
	}
	// deb822: stanzas separated by blank lines.
	stanza := map[string]string{}
	flush := func() {
		if strings.Contains(" "+stanza["types"]+" ", " deb ") && stanza["enabled"] != "no" {
			for _, u := range strings.Fields(stanza["uris"]) {
				for _, s := range strings.Fields(stanza["suites"]) {
					note(u, s)
				}
			}
		}
		stanza = map[string]string{}
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		t := strings.TrimSpace(line)
		switch {
		case t == "":
			flush()
		case strings.HasPrefix(t, "#"):
		case strings.HasPrefix(t, "deb ") || strings.HasPrefix(t, "deb\t"):
			f := strings.Fields(t)[1:]
			if len(f) > 0 && strings.HasPrefix(f[0], "[") { // [options]
				for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
					f = f[1:]
				}
				if len(f) > 0 {
					f = f[1:]
				}
			}
			if len(f) >= 2 {
				note(f[0], f[1])
			}
		case strings.HasPrefix(t, "deb-src"):
		default:
			if k, v, ok := strings.Cut(t, ":"); ok && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") {
				stanza[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
	}
	flush()
	return m
}

// debianKeyring signs Debian's archive; the host's copy (debian-archive-keyring)
// has the keys of the newer releases too.
const debianKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// sourcesFor returns sources.list lines for suites: "x-security" suites from
// the security mirror (left out when the host has none), others from the
// archive mirror. With keyring, the lines name it (signed-by).
func sourcesFor(m debianMirrors, suites []string, keyring string) []string {
	opt := ""
	if keyring != "" {
		opt = "[signed-by=" + keyring + "] "
	}
	var lines []string
	for _, s := range suites {
		uri := m.archive
		if strings.HasSuffix(s, "-security") {
			if uri = m.security; uri == "" {
				continue
			}
		}
		lines = append(lines, fmt.Sprintf("deb %s%s %s main", opt, uri, s))
	}
	return lines
}

func newPrivateApt(cache, name string, suites []string) (*privateApt, error) {
	m, err := hostMirrors()
	if err != nil {
		return nil, err
	}
	return &privateApt{dir: filepath.Join(cache, "apt", name), sources: sourcesFor(m, suites, debianKeyring)}, nil
}

// args are the options that make apt-get and apt-cache use this
// configuration instead of the host's.
func (a *privateApt) args() []string {
	return []string{
		"-o", "Dir::Etc::SourceList=" + filepath.Join(a.dir, "sources.list"),
		"-o", "Dir::Etc::SourceParts=" + filepath.Join(a.dir, "sources.list.d"),
		"-o", "Dir::State::Lists=" + filepath.Join(a.dir, "lists"),
		"-o", "Dir::State::Status=" + filepath.Join(a.dir, "status"),
		"-o", "Dir::Cache=" + filepath.Join(a.dir, "cache"),
		"-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
		"-o", "APT::Sandbox::User=root",
		"-o", "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false",
		"-o", "Acquire::Languages=none",
	}
}

func (a *privateApt) listsDir() string { return filepath.Join(a.dir, "lists") }

// update refreshes the lists when they are missing, older than aptMaxAge,
// made for other sources, or when force is set.
func (a *privateApt) update(ctx context.Context, force bool) error {
	want := strings.Join(a.sources, "\n") + "\n"
	srcFile := filepath.Join(a.dir, "sources.list")
	old, _ := os.ReadFile(srcFile)
	if !force && string(old) == want && listsFresh(a.listsDir(), aptMaxAge) {
		return nil
	}
	for _, d := range []string{"sources.list.d", "lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(a.dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(srcFile, []byte(want), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(a.dir, "status"), nil, 0o644); err != nil {
		return err
	}
	logf("apt-get update (private lists for %s)", filepath.Base(a.dir))
	return run(ctx, "", "apt-get", append(a.args(), "update", "-q")...)
}

// listsFresh reports whether a lists directory has a Packages file younger
// than maxAge.
func listsFresh(dir string, maxAge time.Duration) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "*_Packages*"))
	for _, f := range files {
		if st, err := os.Stat(f); err == nil && time.Since(st.ModTime()) < maxAge {
			return true
		}
	}
	return false
}

// listsState identifies the state of the package lists in dir.
func listsState(dir string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "*_Packages*"))
	var newest int64
	for _, f := range files {
		if st, err := os.Stat(f); err == nil && st.ModTime().UnixNano() > newest {
			newest = st.ModTime().UnixNano()
		}
	}
	return fmt.Sprintf("%d/%d", len(files), newest)
}

// download fetches packages into dir with apt-get download.
func (a *privateApt) download(ctx context.Context, dir string, pkgs ...string) error {
	return run(ctx, dir, "apt-get", append(append(a.args(), "download", "-q"), pkgs...)...)
}

// depNames returns the package names of a Depends field ("a (>= 1), b | c"),
// the first alternative of each dependency, without versions or
// architecture qualifiers.
func depNames(field string) []string {
	var names []string
	for _, dep := range strings.Split(field, ",") {
		alt, _, _ := strings.Cut(dep, "|")
		f := strings.Fields(alt)
		if len(f) == 0 {
			continue
		}
		name, _, _ := strings.Cut(f[0], ":")
		if name, _, _ = strings.Cut(name, "("); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// abiParts returns the packages of a kernel package's Depends field that
// carry the ABI in their name: from 7.x on Debian splits linux-image-<abi>
// into linux-binary-<abi> (the kernel), linux-modules-<abi> and
// linux-base-<abi> (System.map, config, modules.builtin).
func abiParts(depends, abi string) []string {
	var parts []string
	for _, n := range depNames(depends) {
		if strings.HasSuffix(n, "-"+abi) && strings.HasPrefix(n, "linux-") {
			parts = append(parts, n)
		}
	}
	return parts
}
