package sockets_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// freePort returns a TCP port free on 127.0.0.1 a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// metrics scrapes url and returns the value of each series.
func metrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

type listed struct {
	PID    int    `json:"pid"`
	Comm   string `json:"comm"`
	Local  string `json:"local"`
	Remote string `json:"remote"`
	State  string `json:"state"`
	Path   string `json:"path"`
	TCPOut uint64 `json:"tcp_out"`
}

// The shim's statistics segment, end to end on the host: a real rvmad
// with its sockets broker, bulk's server and client under the shim over
// loopback (no RDMA device: the attachments fail, no_device). rvmad
// must list the client's connection, and its aggregates must hold the
// bytes by TCP after the client exited.
func TestStatisticsSegment(t *testing.T) {
	so, _ := build(t)
	bulk := filepath.Join(filepath.Dir(so), "bulk")
	dir := t.TempDir()
	rvmad := filepath.Join(dir, "rvmad")
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build rvmad: %v", err)
	}
	if b, err := exec.Command(gobin, "build", "-o", rvmad, "../../cmd/rvmad").CombinedOutput(); err != nil {
		t.Fatalf("go build rvmad: %v\n%s", err, b)
	}
	sock := filepath.Join(dir, "sockets.sock")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg := filepath.Join(dir, "rvmad.json")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`{"listen": %q, "sockets": {"enabled": true, "socket": %q, "pairing_port": %d}}`,
		listen, sock, freePort(t))), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var log strings.Builder
	d := exec.CommandContext(ctx, rvmad, "serve", "-config", cfg)
	d.Stdout, d.Stderr = &log, &log
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() { d.Process.Kill(); d.Wait() } // then log is whole and still
	defer stop()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := http.Get("http://" + listen + "/readyz"); err == nil {
			if _, err := os.Stat(sock); err == nil {
				break
			}
		}
		if time.Now().After(end) {
			stop()
			t.Skipf("rvmad did not start on this host:\n%s", log.String())
		}
	}
	url := "http://" + listen + "/metrics"
	before := metrics(t, url)

	port := strconv.Itoa(freePort(t))
	env := append(os.Environ(), "LD_PRELOAD="+so, "RDMAPLUS_SOCKETS_BROKER="+sock, "RDMAPLUS_SOCKETS_ATTACH_MS=0")
	srv := exec.CommandContext(ctx, bulk, "server", "-p", port)
	srv.Env = env
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	const n = 1 << 20
	cli := exec.CommandContext(ctx, bulk, "client", "-p", port, "-n", strconv.Itoa(n), "-r", "10", "-w", "1500", "127.0.0.1")
	cli.Env = env
	var cliOut strings.Builder
	cli.Stdout, cli.Stderr = &cliOut, &cliOut
	// (bulk's server serves one connection and dies at a short one: no probe)
	want := fmt.Sprintf(":%04X 00000000:0000 0A", mustAtoi(port))
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if b, err := os.ReadFile("/proc/net/tcp"); err == nil && strings.Contains(string(b), want) {
			break
		}
		if time.Now().After(end) {
			t.Fatal("bulk server not listening")
		}
	}
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}

	// While the client waits before its transfer, its connection is
	// registered (it wrote its header) and listed; the listing may come
	// between the registration and the header's count.
	var found *listed
	for end := time.Now().Add(1200 * time.Millisecond); (found == nil || found.TCPOut < 24) && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		out, err := exec.Command(rvmad, "sockets", "--json", "--socket", sock).Output()
		if err != nil {
			t.Fatalf("rvmad sockets: %v", err)
		}
		var conns []listed
		if err := json.Unmarshal(out, &conns); err != nil {
			t.Fatalf("rvmad sockets: %v\n%s", err, out)
		}
		for i, c := range conns {
			if c.PID == cli.Process.Pid && c.Remote == "127.0.0.1:"+port {
				found = &conns[i]
			}
		}
	}
	if found == nil || found.Comm != "bulk" || found.Path != "tcp" || found.TCPOut < 24 {
		t.Errorf("rvmad sockets did not list the client's connection on TCP: %+v", found)
	}
	if err := cli.Wait(); err != nil {
		t.Fatalf("bulk client: %v\n%s", err, cliOut.String())
	}

	// The client is gone, the server lives: both processes' bytes count.
	var after map[string]float64
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		after = metrics(t, url)
		if after["rdmaplus_sockets_shim_processes"] == before["rdmaplus_sockets_shim_processes"]+1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("processes %v, want the server's alone", after["rdmaplus_sockets_shim_processes"])
		}
	}
	delta := func(s string) float64 { return after[s] - before[s] }
	for _, dir := range []string{"in", "out"} {
		if d := delta(`rdmaplus_sockets_shim_bytes_total{direction="` + dir + `",path="tcp"}`); d < 2*n {
			t.Errorf("%s by TCP: %v bytes, want at least %d (client and server)", dir, d, 2*n)
		}
		if d := delta(`rdmaplus_sockets_shim_bytes_total{direction="` + dir + `",path="rdma"}`); d != 0 {
			t.Errorf("%s by RDMA: %v bytes without an RDMA device", dir, d)
		}
	}
	if d := delta("rdmaplus_sockets_shim_connections_total"); d < 2 {
		t.Errorf("connections_total +%v", d)
	}
	if d := delta("rdmaplus_sockets_shim_attachable_total"); d < 2 {
		t.Errorf("attachable_total +%v", d)
	}
	if t.Failed() {
		stop()
		t.Logf("rvmad:\n%s", log.String())
	}
}
