package main

// The operators' files under deploy/ (the Prometheus alerting rules, their
// promtool tests, the Grafana dashboard) must use only metrics rvmad
// exports, with labels those metrics have. The exported set comes from the
// code: the descriptors of the collectors rvmad registers, plus the named
// metrics of the unchecked port collector (portmetrics.Descs).

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/daemon"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/portmetrics"
)

const (
	deployDir     = "../../deploy"
	rulesFile     = deployDir + "/prometheus/rvmad-alerts.yml"
	rulesTestFile = deployDir + "/prometheus/rvmad-alerts_test.yml"
	dashboardFile = deployDir + "/grafana/rvmad-dashboard.json"
)

// prometheusMade are metrics Prometheus itself makes for every target, with
// their labels.
var prometheusMade = map[string][]string{"up": nil}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job"}

// exportedMetrics returns every metric rvmad can export under a name of its
// own, with its label names (target labels included).
func exportedMetrics(t *testing.T) map[string]map[string]bool {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("testdata", "sysfs-rxe"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.SysfsRoot = root
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ch := make(chan *prometheus.Desc, 10000)
	for _, c := range daemon.Collectors(log, buildServices(cfg, log), true) {
		c.Describe(ch)
	}
	for _, d := range portmetrics.Descs() {
		ch <- d
	}
	close(ch)
	out := map[string]map[string]bool{}
	add := func(name string, labels []string) {
		if out[name] != nil {
			t.Fatalf("metric %s described twice", name)
		}
		out[name] = map[string]bool{}
		for _, l := range append(labels, targetLabels...) {
			out[name][l] = true
		}
	}
	for d := range ch {
		name, labels, err := parseDesc(d)
		if err != nil {
			t.Fatal(err)
		}
		add(name, labels)
	}
	for name, labels := range prometheusMade {
		add(name, labels)
	}
	return out
}

var (
	descName   = regexp.MustCompile(`^Desc\{fqName: "([^"]*)"`)
	descConst  = regexp.MustCompile(`constLabels: \{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\}`)
	constLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)
)

// parseDesc reads the name and the label names (constant and variable) of
// d from its String form, the only way client_golang shows them.
func parseDesc(d *prometheus.Desc) (string, []string, error) {
	s := d.String()
	m := descName.FindStringSubmatch(s)
	const vl = "variableLabels: {"
	i := strings.LastIndex(s, vl)
	if m == nil || i < 0 || !strings.HasSuffix(s, "}}") {
		return "", nil, fmt.Errorf("unexpected descriptor form %s", s)
	}
	var labels []string
	if c := descConst.FindStringSubmatch(s); c != nil {
		for _, l := range constLabel.FindAllStringSubmatch(c[1], -1) {
			labels = append(labels, l[1])
		}
	}
	for _, l := range strings.Split(s[i+len(vl):len(s)-2], ",") {
		l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")") // constrained labels print as c(name)
		if l != "" {
			labels = append(labels, l)
		}
	}
	return m[1], labels, nil
}

// lookup finds a referenced metric; the series of a histogram or summary
// (_bucket, _sum, _count) map to its base name.
func lookup(metrics map[string]map[string]bool, name string) (map[string]bool, bool) {
	if l, ok := metrics[name]; ok {
		return l, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if l, ok := metrics[base]; ok {
				l = copyWith(l, "le", "quantile")
				return l, true
			}
		}
	}
	return nil, false
}

func copyWith(m map[string]bool, extra ...string) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	for _, k := range extra {
		out[k] = true
	}
	return out
}

// selector is one vector selector of a PromQL expression: a metric name and
// the label names it matches on.
type selector struct {
	name   string
	labels []string
}

// promqlKeywords are the words of PromQL that are neither functions nor
// metric names.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
}

