package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sockets"
)

func runArgs(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrorsExit2(t *testing.T) {
	cases := [][]string{
		{"serve", "--log-level", "loud"},
		{"serve", "--listen", "nowhere"},
		{"serve", "--rxe", "rxe0"},
		{"serve", "--no-such-flag"},
		{"serve", "extra"},
		{"frobnicate"},
		{"serve", "--config", "/nonexistent/rvmad.json"},
	}
	for _, args := range cases {
		code, _, stderr := runArgs(args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, stderr)
		}
		if strings.Contains(stderr, "goroutine") || strings.Contains(stderr, "panic") {
			t.Errorf("%v: stack trace: %s", args, stderr)
		}
	}
	_, _, stderr := runArgs("serve", "--log-level", "loud")
	if !strings.Contains(stderr, "log_level") || !strings.Contains(stderr, "--log-level") {
		t.Errorf("message does not name the field: %s", stderr)
	}
}

func TestDevicesCommand(t *testing.T) {
	root, _ := filepath.Abs(filepath.Join("testdata", "sysfs-rxe"))
	code, out, stderr := runArgs("devices", "--sysfs-root", root)
	if code != exitOK || !strings.Contains(out, "rxe0") || !strings.Contains(out, "RoCE v2") || !strings.Contains(out, "1024/1500") {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	code, out, _ = runArgs("devices", "--json", "--sysfs-root", root)
	var inv struct {
		Devices []struct {
			Name   string `json:"name"`
			Parent string `json:"parent"`
			Ports  []struct {
				Port      int    `json:"port"`
				StateName string `json:"state_name"`
				GIDs      []struct {
					Index int    `json:"index"`
					Type  string `json:"type"`
				} `json:"gids"`
			} `json:"ports"`
			CharDevices []string `json:"char_devices"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(out), &inv); err != nil || code != exitOK {
		t.Fatalf("exit %d, %v\n%s", code, err, out)
	}
	d := inv.Devices[0]
	if d.Name != "rxe0" || d.Parent != "eth0" || d.Ports[0].StateName != "ACTIVE" || d.Ports[0].GIDs[1].Type != "RoCE v2" || len(d.CharDevices) != 1 {
		t.Fatalf("inventory %+v", inv)
	}
	code, _, stderr = runArgs("devices", "--sysfs-root", t.TempDir())
	if code != exitFail || !strings.Contains(stderr, "no RDMA subsystem") {
		t.Fatalf("no RDMA: exit %d, %s", code, stderr)
	}
}

func TestLintCommand(t *testing.T) {
	for _, fx := range []string{"sysfs-rxe", "sysfs-hca"} {
		root, _ := filepath.Abs(filepath.Join("testdata", fx))
		code, out, stderr := runArgs("lint", "--sysfs-root", root)
		if code != exitOK || !strings.Contains(out, "no lint problems") {
			t.Fatalf("%s: exit %d\n%s\n%s", fx, code, out, stderr)
		}
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	if _, err := os.Stat("rvmad.example.json"); err != nil {
		t.Skip("no example config")
	}
	code, _, stderr := runArgs("serve", "--config", "rvmad.example.json", "--listen", "127.0.0.1:bad")
	if code != exitUsage || !strings.Contains(stderr, "listen") || strings.Contains(stderr, "rvmad.example.json: ") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}

// TestStrictConfigExits2 starts `rvmad serve` with each configuration the
// strict checks reject: exit status 2 and one line on stderr naming the
// field or flag. Every case would also fail without its check (a bad
// listen address or a missing device), so none can start a daemon that
// keeps running.
func TestStrictConfigExits2(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "no-sysfs")
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--config", file("trailing.json", `{"log_level":"debug"} }}} not json`), "--listen", "127.0.0.1:bad"}, []string{"trailing.json", "one JSON object and nothing after it"}},
		{[]string{"--config", file("second.json", "{\"log_level\":\"debug\"}\n{\"log_level\":\"warn\"}"), "--listen", "127.0.0.1:bad"}, []string{"second.json", "line 2", `found "{"`}},
		{[]string{"--config", file("null.json", `{"log_format": null}`), "--listen", "127.0.0.1:bad"}, []string{`field "log_format"`, "null"}},
		{[]string{"--config", file("nullbool.json", `{"remove_created_links": null}`), "--listen", "127.0.0.1:bad"}, []string{`field "remove_created_links"`, "null"}},
		{[]string{"--config", file("case.json", `{"rxe": [{"name": "rxe0", "Netdev": "eth0"}]}`), "--listen", "127.0.0.1:bad"}, []string{`field "rxe" at [0]`, `"Netdev"`, `"netdev"`}},
		{[]string{"--config", file("topcase.json", `{"Log_Level": "debug"}`), "--listen", "127.0.0.1:bad"}, []string{`field "Log_Level"`, `"log_level"`}},
		{[]string{"--device", "", "--listen", "127.0.0.1:bad"}, []string{"flag --device", "empty"}},
		{[]string{"--rxe", "", "--listen", "127.0.0.1:bad"}, []string{"flag --rxe", "empty"}},
		{[]string{"--sysfs-root", missing, "--listen", "127.0.0.1:0", "--device", "nosuchdev0"}, []string{"sysfs_root", "--sysfs-root", missing}},
	}
	for _, tc := range cases {
		code, _, stderr := runArgs(append([]string{"serve"}, tc.args...)...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d: %s", tc.args, code, exitUsage, stderr)
		}
		if strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: not one line: %q", tc.args, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%q: %q lacks %q", tc.args, stderr, w)
			}
		}
	}
	code, _, stderr := runArgs("lint", "--sysfs-root", missing)
	if code != exitUsage || !strings.Contains(stderr, "sysfs_root") {
		t.Errorf("lint with a missing root: exit %d: %s", code, stderr)
	}
}

func TestSocketsCommand(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "sockets.sock")
	code, _, stderr := runArgs("sockets", "--socket", sock)
	if code != exitFail || !strings.Contains(stderr, "sockets broker") {
		t.Fatalf("no rvmad: exit %d, %s", code, stderr)
	}
	b := sockets.NewBroker(sockets.Options{MaxPerUID: 10}, nil)
	if err := b.Listen(sock); err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	code, out, stderr := runArgs("sockets", "--socket", sock)
	if code != exitOK || !strings.Contains(out, "PID") || !strings.Contains(out, "RDMA_IN") {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	code, out, stderr = runArgs("sockets", "--json", "--socket", sock)
	if code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("json: exit %d\n%s\n%s", code, out, stderr)
	}
	if code, _, _ := runArgs("sockets", "extra"); code != exitUsage {
		t.Errorf("extra argument: exit %d", code)
	}
}
