package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// A Kernel is a guest kernel ready to boot: an unpacked image with its
// modules and modules.dep, and the build tree that out-of-tree modules are
// compiled against.
type Kernel struct {
	Name    string // the flavour, e.g. "bookworm"
	ABI     string // e.g. "6.1.0-56-amd64"
	Root    string // unpacked image: boot/vmlinuz-ABI and lib/modules/ABI
	Headers string // the kbuild tree: make -C Headers M=dir modules
	// Chroot, when set, is the build chroot that Headers is a path in:
	// modules are built inside it (buildModule).
	Chroot string
}

// Vmlinuz is the path of the compressed kernel image.
func (k *Kernel) Vmlinuz() string { return filepath.Join(k.Root, "boot", "vmlinuz-"+k.ABI) }

// Image is what qemu boots: the uncompressed ELF vmlinux, entered through
// PVH, when it could be extracted; else the compressed image. Under TCG,
// decompressing the kernel in the guest costs about 6 s of every boot.
func (k *Kernel) Image() string {
	if p := filepath.Join(k.Root, "boot", "vmlinux-"+k.ABI); fileExists(p) {
		return p
	}
	return k.Vmlinuz()
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// ModDir is the unpacked /lib/modules/ABI.
func (k *Kernel) ModDir() string { return filepath.Join(k.Root, "lib", "modules", k.ABI) }

// A kernelFlavour knows where one kind of guest kernel comes from and how
// modules are built for it.
type kernelFlavour struct {
	imageMeta   string // metapackage naming the current image
	headersMeta string // metapackage naming the matching headers
	// suites, when set, are the Debian suites the kernel comes from, read
	// through the lab's own apt configuration (privateApt) on the host's
	// mirror; when unset, the host's apt sources.
	suites []string
	// chroot, when set, is the Debian suite of the build chroot (made with
	// debootstrap, chroot.go) into which the headers are unpacked and in
	// which modules are built; when unset, the headers are installed on the
	// host and modules built there.
	chroot string
}

var kernelFlavours = map[string]kernelFlavour{
	// Debian 12, 6.1: Debian built it with the host's gcc 12, and its kbuild
	// tree refers to absolute paths, so the headers go on the host.
	"bookworm": {imageMeta: "linux-image-amd64", headersMeta: "linux-headers-amd64"},
	// Debian 13, 6.12, built with trixie's gcc 14.
	"trixie": {
		imageMeta: "linux-image-amd64", headersMeta: "linux-headers-amd64",
		suites: []string{"trixie", "trixie-updates", "trixie-security"},
		chroot: "trixie",
	},
	// Debian unstable, 7.x (rxe with ODP), built with sid's compiler (gcc 16
	// at 7.2), so its modules are built in a sid chroot.
	"sid": {
		imageMeta: "linux-image-amd64", headersMeta: "linux-headers-amd64",
		suites: []string{"sid"},
		chroot: "sid",
	},
}

// kernelOrder lists the flavours from oldest to newest.
var kernelOrder = []string{"bookworm", "trixie", "sid"}

func kernelNames() string { return strings.Join(kernelOrder, ", ") }

// aptFor returns the flavour's private apt configuration, or nil for the
// host's.
func aptFor(fl kernelFlavour, name, cache string) (*privateApt, error) {
	if fl.suites == nil {
		return nil, nil
	}
	return newPrivateApt(cache, name, fl.suites)
}

// resolveABI asks apt which ABI the flavour's metapackages point at now,
// refreshing apt's lists once when they are stale. The answer is remembered
// in memo for as long as apt's lists are unchanged (apt-cache takes over a
// second to load its cache).
func resolveABI(ctx context.Context, fl kernelFlavour, apt *privateApt, memo string) (string, error) {
	var state string
	var aptArgs []string
	if apt == nil {
		if err := aptUpdate(ctx, false); err != nil {
			return "", err
		}
		state = aptListsState()
	} else {
		if err := apt.update(ctx, false); err != nil {
			return "", err
		}
		state = listsState(apt.listsDir())
		aptArgs = apt.args()
	}
	if b, err := os.ReadFile(memo); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 && f[0] == state {
			return f[1], nil
		}
	}
	args := append(aptArgs, "depends", "--no-recommends", "--no-suggests", fl.imageMeta, fl.headersMeta)
	out, err := output(ctx, "apt-cache", args...)
	if err != nil {
		return "", fmt.Errorf("resolving the kernel ABI: %w", err)
	}
	var abi [2]string
	for i, meta := range []string{fl.imageMeta, fl.headersMeta} {
		prefix := strings.TrimSuffix(meta, "amd64")
		if abi[i], err = parseMetaDepends(metaStanza(out, meta), prefix); err != nil {
			return "", fmt.Errorf("resolving the kernel ABI from %s: %w", meta, err)
		}
	}
	if abi[0] != abi[1] {
		return "", fmt.Errorf("%s points at %s but %s at %s: the archive is mid-update, retry later", fl.imageMeta, abi[0], fl.headersMeta, abi[1])
	}
	if err := os.MkdirAll(filepath.Dir(memo), 0o755); err == nil {
		_ = os.WriteFile(memo, []byte(state+" "+abi[0]+"\n"), 0o644)
	}
	return abi[0], nil
}

