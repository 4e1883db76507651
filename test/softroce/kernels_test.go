package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseAptMirrors(t *testing.T) {
	// The host's sources: deb822 with a snapshot comment, a one-line
	// third-party list and another deb822 stanza that is not Debian's.
	text := `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main

deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
`
	m := parseAptMirrors(text)
	if m.archive != "http://deb.debian.org/debian" || m.security != "http://deb.debian.org/debian-security" {
		t.Errorf("deb822: %+v", m)
	}
	m = parseAptMirrors("# deb http://old/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\ndeb-src http://src/debian bookworm main\ndeb http://security.example/debian-security bookworm-security main\n")
	if m.archive != "http://mirror.example/debian" || m.security != "http://security.example/debian-security" {
		t.Errorf("one-line: %+v", m)
	}
	if m := parseAptMirrors("Types: deb\nURIs: http://x/debian\nSuites: bookworm\nEnabled: no\n"); m.archive != "" {
		t.Errorf("disabled stanza used: %+v", m)
	}
}

func TestSourcesFor(t *testing.T) {
	m := debianMirrors{archive: "http://a/debian", security: "http://a/debian-security"}
	got := sourcesFor(m, []string{"trixie", "trixie-security"}, "/k.gpg")
	want := []string{"deb [signed-by=/k.gpg] http://a/debian trixie main", "deb [signed-by=/k.gpg] http://a/debian-security trixie-security main"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q", got)
	}
	if got := sourcesFor(debianMirrors{archive: "http://a/debian"}, []string{"trixie", "trixie-security"}, ""); !reflect.DeepEqual(got, []string{"deb http://a/debian trixie main"}) {
		t.Errorf("no security mirror: %q", got)
	}
}

func TestMetaStanzaABI(t *testing.T) {
	// apt-cache depends for two metapackages (sid, 7.2): linux-base-amd64
	// comes first and must not be taken for the image.
	out := "linux-image-amd64\n  Depends: linux-base-amd64\n  Depends: linux-image-7.2.13+deb14-amd64\nlinux-headers-amd64\n  Depends: linux-base-amd64\n  Depends: linux-headers-7.2.13+deb14-amd64\n"
	for _, c := range []struct{ meta, prefix string }{{"linux-image-amd64", "linux-image-"}, {"linux-headers-amd64", "linux-headers-"}} {
		abi, err := parseMetaDepends(metaStanza(out, c.meta), c.prefix)
		if err != nil || abi != "7.2.13+deb14-amd64" {
			t.Errorf("%s: %q, %v", c.meta, abi, err)
		}
	}
	if s := metaStanza(out, "linux-headers-amd64"); bytes.Contains([]byte(s), []byte("linux-image-7")) {
		t.Errorf("headers stanza has the image's lines: %q", s)
	}
}

func TestDepNamesAndParts(t *testing.T) {
	// linux-image-7.2.13+deb14-amd64's Depends field.
	dep := "dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.2.13+deb14-amd64 (= 7.2.13-1), linux-binary-7.2.13+deb14-amd64 (= 7.2.13-1), linux-modules-7.2.13+deb14-amd64 (= 7.2.13-1)"
	if got := depNames(dep); !reflect.DeepEqual(got, []string{"dracut", "linux-base-7.2.13+deb14-amd64", "linux-binary-7.2.13+deb14-amd64", "linux-modules-7.2.13+deb14-amd64"}) {
		t.Errorf("depNames: %q", got)
	}
	if got := abiParts(dep, "7.2.13+deb14-amd64"); len(got) != 3 {
		t.Errorf("abiParts: %q", got)
	}
	// 6.12's image is one package.
	if got := abiParts("kmod, initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool", "6.12.118+deb13-amd64"); len(got) != 0 {
		t.Errorf("abiParts 6.12: %q", got)
	}
	if got := depNames("libc6:amd64 (>= 2.38),  ,pahole"); !reflect.DeepEqual(got, []string{"libc6", "pahole"}) {
		t.Errorf("depNames qualifiers: %q", got)
	}
}

func TestSplitHeaderDeps(t *testing.T) {
	for _, c := range []struct {
		deps          string
		kbuild, other []string
	}{
		{ // trixie, 6.12
			"linux-base (>= 4.12~), linux-headers-6.12.118+deb13-common (= 6.12.118-1), linux-image-6.12.118+deb13-amd64 (= 6.12.118-1) | linux-image-6.12.118+deb13-amd64-unsigned (= 6.12.118-1), linux-kbuild-6.12.118+deb13, gcc-14",
			[]string{"linux-headers-6.12.118+deb13-common", "linux-kbuild-6.12.118+deb13"}, []string{"gcc-14"},
		},
		{ // sid, 7.2
			"gcc-16-for-host, linux-base (>= 4.12~), linux-base-7.2.13+deb14-amd64 (= 7.2.13-1), linux-headers-7.2.13+deb14-common (= 7.2.13-1), linux-kbuild-7.2.13+deb14",
			[]string{"linux-headers-7.2.13+deb14-common", "linux-kbuild-7.2.13+deb14"}, []string{"gcc-16-for-host"},
		},
		{ // linux-kbuild-7.2.13+deb14
			"pahole, libc6 (>= 2.38), libelf1t64 (>= 0.144), libssl3t64 (>= 3.0.0), zlib1g (>= 1:1.2.3.4)",
			nil, []string{"pahole", "libc6", "libelf1t64", "libssl3t64", "zlib1g"},
		},
	} {
		kb, other := splitHeaderDeps(c.deps)
		if !reflect.DeepEqual(kb, c.kbuild) || !reflect.DeepEqual(other, c.other) {
			t.Errorf("%s:\n got %q %q", c.deps, kb, other)
		}
	}
}

