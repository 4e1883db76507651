package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

var (
	//go:embed guest/init
	guestInit []byte
	//go:embed guest/tools
	guestTools string
	//go:embed guest/modules
	guestModules string
)

// listLines returns the non-comment, non-blank lines of a list file.
func listLines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		t := strings.TrimSpace(sc.Text())
		if t != "" && !strings.HasPrefix(t, "#") {
			out = append(out, t)
		}
	}
	return out
}

// initramfsFile is one file to put into the initramfs: the host file src
// lands at dst.
type initramfsFile struct{ src, dst string }

// collectFiles resolves the tool list into host files and their shared
// library closure, each with the path it takes in the guest.
func collectFiles(ctx context.Context, tools []string) ([]initramfsFile, error) {
	path := "/usr/sbin:/usr/bin:/sbin:/bin"
	seen := map[string]bool{}
	var files []initramfsFile
	add := func(p string) error {
		dst, err := guestPath(p)
		if err != nil {
			return err
		}
		if seen[dst] {
			return nil
		}
		seen[dst] = true
		src, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		files = append(files, initramfsFile{src: src, dst: dst})
		return nil
	}
	for _, t := range tools {
		p := t
		if !strings.HasPrefix(t, "/") {
			found := ""
			for _, dir := range filepath.SplitList(path) {
				if st, err := os.Stat(filepath.Join(dir, t)); err == nil && st.Mode().IsRegular() {
					found = filepath.Join(dir, t)
					break
				}
			}
			if found == "" {
				return nil, fmt.Errorf("guest tool %q not found on the host in %s: install its package (add it to hostPackages)", t, path)
			}
			p = found
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("guest file: %w", err)
		}
		if err := add(p); err != nil {
			return nil, err
		}
		libs, err := sharedLibs(ctx, p)
		if err != nil {
			return nil, err
		}
		for _, l := range libs {
			if err := add(l); err != nil {
				return nil, err
			}
		}
	}
	return files, nil
}

// guestPath is where a host file goes in the guest: its directory with
// symlinks resolved (so /lib/x/libc.so.6 lands in /usr/lib/x on a merged-/usr
// host) and its own name kept (a soname stays a soname).
func guestPath(p string) (string, error) {
	dir, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.Base(p)), nil
}

// sharedLibs returns the shared libraries a dynamically linked ELF file
// needs, and nothing for any other file.
func sharedLibs(ctx context.Context, p string) ([]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	var hdr [4]byte
	_, err = io.ReadFull(f, hdr[:])
	f.Close()
	if err != nil || string(hdr[:]) != "\x7fELF" {
		return nil, nil
	}
	out, err := exec.CommandContext(ctx, "ldd", p).CombinedOutput()
	if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w: %s", p, err, out)
	}
	libs, err := parseLdd(string(out))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return libs, nil
}

// buildInitramfs returns a cpio archive for kernel k, building it only when
// no archive with the same inputs is cached.
func buildInitramfs(ctx context.Context, k *Kernel, cache string) (string, error) {
	mods, err := moduleClosure(ctx, k, listLines(guestModules))
	if err != nil {
		return "", fmt.Errorf("module closure: %w", err)
	}
	files, err := collectFiles(ctx, listLines(guestTools))
	if err != nil {
		return "", err
	}
	for _, m := range mods {
		rel, err := filepath.Rel(k.Root, m)
		if err != nil || strings.HasPrefix(rel, "..") {
			return "", fmt.Errorf("module %s outside the kernel tree %s", m, k.Root)
		}
		// Compressed modules are unpacked into the archive (stageInitramfs).
		files = append(files, initramfsFile{src: m, dst: "/usr/" + plainModuleName(rel)})
	}
	var modList strings.Builder
	for _, m := range mods {
		rel, _ := filepath.Rel(k.Root, m)
		fmt.Fprintf(&modList, "/usr/%s\n", plainModuleName(rel))
	}

	key, err := initramfsKey(k, files, modList.String())
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "initramfs")
	out := filepath.Join(dir, fmt.Sprintf("%s-%s-%s.cpio", k.Name, k.ABI, key[:16]))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	logf("building the guest initramfs (%d files, %d modules)", len(files), len(mods))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	stage, err := os.MkdirTemp(dir, ".stage-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(stage)
	if err := stageInitramfs(stage, files, modList.String()); err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	cpio := exec.CommandContext(ctx, "sh", "-c", `find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R +0:+0 > "$0"`, tmp)
	cpio.Dir = stage
	if b, err := cpio.CombinedOutput(); err != nil {
		return "", fmt.Errorf("cpio: %w: %s", err, b)
	}
	// Drop archives built from older inputs.
	old, _ := filepath.Glob(filepath.Join(dir, k.Name+"-*.cpio"))
	for _, o := range old {
		os.Remove(o)
	}
	return out, os.Rename(tmp, out)
}

