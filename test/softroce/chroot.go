package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// A build chroot: a minimal Debian system of a newer release, made with
// debootstrap and kept in the lab's cache, in which modules for that
// release's kernels are built with the compiler Debian built them with
// (trixie's gcc 14, sid's gcc 16). The headers of each kernel ABI are
// unpacked into it (dpkg-deb -x: their postinst scripts only call dkms).

// chrootPackages are what debootstrap --variant=minbase adds for kbuild:
// the compiler, make, libc and libelf headers, and pahole, which kbuild
// runs to give modules BTF. The compiler the headers ask for is added per
// ABI (chrootHeaders).
var chrootPackages = []string{"gcc", "make", "libc6-dev", "libelf-dev", "pahole", "bc", "kmod"}

// chrootAptConf is the chroot's apt configuration: the host's mirror may
// serve Release files past their Valid-Until (as the host's own apt
// configuration allows); signatures are still checked.
const chrootAptConf = "Acquire::Check-Valid-Until \"false\";\nAcquire::Languages \"none\";\nAPT::Install-Recommends \"false\";\n"

// ensureChroot returns the build chroot for suite under cache, making it
// with debootstrap when it is missing or does not work.
func ensureChroot(ctx context.Context, cache, suite string, sources []string) (string, error) {
	dir := filepath.Join(cache, "chroots", suite)
	if fileExists(filepath.Join(dir, ".complete")) {
		if err := exec.CommandContext(ctx, "chroot", dir, "gcc", "--version").Run(); err == nil {
			return dir, nil
		} else {
			logf("build chroot %s does not work (chroot gcc --version: %v): making it again", dir, err)
		}
	}
	if err := ensurePackages(ctx, "debootstrap"); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	m, err := hostMirrors()
	if err != nil {
		return "", err
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	t0 := time.Now()
	logf("making the %s build chroot with debootstrap (once; a few minutes)", suite)
	if err := run(ctx, "", "debootstrap", "--variant=minbase", "--include="+strings.Join(chrootPackages, ","),
		"--keyring="+debianKeyring, suite, tmp, m.archive); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("debootstrap %s: %w", suite, err)
	}
	files := map[string]string{
		"etc/apt/sources.list":          strings.Join(sources, "\n") + "\n",
		"etc/apt/apt.conf.d/90softroce": chrootAptConf,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	if err := chrootRun(ctx, tmp, "apt-get", "update", "-q"); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), []byte(suite+"\n"), 0o644); err != nil {
		return "", err
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	logf("build chroot %s made in %.0fs", dir, time.Since(t0).Seconds())
	return dir, nil
}

// chrootRun runs a command inside the chroot, with /proc mounted (objtool
// reads it) in a private mount namespace that ends with the command, so no
// mount outlives it.
func chrootRun(ctx context.Context, root string, args ...string) error {
	_, err := chrootCmd(ctx, root, "", args...)
	return err
}

// chrootCmd runs args in root like chrootRun, with the host directory bind
// (when not "") mounted at /lab/build, and returns its combined output.
func chrootCmd(ctx context.Context, root, bind string, args ...string) ([]byte, error) {
	script := `set -e; mount -t proc proc "$1/proc"; if [ -n "$2" ]; then mkdir -p "$1/lab/build"; mount --bind "$2" "$1/lab/build"; fi; r=$1; shift 2; exec chroot "$r" "$@"`
	full := append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh", root, bind}, args...)
	cmd := exec.CommandContext(ctx, "unshare", full...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C.UTF-8", "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("in chroot %s: %s: %w\n%s", root, strings.Join(args, " "), err, tail(string(out), 60))
	}
	return out, nil
}