// metaStanza returns the part of `apt-cache depends A B` output that is
// about package pkg: its name line and the indented lines below it.
func metaStanza(out, pkg string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(out, "\n") {
		if line != "" && line[0] != ' ' && line[0] != '\t' && line[0] != '|' {
			in = strings.TrimSpace(line) == pkg
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// getKernel returns the named guest kernel, fetching and unpacking the
// current image into the cache unless it is already there, and the tree
// its modules are built against. Images of ABIs the archive has moved past
// are removed from the cache.
func getKernel(ctx context.Context, name, cache string) (*Kernel, error) {
	fl, ok := kernelFlavours[name]
	if !ok {
		return nil, fmt.Errorf("unknown guest kernel %q (known: %s)", name, kernelNames())
	}
	apt, err := aptFor(fl, name, cache)
	if err != nil {
		return nil, err
	}
	abi, err := resolveABI(ctx, fl, apt, filepath.Join(cache, "kernels", name, ".abi"))
	if err != nil {
		return nil, err
	}
	k := &Kernel{Name: name, ABI: abi, Root: filepath.Join(cache, "kernels", name, abi)}
	if fl.chroot == "" {
		if err := ensurePackages(ctx, "linux-headers-"+abi); err != nil {
			return nil, err
		}
		k.Headers = "/usr/src/linux-headers-" + abi
	} else {
		if k.Chroot, err = ensureChroot(ctx, cache, fl.chroot, sourcesFor(mustMirrors(), fl.suites, "")); err != nil {
			return nil, err
		}
		if k.Headers, err = chrootHeaders(ctx, apt, k.Chroot, abi); err != nil {
			return nil, err
		}
	}
	if !fileExists(filepath.Join(k.Root, ".complete")) {
		if err := fetchImage(ctx, fl, apt, k); err != nil {
			return nil, err
		}
		pruneKernels(filepath.Dir(k.Root), abi)
	}
	if !fileExists(filepath.Join(k.Root, "boot", "vmlinux-"+abi)) {
		if err := extractVmlinux(ctx, k.Vmlinuz(), filepath.Join(k.Root, "boot", "vmlinux-"+abi)); err != nil {
			logf("booting the compressed image (slower): %v", err)
		}
	}
	return k, nil
}

func mustMirrors() debianMirrors {
	m, _ := hostMirrors() // aptFor already failed if there is none
	return m
}

// fetchImage downloads linux-image-<abi> (and, from 7.x on, the packages it
// is split into: linux-binary-, linux-modules- and linux-base-<abi>),
// unpacks them, lays the tree out as boot/vmlinuz-ABI and lib/modules/ABI
// whatever the package put where, and runs depmod on it.
func fetchImage(ctx context.Context, fl kernelFlavour, apt *privateApt, k *Kernel) error {
	pkg := strings.TrimSuffix(fl.imageMeta, "amd64") + k.ABI
	logf("fetching guest kernel %s", pkg)
	dl, err := os.MkdirTemp(filepath.Dir(k.Root), ".fetch-")
	if err != nil {
		if err = os.MkdirAll(filepath.Dir(k.Root), 0o755); err == nil {
			dl, err = os.MkdirTemp(filepath.Dir(k.Root), ".fetch-")
		}
		if err != nil {
			return fmt.Errorf("kernel cache: %w", err)
		}
	}
	defer os.RemoveAll(dl)
	download := func(pkgs ...string) error {
		if apt != nil {
			return apt.download(ctx, dl, pkgs...)
		}
		return run(ctx, dl, "apt-get", append([]string{"download", "-q", "-o", "APT::Sandbox::User=root"}, pkgs...)...)
	}
	if err := download(pkg); err != nil {
		return err
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s left %d .deb files", pkg, len(debs))
	}
	deps, err := output(ctx, "dpkg-deb", "-f", debs[0], "Depends")
	if err != nil {
		return err
	}
	if parts := abiParts(deps, k.ABI); len(parts) > 0 {
		if err := download(parts...); err != nil {
			return err
		}
		debs, _ = filepath.Glob(filepath.Join(dl, "*.deb"))
	}
	tree := filepath.Join(dl, "root")
	for _, d := range debs {
		if err := run(ctx, "", "dpkg-deb", "-x", d, tree); err != nil {
			return err
		}
	}
	if err := normaliseTree(tree, k.ABI); err != nil {
		return fmt.Errorf("%s: %w", pkg, err)
	}
	// The package ships no modules.dep; depmod makes it for the unpacked tree.
	if err := run(ctx, "", "depmod", "-b", tree, k.ABI); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(tree, "boot", "vmlinuz-"+k.ABI)); err != nil {
		return fmt.Errorf("%s has no kernel image: %w", pkg, err)
	}
	if err := os.WriteFile(filepath.Join(tree, ".complete"), []byte(pkg+"\n"), 0o644); err != nil {
		return err
	}
	os.RemoveAll(k.Root)
	return os.Rename(tree, k.Root)
}

// normaliseTree gives an unpacked kernel the layout the lab and the host's
// depmod and modprobe expect: Debian 13 on puts the modules in
// /usr/lib/modules (lib becomes a link to usr/lib, as on a merged-/usr
// system), and 7.x its kernel at /usr/lib/modules/ABI/vmlinuz (moved to
// boot/vmlinuz-ABI).
func normaliseTree(tree, abi string) error {
	if !fileExists(filepath.Join(tree, "lib")) && fileExists(filepath.Join(tree, "usr", "lib", "modules", abi)) {
		if err := os.Symlink("usr/lib", filepath.Join(tree, "lib")); err != nil {
			return err
		}
	}
	if !fileExists(filepath.Join(tree, "lib", "modules", abi)) {
		return fmt.Errorf("no lib/modules/%s", abi)
	}
	vmlinuz := filepath.Join(tree, "boot", "vmlinuz-"+abi)
	if inMods := filepath.Join(tree, "lib", "modules", abi, "vmlinuz"); !fileExists(vmlinuz) && fileExists(inMods) {
		if err := os.MkdirAll(filepath.Dir(vmlinuz), 0o755); err != nil {
			return err
		}
		return os.Rename(inMods, vmlinuz)
	}
	return nil
}

// pruneKernels removes cached images other than keep.
func pruneKernels(dir, keep string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() && e.Name() != keep && !strings.HasPrefix(e.Name(), ".") {
			logf("removing cached guest kernel %s", e.Name())
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// moduleClosure returns, in load order, the module files (absolute paths in
// k.Root, possibly compressed) needed to load roots, as modprobe computes
// it from modules.dep. A root written "name?" is loaded only when the
// kernel has it (as a module or built in).
func moduleClosure(ctx context.Context, k *Kernel, roots []string) ([]string, error) {
	var names []string
	for _, r := range roots {
		name, optional := strings.CutSuffix(r, "?")
		if optional {
			if _, err := output(ctx, "modprobe", "-d", k.Root, "-S", k.ABI, "--show-depends", name); err != nil {
				continue
			}
		}
		names = append(names, name)
	}
	args := append([]string{"-d", k.Root, "-S", k.ABI, "--show-depends", "-a"}, names...)
	out, err := output(ctx, "modprobe", args...)
	if err != nil {
		return nil, err
	}
	mods, err := parseShowDepends(out)
	if err != nil {
		return nil, err
	}
	for _, m := range mods {
		if _, ok := moduleCompression(m); !ok && filepath.Ext(m) != ".ko" {
			return nil, fmt.Errorf("module %s: unknown format", m)
		}
	}
	return mods, nil
}

// moduleCompression returns the command that decompresses a compressed
// module file (Debian 13 on ships them .ko.xz), or nil for a plain .ko;
// ok is false for a name that is neither.
func moduleCompression(name string) (cmd []string, ok bool) {
	switch {
	case strings.HasSuffix(name, ".ko"):
		return nil, true
	case strings.HasSuffix(name, ".ko.xz"):
		return []string{"xz", "-dc"}, true
	case strings.HasSuffix(name, ".ko.zst"):
		return []string{"zstd", "-dcq"}, true
	case strings.HasSuffix(name, ".ko.gz"):
		return []string{"gzip", "-dc"}, true
	}
	return nil, false
}

// plainModuleName is a module file's name without its compression suffix.
func plainModuleName(name string) string {
	if i := strings.LastIndex(name, ".ko"); i >= 0 {
		return name[:i+3]
	}
	return name
}

// buildModule compiles the out-of-tree module whose sources are in src
// against k into out, copying only changed sources so that kbuild's own
// dependency tracking keeps rebuilds incremental. It returns the .ko files.
func buildModule(ctx context.Context, k *Kernel, src, out string) ([]string, error) {
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := filepath.Join(out, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !isModuleSource(d.Name()) {
			return nil
		}
		return copyIfChanged(p, dst)
	})
	if err != nil {
		return nil, fmt.Errorf("staging module sources %s: %w", src, err)
	}
	if k.Chroot != "" {
		// out is bind-mounted at /lab/build inside the chroot.
		if _, err := chrootCmd(ctx, k.Chroot, out, "make", "-s", "-C", k.Headers, "M=/lab/build", "modules"); err != nil {
			return nil, fmt.Errorf("building %s against %s (M=/lab/build is %s): %w", src, k.ABI, out, err)
		}
	} else {
		cmd := exec.CommandContext(ctx, "make", "-s", "-C", k.Headers, "M="+out, "modules")
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s against %s: %w\n%s", src, k.ABI, err, tail(string(b), 60))
		}
	}
	kos, _ := filepath.Glob(filepath.Join(out, "*.ko"))
	if len(kos) == 0 {
		return nil, fmt.Errorf("building %s produced no .ko", src)
	}
	return kos, nil
}

func isModuleSource(name string) bool {
	switch filepath.Ext(name) {
	case ".c", ".h", ".S":
		return true
	}
	return name == "Kbuild" || name == "Makefile"
}

func copyIfChanged(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(dst); err == nil && string(old) == string(data) {
		return nil
	}
	return os.WriteFile(dst, data, 0o644)
}

// bzImagePayload returns the compressed kernel inside a bzImage, as the
// boot protocol's setup header locates it (setup_sects at 0x1f1,
// payload_offset and payload_length at 0x248), without the 4-byte
// decompressed size the build appends, and the command that decompresses
// it (xz for Debian 12's kernels, zstd for 13's and later).
func bzImagePayload(data []byte) ([]byte, []string, error) {
	if len(data) < 0x250 || string(data[0x202:0x206]) != "HdrS" {
		return nil, nil, fmt.Errorf("not a bzImage (no HdrS setup header)")
	}
	sects := int(data[0x1f1])
	if sects == 0 {
		sects = 4
	}
	off := (sects+1)*512 + int(binary.LittleEndian.Uint32(data[0x248:]))
	n := int(binary.LittleEndian.Uint32(data[0x24c:]))
	if n <= 4 || off+n > len(data) {
		return nil, nil, fmt.Errorf("bzImage payload at %d+%d outside the file (%d bytes)", off, n, len(data))
	}
	p := data[off : off+n-4]
	switch {
	case bytes.HasPrefix(p, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}):
		return p, []string{"xz", "-dc", "--single-stream"}, nil
	case bytes.HasPrefix(p, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return p, []string{"zstd", "-dcq"}, nil
	}
	return nil, nil, fmt.Errorf("bzImage payload compressed with an unknown method (magic % x)", p[:min(len(p), 6)])
}

// extractVmlinux unpacks the ELF kernel from a bzImage (as the kernel's
// scripts/extract-vmlinux does) and keeps it only if it is an ELF file with
// a PVH entry note, which qemu can boot directly.
func extractVmlinux(ctx context.Context, bzImage, dst string) error {
	data, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	payload, unpack, err := bzImagePayload(data)
	if err != nil {
		return fmt.Errorf("%s: %w", bzImage, err)
	}
	if err := ensurePackages(ctx, map[string]string{"xz": "xz-utils", "zstd": "zstd"}[unpack[0]]); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, unpack[0], unpack[1:]...)
	cmd.Stdin = bytes.NewReader(payload)
	elfData, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("unpacking %s: %w", bzImage, err)
	}
	if err := checkPVH(elfData); err != nil {
		return fmt.Errorf("%s: %w", bzImage, err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, elfData, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// checkPVH reports whether an ELF kernel has the Xen PVH entry note
// (XEN_ELFNOTE_PHYS32_ENTRY) that qemu's -kernel needs to boot it.
func checkPVH(data []byte) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an ELF kernel: %w", err)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(p.Open())
		if err != nil {
			return err
		}
		for len(notes) >= 12 {
			nsz := int(f.ByteOrder.Uint32(notes[0:]))
			dsz := int(f.ByteOrder.Uint32(notes[4:]))
			typ := f.ByteOrder.Uint32(notes[8:])
			name := notes[12:min(len(notes), 12+nsz)]
			if typ == 18 && bytes.HasPrefix(name, []byte("Xen")) {
				return nil
			}
			adv := 12 + (nsz+3)&^3 + (dsz+3)&^3
			if adv > len(notes) {
				break
			}
			notes = notes[adv:]
		}
	}
	return fmt.Errorf("no PVH entry note (kernel built without CONFIG_PVH)")
}