// promqlAggregations are PromQL's aggregation operators, which may stand
// before "by (...)" or "without (...)" rather than their '('.
var promqlAggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// promqlLists are the keywords followed by a parenthesised list of labels.
var promqlLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// selectors lexes a PromQL expression far enough to find its vector
// selectors: it skips strings, comments, numbers and durations, range and
// subquery brackets, Grafana variables ($x, ${x}), keywords and their label
// lists, and function names (an identifier followed by '('). Anything else
// that looks like an identifier is a metric name.
func selectors(expr string) ([]selector, error) {
	var out []selector
	i, n := 0, len(expr)
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	skipSpace := func() {
		for i < n && strings.IndexByte(" \t\r\n", expr[i]) >= 0 {
			i++
		}
	}
	skipString := func() error {
		q := expr[i]
		for i++; i < n; i++ {
			if expr[i] == '\\' && q != '`' {
				i++
				continue
			}
			if expr[i] == q {
				i++
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	skipTo := func(open, close byte) error {
		depth := 0
		for ; i < n; i++ {
			switch expr[i] {
			case open:
				depth++
			case close:
				depth--
				if depth == 0 {
					i++
					return nil
				}
			}
		}
		return fmt.Errorf("unbalanced %c in %q", open, expr)
	}
	matchers := func() ([]string, error) { // at '{'
		var labels []string
		i++
		for {
			skipSpace()
			if i < n && expr[i] == '}' {
				i++
				return labels, nil
			}
			start := i
			for i < n && isIdent(expr[i]) {
				i++
			}
			if start == i {
				return nil, fmt.Errorf("bad label matcher at %d in %q", start, expr)
			}
			labels = append(labels, expr[start:i])
			skipSpace()
			for i < n && strings.IndexByte("=!~", expr[i]) >= 0 {
				i++
			}
			skipSpace()
			if i >= n || (expr[i] != '"' && expr[i] != '\'' && expr[i] != '`') {
				return nil, fmt.Errorf("label %s: want a quoted value in %q", labels[len(labels)-1], expr)
			}
			if err := skipString(); err != nil {
				return nil, err
			}
			skipSpace()
			if i < n && expr[i] == ',' {
				i++
			}
		}
	}
	for i < n {
		c := expr[i]
		switch {
		case strings.IndexByte(" \t\r\n", c) >= 0:
			i++
		case c == '"' || c == '\'' || c == '`':
			if err := skipString(); err != nil {
				return nil, err
			}
		case c == '#':
			for i < n && expr[i] != '\n' {
				i++
			}
		case c == '[':
			if err := skipTo('[', ']'); err != nil {
				return nil, err
			}
		case c == '$': // a Grafana variable
			i++
			if i < n && expr[i] == '{' {
				if err := skipTo('{', '}'); err != nil {
					return nil, err
				}
			}
			for i < n && isIdent(expr[i]) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.' && i+1 < n && expr[i+1] >= '0' && expr[i+1] <= '9':
			for i < n && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case c == '{':
			return nil, fmt.Errorf("selector without a metric name in %q", expr)
		case isIdentStart(c):
			start := i
			for i < n && isIdent(expr[i]) {
				i++
			}
			word := expr[start:i]
			skipSpace()
			next := byte(0)
			if i < n {
				next = expr[i]
			}
			switch {
			case promqlKeywords[word]:
				if promqlLists[word] && next == '(' {
					if err := skipTo('(', ')'); err != nil {
						return nil, err
					}
				}
			case next == '(' || promqlAggregations[word]:
				// a function or aggregation; its arguments are lexed on
			default:
				s := selector{name: word}
				if next == '{' {
					labels, err := matchers()
					if err != nil {
						return nil, err
					}
					s.labels = labels
				}
				out = append(out, s)
			}
		default:
			i++
		}
	}
	return out, nil
}

// ruleExprs returns the expr of every rule in a rules file. The file keeps
// each expr a plain one-line scalar or a block scalar (| or >-), which is
// all this reads of YAML; promtool reads the file properly.
func ruleExprs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out []string
	key := regexp.MustCompile(`^(\s*)(?:- )?expr:\s*(.*?)\s*$`)
	for i := 0; i < len(lines); i++ {
		m := key.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent, val := len(m[1]), m[2]
		switch {
		case val == "|" || val == "|-" || val == ">" || val == ">-":
			var b []string
			for i+1 < len(lines) {
				l := lines[i+1]
				if strings.TrimSpace(l) != "" && len(l)-len(strings.TrimLeft(l, " ")) <= indent {
					break
				}
				b = append(b, strings.TrimSpace(l))
				i++
			}
			out = append(out, strings.TrimSpace(strings.Join(b, "\n")))
		case strings.HasPrefix(val, "'"):
			out = append(out, strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(val, "'"), "'"), "''", "'"))
		case strings.HasPrefix(val, `"`):
			u, err := strconv.Unquote(val)
			if err != nil {
				t.Fatalf("%s:%d: %v", path, i+1, err)
			}
			out = append(out, u)
		default:
			out = append(out, val)
		}
	}
	return out
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// templateQuery returns the PromQL selector inside a Grafana variable query
// (label_values(SELECTOR, LABEL) or a plain expression) and the label it
// lists ("" if none).
func templateQuery(raw json.RawMessage) (string, string, error) {
	var q string
	if err := json.Unmarshal(raw, &q); err != nil {
		var obj struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return "", "", fmt.Errorf("query %s: %w", raw, err)
		}
		q = obj.Query
	}
	q = strings.TrimSpace(q)
	if inner, ok := strings.CutPrefix(q, "label_values("); ok {
		inner = strings.TrimSuffix(inner, ")")
		i := strings.LastIndex(inner, ",")
		if i < 0 {
			return "", strings.TrimSpace(inner), nil
		}
		return strings.TrimSpace(inner[:i]), strings.TrimSpace(inner[i+1:]), nil
	}
	return q, "", nil
}