// chrootHeaders installs the kbuild tree of abi into the chroot and returns
// its path inside the chroot: linux-headers-<abi>, its -common and
// linux-kbuild packages, fetched with apt (the flavour's private
// configuration) and unpacked, and whatever else they depend on (the
// compiler Debian built the kernel with, pahole, libraries) installed with
// the chroot's apt. Headers of other ABIs are removed.
func chrootHeaders(ctx context.Context, apt *privateApt, root, abi string) (string, error) {
	tree := "/usr/src/linux-headers-" + abi
	mark := filepath.Join(root, "usr", "src", ".softroce-"+abi)
	if fileExists(mark) && fileExists(filepath.Join(root, tree, "Makefile")) {
		return tree, nil
	}
	t0 := time.Now()
	dl, err := os.MkdirTemp(filepath.Join(root, "tmp"), "softroce-headers-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dl)
	pkg := "linux-headers-" + abi
	if err := apt.download(ctx, dl, pkg); err != nil {
		return "", err
	}
	var debs, needs []string
	addDeb := func(name string) error {
		got, _ := filepath.Glob(filepath.Join(dl, name+"_*.deb"))
		if len(got) != 1 {
			return fmt.Errorf("apt-get download %s left %d .deb files", name, len(got))
		}
		debs = append(debs, got[0])
		deps, err := output(ctx, "dpkg-deb", "-f", got[0], "Depends")
		if err != nil {
			return err
		}
		kbuild, other := splitHeaderDeps(deps)
		needs = append(needs, other...)
		for _, k := range kbuild {
			if err := apt.download(ctx, dl, k); err != nil {
				return err
			}
			got, _ := filepath.Glob(filepath.Join(dl, k+"_*.deb"))
			if len(got) != 1 {
				return fmt.Errorf("apt-get download %s left %d .deb files", k, len(got))
			}
			debs = append(debs, got[0])
			deps, err := output(ctx, "dpkg-deb", "-f", got[0], "Depends")
			if err != nil {
				return err
			}
			_, more := splitHeaderDeps(deps)
			needs = append(needs, more...)
		}
		return nil
	}
	if err := addDeb(pkg); err != nil {
		return "", err
	}
	if len(needs) > 0 {
		args := append([]string{"apt-get", "install", "-y", "-q", "--no-install-recommends"}, dedup(needs)...)
		if err := chrootRun(ctx, root, args...); err != nil {
			// The chroot's lists may be older than the archive.
			if uerr := chrootRun(ctx, root, "apt-get", "update", "-q"); uerr != nil {
				return "", fmt.Errorf("%w (and apt-get update: %v)", err, uerr)
			}
			if err := chrootRun(ctx, root, args...); err != nil {
				return "", err
			}
		}
	}
	// Remove the trees of other ABIs, then unpack this one.
	old, _ := filepath.Glob(filepath.Join(root, "usr", "src", "linux-headers-*"))
	oldKbuild, _ := filepath.Glob(filepath.Join(root, "usr", "lib", "linux-kbuild-*"))
	oldMarks, _ := filepath.Glob(filepath.Join(root, "usr", "src", ".softroce-*"))
	for _, o := range append(append(old, oldKbuild...), oldMarks...) {
		os.RemoveAll(o)
	}
	for _, d := range debs {
		if err := run(ctx, "", "dpkg-deb", "-x", d, root); err != nil {
			return "", err
		}
	}
	if !fileExists(filepath.Join(root, tree, "Makefile")) {
		return "", fmt.Errorf("%s unpacked into %s has no %s/Makefile", pkg, root, tree)
	}
	if err := os.WriteFile(mark, []byte(strings.Join(debs, "\n")+"\n"), 0o644); err != nil {
		return "", err
	}
	logf("headers %s installed in the build chroot in %.1fs", abi, time.Since(t0).Seconds())
	return tree, nil
}

// splitHeaderDeps sorts a kernel headers or kbuild package's dependencies
// into the kbuild packages that come with the ABI (linux-headers-*-common,
// linux-kbuild-*: unpacked alongside) and the rest the chroot's apt installs
// (gcc-14, gcc-16-for-host, pahole, libraries). The image and the linux-base
// packages, which the headers depend on only to be installed together, are
// left out.
func splitHeaderDeps(depends string) (kbuild, other []string) {
	for _, n := range depNames(depends) {
		switch {
		case strings.HasPrefix(n, "linux-headers-"), strings.HasPrefix(n, "linux-kbuild-"):
			kbuild = append(kbuild, n)
		case strings.HasPrefix(n, "linux-"):
		default:
			other = append(other, n)
		}
	}
	return kbuild, other
}

func dedup(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
