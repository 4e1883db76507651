package kmodmetrics

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// collector is what the tests need of a Service, whatever its counters.
type collector interface {
	prometheus.Collector
	CollectErr(chan<- prometheus.Metric) error
}

// A family: its service made on a sysfs root, its directory there, its
// counter files, and some of what a fixture (file i holding i+1) scrapes.
type family struct {
	name   string
	make   func(root string) collector
	dir    string
	files  []string
	loaded string // the module_loaded metric
	want   string // exposition of the metrics in names, from the fixture
	names  []string
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var families = []family{{
	name: "activeaccess",
	make: func(root string) collector { return NewActiveAccess(root, quiet) },
	dir:  "kernel/rdmaplus/aa",
	files: []string{"hooks_armed", "domains", "mrs", "pages", "entries", "bytes", "data_bytes",
		"writes", "reads", "atomics", "hidden_writes", "zeroed_reads", "refused_writes", "refused_atomics",
		"lost_reads", "missed"},
	loaded: "rdmaplus_aa_module_loaded",
	want: `
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
`,
	names: []string{"rdmaplus_aa_module_loaded", "rdmaplus_aa_domains", "rdmaplus_aa_log_entries_total",
		"rdmaplus_aa_missed_probes_total", "rdmaplus_aa_hooks_armed"},
}, {
	name:   "mailboxes",
	make:   func(root string) collector { return NewMailboxes(root, quiet) },
	dir:    "kernel/rdmaplus/rvma",
	files:  []string{"packets", "bytes", "published", "refused", "unparsed", "nomem", "windows", "ranges", "mrs", "translated", "untranslated"},
	loaded: "rdmaplus_rvma_module_loaded",
	want: `
# HELP rdmaplus_rvma_module_loaded 1 when the rdmaplus module's counted mailbox (RVMA) counters can be read (/sys/kernel/rdmaplus/rvma), 0 when the module is not loaded.
# TYPE rdmaplus_rvma_module_loaded gauge
rdmaplus_rvma_module_loaded 1
# HELP rdmaplus_rvma_placed_bytes_total Bytes the module placed into open buffers (kernel: bytes).
# TYPE rdmaplus_rvma_placed_bytes_total counter
rdmaplus_rvma_placed_bytes_total 2
# HELP rdmaplus_rvma_key_nomem_packets_total First packets refused because their message's key could not be kept for want of memory, on a queue pair not named to the module; also in refused_packets (kernel: nomem).
# TYPE rdmaplus_rvma_key_nomem_packets_total counter
rdmaplus_rvma_key_nomem_packets_total 6
# HELP rdmaplus_rvma_memory_regions Memory regions with a gated range (kernel: mrs).
# TYPE rdmaplus_rvma_memory_regions gauge
rdmaplus_rvma_memory_regions 9
`,
	names: []string{"rdmaplus_rvma_module_loaded", "rdmaplus_rvma_placed_bytes_total",
		"rdmaplus_rvma_key_nomem_packets_total", "rdmaplus_rvma_memory_regions"},
}, {
	name: "jbmt",
	make: func(root string) collector { return NewJBMT(root, quiet) },
	dir:  "kernel/rdmaplus/jbmt",
	files: []string{"regions", "registered_bytes", "registrations", "deregistrations", "revoked",
		"peers", "connects", "accepts", "connect_errors", "disconnects", "gets", "puts", "get_bytes",
		"put_bytes", "op_errors", "sections", "sections_served", "sections_refused",
		"refused_noent", "refused_stale", "refused_perm", "refused_range", "refused_fault", "refused_nomem", "refused_inval", "leases_expired", "pinned_pages",
		"nacks_sent", "nacks_received", "budget_waits", "pin_budget_pages", "op_pinned_pages", "served_pinned_pages",
		"op_pinned_hwm", "served_pinned_hwm", "sections_inline", "sections_deferred", "async_submitted", "async_completed",
		"pin_cache_hits", "pin_cache_misses", "pin_cache_stale", "pin_cache_evicted", "pin_cache_pages", "pin_cache_idle_pages"},
	loaded: "rdmaplus_jbmt_module_loaded",
	want: `
# HELP rdmaplus_jbmt_module_loaded 1 when the rdmaplus module's JBMT counters can be read (/sys/kernel/rdmaplus/jbmt), 0 when the module is not loaded.
# TYPE rdmaplus_jbmt_module_loaded gauge
rdmaplus_jbmt_module_loaded 1
# HELP rdmaplus_jbmt_registered_bytes Bytes of those regions (kernel: registered_bytes).
# TYPE rdmaplus_jbmt_registered_bytes gauge
rdmaplus_jbmt_registered_bytes 2
# HELP rdmaplus_jbmt_peers Connections to and from peer hosts up now (kernel: peers).
# TYPE rdmaplus_jbmt_peers gauge
rdmaplus_jbmt_peers 6
# HELP rdmaplus_jbmt_disconnects_total Connections that went down: the peer left, died or lost its device (kernel: disconnects).
# TYPE rdmaplus_jbmt_disconnects_total counter
rdmaplus_jbmt_disconnects_total 10
`,
	names: []string{"rdmaplus_jbmt_module_loaded", "rdmaplus_jbmt_registered_bytes",
		"rdmaplus_jbmt_peers", "rdmaplus_jbmt_disconnects_total"},
}}

// fixture writes f's counter files under a fake sysfs root, file i holding
// i+1.
func (f family) fixture(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, f.dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, n := range f.files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func collectErr(c collector) error {
	ch := make(chan prometheus.Metric, 100)
	defer close(ch)
	return c.CollectErr(ch)
}

func TestLoaded(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			c := f.make(f.fixture(t))
			if err := testutil.CollectAndCompare(c, strings.NewReader(f.want), f.names...); err != nil {
				t.Fatal(err)
			}
			if n := testutil.CollectAndCount(c); n != 1+len(f.files) {
				t.Fatalf("%d metrics, want %d", n, 1+len(f.files))
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
			for _, file := range f.files {
				if !strings.Contains(strings.Join(helps, "\n"), "(kernel: "+file+").") {
					t.Errorf("no metric for the kernel's %s", file)
				}
			}
		})
	}
}