// checkExpr checks every selector of expr names an exported metric and
// matches only labels it has; with need set, also that each selector
// matches on the labels of need that its metric has.
func checkExpr(metrics map[string]map[string]bool, where, expr string, need ...string) []error {
	sels, err := selectors(expr)
	if err != nil {
		return []error{fmt.Errorf("%s: %w", where, err)}
	}
	if len(sels) == 0 {
		return []error{fmt.Errorf("%s: no metric in %q", where, expr)}
	}
	var errs []error
	for _, s := range sels {
		labels, ok := lookup(metrics, s.name)
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s is not a metric rvmad exports (in %q)", where, s.name, expr))
			continue
		}
		for _, l := range s.labels {
			if !labels[l] {
				errs = append(errs, fmt.Errorf("%s: %s has no label %s (in %q)", where, s.name, l, expr))
			}
		}
		for _, l := range need {
			if labels[l] && !contains(s.labels, l) {
				errs = append(errs, fmt.Errorf("%s: %s is not filtered by %s (in %q)", where, s.name, l, expr))
			}
		}
	}
	return errs
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestSelectors(t *testing.T) {
	got, err := selectors(`sum by (instance, device) (rate(rvmad_hw_sent_packets_total{instance=~"$instance",device=~"a|b"}[$__rate_interval]))
		/ on(instance) group_left(x) foo:bar offset 5m > bool 0.5 and count_values("le", up{job='x'}) # up2
		or vector(1e3) unless label_replace(baz, "a", "$1", "b", "(.*)") or inf`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range got {
		names = append(names, s.name+"{"+strings.Join(s.labels, ",")+"}")
	}
	if want := "rvmad_hw_sent_packets_total{instance,device} foo:bar{} up{job} baz{}"; strings.Join(names, " ") != want {
		t.Fatalf("selectors %s, want %s", strings.Join(names, " "), want)
	}
	for _, bad := range []string{`{__name__="x"}`, `x{a="b"`, `x{a=b}`, `"open`} {
		if _, err := selectors(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestDeployReferencesOnlyRvmadMetrics reads the alerting rules, their
// promtool tests and the dashboard: every metric they use is one rvmad
// exports, with labels it has, and the dashboard's panels filter by the
// $instance and (where the metric has the label) $device variables.
func TestDeployReferencesOnlyRvmadMetrics(t *testing.T) {
	metrics := exportedMetrics(t)
	for _, want := range []string{"rvmad_port_state", "rvmad_hw_completer_retries_total", "rvmad_scrape_errors_total",
		"rdmaplus_aa_refused_write_packets_total", "rdmaplus_rvma_refused_packets_total", "rdmaplus_jbmt_nacks_sent_total",
		"rvmad_build_info", "go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := metrics[want]; !ok {
			t.Fatalf("the exported set lacks %s: %d metrics", want, len(metrics))
		}
	}
	var errs []error

	// Alerting rules: one expr per rule, each on rvmad's metrics.
	exprs := ruleExprs(t, rulesFile)
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(regexp.MustCompile(`(?m)^\s*- (alert|record):`).FindAll(data, -1)); n != len(exprs) || n == 0 {
		t.Fatalf("%s: %d rules but %d exprs read", rulesFile, n, len(exprs))
	}
	for i, e := range exprs {
		errs = append(errs, checkExpr(metrics, fmt.Sprintf("%s rule %d", rulesFile, i+1), e)...)
	}

	// promtool tests: their input series are series rvmad exports.
	tdata, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	series := regexp.MustCompile(`(?m)^\s*- series:\s*'([^']*)'\s*$`).FindAllStringSubmatch(string(tdata), -1)
	if len(series) == 0 {
		t.Fatalf("%s: no input series read", rulesTestFile)
	}
	for _, s := range series {
		errs = append(errs, checkExpr(metrics, rulesTestFile+" series", s[1])...)
	}

	// Dashboard: every target and variable query.
	d := readDashboard(t)
	n := 0
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			n++
			where := fmt.Sprintf("%s panel %d %q target %s", dashboardFile, p.ID, p.Title, tg.RefID)
			errs = append(errs, checkExpr(metrics, where, tg.Expr, "instance", "device")...)
		}
	}
	if n == 0 {
		t.Fatalf("%s: no panel targets read", dashboardFile)
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		sel, label, err := templateQuery(v.Query)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s variable %s: %w", dashboardFile, v.Name, err))
			continue
		}
		where := fmt.Sprintf("%s variable %s", dashboardFile, v.Name)
		errs = append(errs, checkExpr(metrics, where, sel)...)
		if sels, err := selectors(sel); err == nil && label != "" {
			for _, s := range sels {
				if l, ok := lookup(metrics, s.name); ok && !l[label] {
					errs = append(errs, fmt.Errorf("%s: %s has no label %s to list", where, s.name, label))
				}
			}
		}
	}
	for _, e := range errs {
		t.Error(e)
	}
}

