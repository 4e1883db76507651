package daemon

import (
	"bytes"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

// syncBuffer is a bytes.Buffer safe for the daemon's goroutines and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReloadKeepsRunningConfigOnBadFile re-reads, on SIGHUP, config files
// the strict parser and the host check reject, through the same Load as
// `rvmad serve`: each is logged as rejected with the field at fault, the
// running configuration stays (no service reloaded), and a good file after
// them is applied.
func TestReloadKeepsRunningConfigOnBadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rvmad.json")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"devices": ["rxe0"], "shutdown_timeout": "2s"}`)
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	flags := config.BindFlags(fs)
	if err := fs.Parse([]string{"--config", p, "--listen", "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := flags.Load()
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	h := start(t, cfg, func(h *harness) {
		h.reload = flags.Load
		h.log = slog.New(slog.NewTextHandler(logs, nil))
	})
	<-h.addr

	const rejected = "configuration rejected; keeping the running one"
	bad := []struct{ file, want string }{
		{`{"log_level":"debug"} }}} not json`, "one JSON object and nothing after it"},
		{`{"log_level":"debug"} {"log_level":"error"}`, "one JSON object and nothing after it"},
		{`{"log_level": null}`, "log_level"},
		{`{"remove_created_links": null}`, "remove_created_links"},
		{`{"rxe": [{"Name": "rxe9", "netdev": "eth9"}]}`, "did you mean"},
		{`{"Devices": ["rxe0", "other"]}`, "did you mean"},
		{`{"sysfs_root": "` + filepath.Join(dir, "nope") + `"}`, "sysfs_root"},
	}
	for i, b := range bad {
		write(b.file)
		h.sigs <- syscall.SIGHUP
		deadline := time.Now().Add(5 * time.Second)
		for strings.Count(logs.String(), rejected) < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no rejection logged:\n%s", b.file, logs.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		last := lines[len(lines)-1]
		if !strings.Contains(last, rejected) || !strings.Contains(last, b.want) || !strings.Contains(last, p) {
			t.Fatalf("%s: last log line %q, want %q and the file named", b.file, last, b.want)
		}
		h.b.mu.Lock()
		n := h.b.reloaded
		h.b.mu.Unlock()
		if n != 0 {
			t.Fatalf("%s: a service was reloaded after a rejected file", b.file)
		}
	}

	write(`{"devices": ["rxe0", "other"], "shutdown_timeout": "2s"}`)
	h.sigs <- syscall.SIGHUP
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.b.mu.Lock()
		n, last := h.b.reloaded, h.b.lastCfg
		h.b.mu.Unlock()
		if n == 1 {
			if strings.Join(last.Devices, ",") != "rxe0,other" {
				t.Fatalf("reloaded with %+v", last)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("good file not applied:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.sigs <- syscall.SIGTERM
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
}
