package aametrics

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var files = []string{"hooks_armed", "domains", "mrs", "pages", "entries", "bytes", "data_bytes",
	"writes", "reads", "atomics", "hidden_writes", "zeroed_reads", "refused_writes", "refused_atomics",
	"lost_reads", "missed"}

// fixture writes the module's counter files under a fake sysfs root, file
// i holding i+1.
func fixture(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, Dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, n := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func collectErr(c *Collector) error {
	ch := make(chan prometheus.Metric, 100)
	defer close(ch)
	return c.CollectErr(ch)
}

func TestLoaded(t *testing.T) {
	c := New(fixture(t))
	want := `
# HELP rdmaplus_aa_module_loaded 1 when the rdmaplus module's Active Access counters can be read (/sys/kernel/rdmaplus/aa), 0 when the module is not loaded.
# TYPE rdmaplus_aa_module_loaded gauge
rdmaplus_aa_module_loaded 1
# HELP rdmaplus_aa_domains Active Access domains (access logs) alive, all processes (kernel: domains).
# TYPE rdmaplus_aa_domains gauge
rdmaplus_aa_domains 2
# HELP rdmaplus_aa_log_entries_total Access log entries written (kernel: entries).
# TYPE rdmaplus_aa_log_entries_total counter
rdmaplus_aa_log_entries_total 5
# HELP rdmaplus_aa_missed_probes_total Probe hits the kernel skipped, each an access the module did not see; must stay 0 (kernel: missed).
# TYPE rdmaplus_aa_missed_probes_total counter
rdmaplus_aa_missed_probes_total 16
# HELP rdmaplus_aa_hooks_armed 1 while the module's data-path probes on rdma_rxe are registered (some page is active), else 0 (kernel: hooks_armed).
# TYPE rdmaplus_aa_hooks_armed gauge
rdmaplus_aa_hooks_armed 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "rdmaplus_aa_module_loaded", "rdmaplus_aa_domains",
		"rdmaplus_aa_log_entries_total", "rdmaplus_aa_missed_probes_total", "rdmaplus_aa_hooks_armed"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c); n != 1+len(files) {
		t.Fatalf("%d metrics, want %d", n, 1+len(files))
	}
	if err := collectErr(c); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// Every kernel file names its metric in the HELP text.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var helps []string
	for _, mf := range mfs {
		helps = append(helps, mf.GetHelp())
	}
	for _, f := range files {
		if !strings.Contains(strings.Join(helps, "\n"), "(kernel: "+f+").") {
			t.Errorf("no metric for the kernel's %s", f)
		}
	}
}

func TestNotLoaded(t *testing.T) {
	c := New(t.TempDir())
	want := `
# HELP rdmaplus_aa_module_loaded 1 when the rdmaplus module's Active Access counters can be read (/sys/kernel/rdmaplus/aa), 0 when the module is not loaded.
# TYPE rdmaplus_aa_module_loaded gauge
rdmaplus_aa_module_loaded 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if err := collectErr(c); err != nil {
		t.Fatalf("a missing module is an error: %v", err)
	}
}

func TestUnreadable(t *testing.T) {
	for name, damage := range map[string]func(dir string){
		"missing file": func(dir string) { os.Remove(filepath.Join(dir, "entries")) },
		"not a number": func(dir string) { os.WriteFile(filepath.Join(dir, "pages"), []byte("lots\n"), 0o644) },
	} {
		t.Run(name, func(t *testing.T) {
			root := fixture(t)
			damage(filepath.Join(root, Dir))
			c := New(root)
			if err := collectErr(c); err == nil {
				t.Fatal("no error")
			}
			if n := testutil.CollectAndCount(c); n != 1 {
				t.Fatalf("%d metrics, want only rdmaplus_aa_module_loaded", n)
			}
			if v := testutil.ToFloat64(prometheus.CollectorFunc(c.Collect)); v != 1 {
				t.Fatalf("rdmaplus_aa_module_loaded %v", v)
			}
		})
	}
}