// initramfsFormat changes whenever the builder changes what it makes of
// the same inputs, so that cached archives are rebuilt.
const initramfsFormat = 2

// initramfsKey hashes everything the archive is made of.
func initramfsKey(k *Kernel, files []initramfsFile, modList string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%d\x00%s\x00%s\x00%s\x00", initramfsFormat, k.Name, k.ABI, modList)
	h.Write(guestInit)
	sorted := append([]initramfsFile(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].dst < sorted[j].dst })
	for _, f := range sorted {
		st, err := os.Stat(f.src)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00", f.src, f.dst, st.Size(), st.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func stageInitramfs(stage string, files []initramfsFile, modList string) error {
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc/lab", "proc", "sys", "dev", "tmp", "run", "root"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return err
		}
	}
	// A merged /usr, like the host's, so ldd's paths are valid in the guest.
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(stage, l)); err != nil {
			return err
		}
	}
	for _, f := range files {
		dst := filepath.Join(stage, f.dst)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if unpack, _ := moduleCompression(f.src); unpack != nil {
			if err := unpackFile(unpack, f.src, dst); err != nil {
				return err
			}
		} else if err := copyFile(f.src, dst); err != nil {
			return err
		}
		if strings.HasSuffix(dst, ".ko") {
			if err := stripModuleSignature(dst); err != nil {
				return err
			}
		}
	}
	etc := map[string]string{
		"init":            string(guestInit),
		"etc/lab/modules": modList,
		"etc/passwd":      "root:x:0:0:root:/root:/usr/bin/bash\n",
		"etc/group":       "root:x:0:\n",
		"etc/hosts":       "127.0.0.1 localhost\n::1 localhost\n",
		"etc/profile":     "export PATH=/usr/sbin:/usr/bin:/usr/local/bin\nPS1='\\h:\\w# '\n",
	}
	for name, content := range etc {
		mode := os.FileMode(0o644)
		if name == "init" {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(stage, name), []byte(content), mode); err != nil {
			return err
		}
	}
	return nil
}

// unpackFile decompresses src into dst with the command unpack (e.g. xz -dc).
func unpackFile(unpack []string, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	cmd := exec.Command(unpack[0], unpack[1:]...)
	cmd.Stdin, cmd.Stdout = in, out
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", strings.Join(unpack, " "), src, err, stderr.String())
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// moduleSigMagic ends a signed kernel module.
const moduleSigMagic = "~Module signature appended~\n"

// stripModuleSignature removes the signature Debian appends to its modules.
// The guest kernel does not enforce signatures, and checking them under TCG
// costs about a second of every boot. (Loading an unsigned module taints
// the kernel, which our own out-of-tree module does anyway.)
func stripModuleSignature(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	n, ok := unsignedLen(data)
	if !ok {
		return nil
	}
	return os.Truncate(path, int64(n))
}

// unsignedLen returns the length of a module without its appended
// signature: [module][signature][struct module_signature, 12 bytes][magic].
func unsignedLen(data []byte) (int, bool) {
	const infoLen = 12
	if !bytes.HasSuffix(data, []byte(moduleSigMagic)) || len(data) < len(moduleSigMagic)+infoLen {
		return 0, false
	}
	info := data[len(data)-len(moduleSigMagic)-infoLen : len(data)-len(moduleSigMagic)]
	sigLen := int(binary.BigEndian.Uint32(info[8:]))
	n := len(data) - len(moduleSigMagic) - infoLen - sigLen
	if n <= 0 {
		return 0, false
	}
	return n, true
}
