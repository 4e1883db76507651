package main

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
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

// A kernelFlavour knows where one kind of guest kernel comes from. Only
// Debian 12's is defined; a trixie kernel (6.12, or 7.x with rxe ODP) would be
// another flavour whose headers are installed into, and whose modules are
// built inside, a trixie chroot.
type kernelFlavour struct {
	imageMeta   string // metapackage naming the current image
	headersMeta string // metapackage naming the matching headers
	// prepare installs what building modules for abi needs and returns the
	// build tree.
	prepare func(ctx context.Context, abi string) (string, error)
}

var kernelFlavours = map[string]kernelFlavour{
	"bookworm": {
		imageMeta:   "linux-image-amd64",
		headersMeta: "linux-headers-amd64",
		prepare: func(ctx context.Context, abi string) (string, error) {
			// The headers go on the host: Debian built this kernel with the
			// host's gcc 12, and the kbuild tree refers to absolute paths.
			if err := ensurePackages(ctx, "linux-headers-"+abi); err != nil {
				return "", err
			}
			return "/usr/src/linux-headers-" + abi, nil
		},
	},
}

func kernelNames() string {
	var names []string
	for n := range kernelFlavours {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// resolveABI asks apt which ABI the flavour's metapackages point at now,
// refreshing apt's lists once when they are stale. The answer is remembered
// in memo for as long as apt's lists are unchanged (apt-cache takes over a
// second to load its cache).
func resolveABI(ctx context.Context, fl kernelFlavour, memo string) (string, error) {
	if err := aptUpdate(ctx, false); err != nil {
		return "", err
	}
	state := aptListsState()
	if b, err := os.ReadFile(memo); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 && f[0] == state {
			return f[1], nil
		}
	}
	out, err := output(ctx, "apt-cache", "depends", "--no-recommends", "--no-suggests", fl.imageMeta, fl.headersMeta)
	if err != nil {
		return "", fmt.Errorf("resolving the kernel ABI: %w", err)
	}
	var abi [2]string
	for i, meta := range []string{fl.imageMeta, fl.headersMeta} {
		prefix := strings.TrimSuffix(meta, "amd64")
		if abi[i], err = parseMetaDepends(out, prefix); err != nil {
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

// getKernel returns the named guest kernel, fetching and unpacking the
// current image into the cache unless it is already there. Images of ABIs
// the archive has moved past are removed from the cache.
func getKernel(ctx context.Context, name, cache string) (*Kernel, error) {
	fl, ok := kernelFlavours[name]
	if !ok {
		return nil, fmt.Errorf("unknown guest kernel %q (known: %s)", name, kernelNames())
	}
	abi, err := resolveABI(ctx, fl, filepath.Join(cache, "kernels", name, ".abi"))
	if err != nil {
		return nil, err
	}
	k := &Kernel{Name: name, ABI: abi, Root: filepath.Join(cache, "kernels", name, abi)}
	if k.Headers, err = fl.prepare(ctx, abi); err != nil {
		return nil, err
	}
	if !fileExists(filepath.Join(k.Root, ".complete")) {
		if err := fetchImage(ctx, fl, k); err != nil {
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

func fetchImage(ctx context.Context, fl kernelFlavour, k *Kernel) error {
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
	if err := run(ctx, dl, "apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", pkg); err != nil {
		return err
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s left %d .deb files", pkg, len(debs))
	}
	tree := filepath.Join(dl, "root")
	if err := run(ctx, "", "dpkg-deb", "-x", debs[0], tree); err != nil {
		return err
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
// k.Root) needed to load roots, as modprobe computes it from modules.dep.
func moduleClosure(ctx context.Context, k *Kernel, roots []string) ([]string, error) {
	args := append([]string{"-d", k.Root, "-S", k.ABI, "--show-depends", "-a"}, roots...)
	out, err := output(ctx, "modprobe", args...)
	if err != nil {
		return nil, err
	}
	mods, err := parseShowDepends(out)
	if err != nil {
		return nil, err
	}
	for _, m := range mods {
		if ext := filepath.Ext(m); ext != ".ko" {
			return nil, fmt.Errorf("module %s is compressed (%s): teach the initramfs builder to unpack it", m, ext)
		}
	}
	return mods, nil
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
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", k.Headers, "M="+out, "modules")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building %s against %s: %w\n%s", src, k.ABI, err, tail(string(b), 60))
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

// xzMagic starts the xz stream inside a bzImage built with CONFIG_KERNEL_XZ.
var xzMagic = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}

// extractVmlinux unpacks the ELF kernel from a bzImage (as the kernel's
// scripts/extract-vmlinux does) and keeps it only if it is an ELF file with
// a PVH entry note, which qemu can boot directly.
func extractVmlinux(ctx context.Context, bzImage, dst string) error {
	data, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	off := bytes.Index(data, xzMagic)
	if off < 0 {
		return fmt.Errorf("%s: no xz stream found", bzImage)
	}
	cmd := exec.CommandContext(ctx, "xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(data[off:])
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