// TestDeployDashboardShape checks what Grafana needs to import the
// dashboard on any Prometheus data source: a recent schema, the datasource,
// instance and device variables, every panel and target on the datasource
// variable, unique panel ids, and a layout within 24 columns.
func TestDeployDashboardShape(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 39 {
		t.Errorf("uid %q, title %q, schemaVersion %d (want 39 or later)", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s does not query the datasource variable", v.Name)
		}
	}
	for name, typ := range map[string]string{"datasource": "datasource", "instance": "query", "device": "query"} {
		if vars[name] != typ {
			t.Errorf("variable %s: type %q, want %q", name, vars[name], typ)
		}
	}
	ids := map[int]bool{}
	for _, p := range allPanels(d.Panels) {
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d not unique", p.Title, p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside 24 columns", p.Title, g)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d: title %q, %d targets", p.ID, p.Title, len(p.Targets))
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want the datasource variable", p.Title, p.Datasource)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if refs[tg.RefID] || tg.RefID == "" {
				t.Errorf("panel %q: refId %q not unique", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q target %s: not on the datasource variable", p.Title, tg.RefID)
			}
		}
	}
}

// grafanaVars stands in for Grafana's variables so promtool can parse the
// dashboard's expressions.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"$instance", ".*", "$device", ".*", "$job", "rvmad",
)

// findPromtool returns $PROMTOOL, the promtool on PATH, or the one `make
// deploy-check` unpacks into build/promtool, whichever comes first.
func findPromtool() (string, error) {
	if p := os.Getenv("PROMTOOL"); p != "" {
		return filepath.Abs(p)
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p, nil
	}
	p, err := filepath.Abs(filepath.Join("..", "..", "build", "promtool", "usr", "bin", "promtool"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no promtool on PATH nor at %s: %w", p, err)
	}
	return p, nil
}

// TestDeployPromtool runs promtool over the rules (check rules), their unit
// tests (test rules), and the dashboard's expressions (as recording rules
// of a scratch file, with Grafana's variables filled in, through check
// rules: Prometheus's own parser). Without promtool the test fails in CI
// (CI set) and is skipped elsewhere; `make deploy-check` fetches it, and
// `make test` runs that first.
func TestDeployPromtool(t *testing.T) {
	promtool, err := findPromtool()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%v (make deploy-check fetches it)", err)
		}
		t.Skipf("%v; make deploy-check fetches it", err)
	}
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	promDir := filepath.Dir(rulesFile)
	run(promDir, "check", "rules", filepath.Base(rulesFile))
	run(promDir, "test", "rules", filepath.Base(rulesTestFile))

	d := readDashboard(t)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	var exprs []string
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			sel, _, err := templateQuery(v.Query)
			if err != nil {
				t.Fatal(err)
			}
			exprs = append(exprs, sel)
		}
	}
	sort.Strings(exprs)
	for i, e := range exprs {
		q, err := json.Marshal(grafanaVars.Replace(e)) // a JSON string is a YAML double-quoted scalar
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "      - record: dashboard:expr_%d\n        expr: %s\n", i, q)
	}
	scratch := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(scratch, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "$") {
		t.Errorf("a Grafana variable left unreplaced:\n%s", b.String())
	}
	run(filepath.Dir(scratch), "check", "rules", filepath.Base(scratch))
}

// TestExportedSetCoversScrape gathers /metrics' families from the fixture
// trees: each is in the exported set (so the set the deploy files are
// checked against is what rvmad serves), except counters rvmad exports
// under their kernel names, which no dashboard may rely on.
func TestExportedSetCoversScrape(t *testing.T) {
	metrics := exportedMetrics(t)
	for _, fx := range []string{"sysfs-rxe", "sysfs-hca"} {
		root, _ := filepath.Abs(filepath.Join("testdata", fx))
		cfg := config.Default()
		cfg.SysfsRoot = root
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		reg, err := daemon.NewRegistry(log, buildServices(cfg, log), true)
		if err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("%s: %v", fx, err)
		}
		for _, mf := range mfs {
			if strings.Contains(mf.GetHelp(), "without an rvmad name") {
				continue
			}
			labels, ok := metrics[mf.GetName()]
			if !ok {
				t.Errorf("%s: %s served but not in the exported set", fx, mf.GetName())
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if !labels[lp.GetName()] {
						t.Errorf("%s: %s served with label %s not in the exported set", fx, mf.GetName(), lp.GetName())
					}
				}
			}
		}
	}
}