func TestModuleNames(t *testing.T) {
	for in, want := range map[string]string{
		"/k/lib/modules/7/kernel/rdma_rxe.ko.xz": "/k/lib/modules/7/kernel/rdma_rxe.ko",
		"/k/rdma_rxe.ko.zst":                     "/k/rdma_rxe.ko",
		"/k/rdma_rxe.ko":                         "/k/rdma_rxe.ko",
	} {
		if got := plainModuleName(in); got != want {
			t.Errorf("plainModuleName(%s) = %s", in, got)
		}
		if _, ok := moduleCompression(in); !ok {
			t.Errorf("moduleCompression(%s) not ok", in)
		}
	}
	if cmd, _ := moduleCompression("x.ko"); cmd != nil {
		t.Errorf("plain module decompressed with %q", cmd)
	}
	if _, ok := moduleCompression("x.ko.lz4x"); ok {
		t.Error("unknown compression accepted")
	}
}

// fakeBzImage builds a bzImage-shaped file: setup_sects 2, payload at
// payload_offset inside the protected-mode part, followed by the 4-byte
// size the kernel's build appends.
func fakeBzImage(payload []byte) []byte {
	data := make([]byte, 3*512+64+len(payload)+4+100)
	data[0x1f1] = 2
	copy(data[0x202:], "HdrS")
	binary.LittleEndian.PutUint32(data[0x248:], 64)
	binary.LittleEndian.PutUint32(data[0x24c:], uint32(len(payload)+4))
	copy(data[3*512+64:], payload)
	binary.LittleEndian.PutUint32(data[3*512+64+len(payload):], 0xdeadbeef)
	return data
}

func TestBzImagePayload(t *testing.T) {
	for _, c := range []struct {
		payload []byte
		tool    string
	}{
		{append([]byte{0x28, 0xb5, 0x2f, 0xfd}, "zstd frame"...), "zstd"},
		{append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, "xz stream"...), "xz"},
	} {
		p, cmd, err := bzImagePayload(fakeBzImage(c.payload))
		if err != nil || !bytes.Equal(p, c.payload) || cmd[0] != c.tool {
			t.Errorf("%s: %q %q %v", c.tool, p, cmd, err)
		}
	}
	if _, _, err := bzImagePayload(fakeBzImage([]byte("gzip?"))); err == nil {
		t.Error("unknown compression: no error")
	}
	if _, _, err := bzImagePayload(make([]byte, 4096)); err == nil {
		t.Error("no setup header: no error")
	}
}

func TestNormaliseTree(t *testing.T) {
	const abi = "7.2.13+deb14-amd64"
	tree := t.TempDir()
	mods := filepath.Join(tree, "usr", "lib", "modules", abi)
	if err := os.MkdirAll(mods, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mods, "vmlinuz"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := normaliseTree(tree, abi); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(tree, "boot", "vmlinuz-"+abi)); err != nil || string(b) != "k" {
		t.Errorf("vmlinuz: %q %v", b, err)
	}
	if !fileExists(filepath.Join(tree, "lib", "modules", abi)) {
		t.Error("lib/modules not reachable")
	}
	if err := normaliseTree(t.TempDir(), abi); err == nil {
		t.Error("empty tree: no error")
	}
}

func TestParseKernels(t *testing.T) {
	for in, want := range map[string][]string{
		"bookworm":          {"bookworm"},
		"trixie,sid":        {"trixie", "sid"},
		"sid, sid,bookworm": {"sid", "bookworm"},
		"all":               kernelOrder,
	} {
		if got, err := parseKernels(in); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseKernels(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "bullseye", "trixie,", "all,sid"} {
		if _, err := parseKernels(bad); err == nil {
			t.Errorf("parseKernels(%q): no error", bad)
		}
	}
	for _, k := range kernelOrder {
		if _, ok := kernelFlavours[k]; !ok {
			t.Errorf("kernelOrder names %q, which has no flavour", k)
		}
	}
	if len(kernelOrder) != len(kernelFlavours) {
		t.Errorf("kernelOrder %q does not list every flavour", kernelOrder)
	}
	if runDirName("smoke-2guest", "bookworm") != "smoke-2guest" || runDirName("smoke-2guest", "sid") != "smoke-2guest@sid" {
		t.Error("runDirName")
	}
}