// Both services register together, as rvmad registers them.
func TestTogether(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for _, f := range families {
		reg.MustRegister(f.make(t.TempDir()))
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

func TestNotLoaded(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			c := f.make(t.TempDir())
			if n := testutil.CollectAndCount(c); n != 1 {
				t.Fatalf("%d metrics, want only %s", n, f.loaded)
			}
			if v := testutil.ToFloat64(prometheus.CollectorFunc(c.Collect)); v != 0 {
				t.Fatalf("%s %v, want 0", f.loaded, v)
			}
			if err := collectErr(c); err != nil {
				t.Fatalf("a missing module is an error: %v", err)
			}
		})
	}
}

func TestUnreadable(t *testing.T) {
	for _, f := range families {
		for name, damage := range map[string]func(dir string){
			"missing file": func(dir string) { os.Remove(filepath.Join(dir, f.files[4])) },
			"not a number": func(dir string) { os.WriteFile(filepath.Join(dir, f.files[3]), []byte("lots\n"), 0o644) },
		} {
			t.Run(f.name+"/"+name, func(t *testing.T) {
				root := f.fixture(t)
				damage(filepath.Join(root, f.dir))
				c := f.make(root)
				if err := collectErr(c); err == nil {
					t.Fatal("no error")
				}
				if n := testutil.CollectAndCount(c); n != 1 {
					t.Fatalf("%d metrics, want only %s", n, f.loaded)
				}
				if v := testutil.ToFloat64(prometheus.CollectorFunc(c.Collect)); v != 1 {
					t.Fatalf("%s %v", f.loaded, v)
				}
			})
		}
	}
}
