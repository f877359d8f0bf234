package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The monitoring component's files.
const (
	monitoringComponent = "components/monitoring"
	ruleFile            = monitoringComponent + "/prometheusrule.yaml"
	dashboardFile       = monitoringComponent + "/fenced-dashboard.json"
	dashboardConfigMap  = "fenced-dashboard"
	observabilityDoc    = "../docs/observability.md"
	metricsPath         = "/metrics"
	// runbookURL is where every alert's runbook_url points, followed by
	// the anchor of the alert's section in observabilityDoc.
	runbookURL = "https://github.com/agentihooks/fenced/blob/main/docs/observability.md#"
)

// pendingMetrics may be absent from the scrape (a metric a query names
// before fenced exports it); empty: every metric a query names must be in a
// live scrape.
var pendingMetrics = []string{}

// targetLabels are the labels Prometheus attaches to every series it
// scrapes (Kubernetes service discovery, the ServiceMonitor's and the usual
// kubernetes-pods job's relabelling), not fenced's.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "endpoint", "container"}

// severities are the values of an alert's severity label.
var severities = []string{"critical", "warning"}

// dashboardRows are the rows the dashboard must have, in order.
var dashboardRows = []string{"Traffic and latency per RPC", "Outcomes", "Leases", "Redis", "Process"}

// promQL is one PromQL expression and where it was found.
type promQL struct {
	source string // file and place, for messages
	expr   string // as written (Grafana variables included)
	// label is a label the expression's metric must have: the second
	// argument of a Grafana label_values() query.
	label string
}

// grafanaDashboard is the part of Grafana's dashboard JSON model the tests
// read.
type grafanaDashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []grafanaVariable `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaVariable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": ...} for a query variable
	Datasource *grafanaSource  `json:"datasource"`
}

type grafanaPanel struct {
	ID          int             `json:"id"`
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	Datasource  *grafanaSource  `json:"datasource"`
	GridPos     *grafanaGridPos `json:"gridPos"`
	Targets     []grafanaTarget `json:"targets"`
	Panels      []grafanaPanel  `json:"panels"` // a collapsed row's
}

type grafanaSource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaGridPos struct {
	H, W, X, Y int
}

type grafanaTarget struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *grafanaSource `json:"datasource"`
}

// readDashboard decodes the dashboard JSON, refusing unknown top-level
// shapes (a panel list that is not a list fails).
func readDashboard(t *testing.T) (*grafanaDashboard, []byte) {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d, data
}

// flatPanels returns every panel, rows' collapsed panels included, with
// the row each one sits under ("" before the first row).
func flatPanels(d *grafanaDashboard) (panels []grafanaPanel, rowOf map[int]string) {
	rowOf = map[int]string{}
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			for _, c := range p.Panels {
				panels = append(panels, c)
				rowOf[c.ID] = row
			}
		}
		panels = append(panels, p)
		rowOf[p.ID] = row
	}
	return panels, rowOf
}

// readRule decodes the PrometheusRule strictly, as TestManifests decodes
// every object.
func readRule(t *testing.T) *monitoringv1.PrometheusRule {
	t.Helper()
	data, err := os.ReadFile(ruleFile)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := decodeStrict(data)
	if err != nil {
		t.Fatalf("%s: %v", ruleFile, err)
	}
	pr, ok := obj.(*monitoringv1.PrometheusRule)
	if !ok {
		t.Fatalf("%s holds a %T, want a PrometheusRule", ruleFile, obj)
	}
	return pr
}

var (
	labelValuesQuery = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	promqlBlock      = regexp.MustCompile("(?s)```promql\n(.*?)```")
)

// monitoringQueries collects every PromQL expression the component and the
// docs hold: the alerts' and recording rules' expressions, the dashboard's
// panel targets and query variables, and each line of the ```promql blocks
// of docs/observability.md (one query a line, # comments allowed).
func monitoringQueries(t *testing.T) []promQL {
	t.Helper()
	var qs []promQL
	for _, g := range readRule(t).Spec.Groups {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			qs = append(qs, promQL{source: fmt.Sprintf("%s: group %s rule %s", ruleFile, g.Name, name), expr: r.Expr.String()})
		}
	}
	d, _ := readDashboard(t)
	panels, _ := flatPanels(d)
	for _, p := range panels {
		for _, tg := range p.Targets {
			qs = append(qs, promQL{source: fmt.Sprintf("%s: panel %q target %s", dashboardFile, p.Title, tg.RefID), expr: tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := variableQuery(v)
		m := labelValuesQuery.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("%s: variable %s query %q: want label_values(<selector>, <label>)", dashboardFile, v.Name, q)
			continue
		}
		qs = append(qs, promQL{source: fmt.Sprintf("%s: variable %s", dashboardFile, v.Name), expr: m[1], label: m[2]})
	}
	doc, err := os.ReadFile(observabilityDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks := promqlBlock.FindAllStringSubmatch(string(doc), -1)
	if len(blocks) == 0 {
		t.Errorf("%s has no ```promql block", observabilityDoc)
	}
	for _, b := range blocks {
		for line := range strings.Lines(b[1]) {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				qs = append(qs, promQL{source: observabilityDoc + ": " + l, expr: l})
			}
		}
	}
	return qs
}

// variableQuery returns a Grafana variable's query text.
func variableQuery(v grafanaVariable) string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var q struct {
		Query string `json:"query"`
	}
	json.Unmarshal(v.Query, &q)
	return q.Query
}

// grafanaVar matches $name, ${name} and ${name:format}.
var grafanaVar = regexp.MustCompile(`\$(?:\{([a-zA-Z_][a-zA-Z0-9_]*)(?::[a-z]+)?\}|([a-zA-Z_][a-zA-Z0-9_]*))`)

// expandGrafana replaces the dashboard's variables and Grafana's interval
// variables by values PromQL takes: an interval by 5m, a template variable
// by a plain value (they stand in label values and regular expressions).
// Any other $variable is an error.
func expandGrafana(expr string, vars []string) (string, error) {
	var bad []string
	out := grafanaVar.ReplaceAllStringFunc(expr, func(m string) string {
		sm := grafanaVar.FindStringSubmatch(m)
		name := sm[1] + sm[2]
		switch {
		case name == "__rate_interval" || name == "__interval" || name == "__range":
			return "5m"
		case slices.Contains(vars, name):
			return "x"
		}
		bad = append(bad, m)
		return m
	})
	if len(bad) > 0 {
		return "", fmt.Errorf("unknown Grafana variable(s) %q (the dashboard defines %q)", bad, vars)
	}
	return out, nil
}

// parseQueries parses every query with Prometheus's own parser, failing the
// test for each that does not parse, and returns the parsed ones.
func parseQueries(t *testing.T) map[*promQL]parser.Expr {
	t.Helper()
	d, _ := readDashboard(t)
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	p := parser.NewParser(parser.Options{})
	out := map[*promQL]parser.Expr{}
	qs := monitoringQueries(t)
	for i := range qs {
		q := &qs[i]
		expr, err := expandGrafana(q.expr, vars)
		if err != nil {
			t.Errorf("%s: %v", q.source, err)
			continue
		}
		e, err := p.ParseExpr(expr)
		if err != nil {
			t.Errorf("%s: PromQL %q does not parse: %v", q.source, expr, err)
			continue
		}
		out[q] = e
	}
	return out
}

// TestMonitoringQueriesParse: every PromQL expression of the rules, the
// dashboard and docs/observability.md parses with Prometheus's parser, and
// there are as many as the files hold.
func TestMonitoringQueriesParse(t *testing.T) {
	parsed := parseQueries(t)
	sources := map[string]int{}
	for q := range parsed {
		sources[strings.SplitN(q.source, ":", 2)[0]]++
	}
	for _, f := range []string{ruleFile, dashboardFile, observabilityDoc} {
		if sources[f] == 0 {
			t.Errorf("no PromQL expression parsed from %s", f)
		}
	}
	t.Logf("parsed %v expressions", sources)
}

// TestExpandGrafana pins the substitution the dashboard's queries go
// through before parsing.
func TestExpandGrafana(t *testing.T) {
	vars := []string{"datasource", "namespace", "pod"}
	tests := []struct {
		in, want string
		ok       bool
	}{
		{`rate(a{namespace="$namespace", pod=~"${pod}"}[$__rate_interval])`, `rate(a{namespace="x", pod=~"x"}[5m])`, true},
		{`rate(a{pod=~"${pod:regex}"}[$__interval])`, `rate(a{pod=~"x"}[5m])`, true},
		{`rate(a{job="$job"}[5m])`, "", false},
	}
	for _, tt := range tests {
		got, err := expandGrafana(tt.in, vars)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("expandGrafana(%q) = %q, %v; want %q, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

// selectorMetric returns the metric name a vector selector names, "" when
// it names none by equality.
func selectorMetric(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

// series is a scrape, by series name (histograms as _bucket, _sum and
// _count): each series' labels.
type series map[string][]map[string]string

// scrape fetches url and indexes its series.
func scrape(t *testing.T, url string) (series, map[string]*dto.MetricFamily) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: parse the text format: %v", url, err)
	}
	s := series{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				for _, b := range m.GetHistogram().GetBucket() {
					bl := maps.Clone(l)
					bl["le"] = fmt.Sprint(b.GetUpperBound())
					s[name+"_bucket"] = append(s[name+"_bucket"], bl)
				}
				s[name+"_bucket"] = append(s[name+"_bucket"], merge(l, "le", "+Inf"))
				s[name+"_sum"] = append(s[name+"_sum"], l)
				s[name+"_count"] = append(s[name+"_count"], l)
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					s[name] = append(s[name], merge(l, "quantile", fmt.Sprint(q.GetQuantile())))
				}
				s[name+"_sum"] = append(s[name+"_sum"], l)
				s[name+"_count"] = append(s[name+"_count"], l)
			default:
				s[name] = append(s[name], l)
			}
		}
	}
	return s, fams
}

func merge(l map[string]string, k, v string) map[string]string {
	out := maps.Clone(l)
	out[k] = v
	return out
}

// near returns the scraped series names that share name's first two
// words (fenced_batch_...), to suggest what a misspelt name meant.
func (s series) near(name string) []string {
	words := strings.SplitN(name, "_", 3)
	prefix := strings.Join(words[:min(2, len(words))], "_")
	var out []string
	for n := range s {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// hasLabel reports whether some series of the metric has the label, or the
// label is one Prometheus attaches.
func (s series) hasLabel(metric, label string) bool {
	if slices.Contains(targetLabels, label) {
		return true
	}
	for _, l := range s[metric] {
		if _, ok := l[label]; ok {
			return true
		}
	}
	return false
}

// matches reports whether some series of the metric has a value of the
// label that m matches.
func (s series) matches(metric string, m *labels.Matcher) bool {
	for _, l := range s[metric] {
		if v, ok := l[m.Name]; ok && m.Matches(v) {
			return true
		}
	}
	return false
}

// checkAgainstScrape: every metric the expression names is in the scrape
// (or pending), with every label its matchers and groupings name; a
// matcher that selects by equality or a regular expression must select
// some scraped series, so that a misspelt method or code is caught.
func checkAgainstScrape(t *testing.T, q *promQL, e parser.Expr, s series, used map[string]bool) {
	t.Helper()
	metricsOf := func(n parser.Node) []string {
		var out []string
		parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				out = append(out, selectorMetric(vs))
			}
			return nil
		})
		return out
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			name := selectorMetric(n)
			if name == "" {
				t.Errorf("%s: selector %s names no metric by equality: cannot check it", q.source, n)
				return nil
			}
			used[name] = true
			if _, ok := s[name]; !ok {
				if !slices.Contains(pendingMetrics, name) {
					t.Errorf("%s: metric %s is not exported by fenced (scraped with its prefix: %q)", q.source, name, s.near(name))
				}
				return nil
			}
			for _, m := range n.LabelMatchers {
				switch {
				case m.Name == labels.MetricName || slices.Contains(targetLabels, m.Name):
				case !s.hasLabel(name, m.Name):
					t.Errorf("%s: %s has no label %s", q.source, name, m.Name)
				case (m.Type == labels.MatchEqual || m.Type == labels.MatchRegexp) && !s.matches(name, m):
					t.Errorf("%s: %s{%s} selects no series fenced exports", q.source, name, m)
				}
			}
			if q.label != "" && !s.hasLabel(name, q.label) {
				t.Errorf("%s: %s has no label %s", q.source, name, q.label)
			}
		case *parser.AggregateExpr:
			for _, l := range n.Grouping {
				found := false
				for _, name := range metricsOf(n.Expr) {
					found = found || s.hasLabel(name, l) || slices.Contains(pendingMetrics, name) || (l == "le" && strings.HasSuffix(name, "_bucket"))
				}
				if !found {
					t.Errorf("%s: %s by (%s): no metric under it has the label %s", q.source, n.Op, strings.Join(n.Grouping, ", "), l)
				}
			}
		}
		return nil
	})
}

// TestMonitoringQueriesNameExportedMetrics runs fenced on a real
// redis-server with metrics on loopback, drives a lease grant, a commit, a
// replay, a revision conflict and a stale-lease refusal through gRPC, then
// scrapes /metrics: every metric the rules, the dashboard and the docs name
// is exported (but pendingMetrics), with the labels and label values they
// select by; and the outcome counters moved by one each.
func TestMonitoringQueriesNameExportedMetrics(t *testing.T) {
	parsed := parseQueries(t)
	if t.Failed() {
		t.FailNow()
	}
	f := startFencedOnRedis(t)
	driveOutcomes(t, f.grpcAddr, 1)

	s, fams := scrape(t, f.metricsURL)
	for name, want := range map[string]float64{
		"fenced_lease_grants_total":         1,
		"fenced_batches_committed_total":    1,
		"fenced_batches_replayed_total":     1,
		"fenced_batch_conflicts_total":      1,
		"fenced_lease_stale_refusals_total": 1,
	} {
		if got := counterSum(fams[name]); got != want {
			t.Errorf("after driving each outcome once, %s = %v, want %v", name, got, want)
		}
	}
	used := map[string]bool{}
	for q, e := range parsed {
		checkAgainstScrape(t, q, e, s, used)
	}
	for _, name := range pendingMetrics {
		if !used[name] {
			t.Errorf("pendingMetrics names %s, which no query uses: drop it", name)
		}
		if _, ok := s[name]; ok {
			t.Logf("%s is exported now: drop it from pendingMetrics", name)
		}
	}
}

// liveFenced is a fenced process serving from its own redis-server.
type liveFenced struct {
	grpcAddr   string
	metricsURL string
	stopRedis  func() // kills the redis-server
}

// startFencedOnRedis runs fenced on a fresh redis-server, gRPC and metrics
// on loopback, until the test ends, and returns it once it is SERVING.
func startFencedOnRedis(t *testing.T) liveFenced {
	t.Helper()
	sock, stopRedis := startRedis(t)
	grpcAddr, log := startFenced(t, []string{
		"FENCED_REDIS_URL=unix://" + sock,
		"FENCED_LISTEN=127.0.0.1:0",
		"FENCED_METRICS_LISTEN=127.0.0.1:0",
		"FENCED_HEALTH_LISTEN=127.0.0.1:0",
	})
	metricsURL := "http://" + loggedAddr(t, log, metricsAddr) + metricsPath
	if got := healthStatus(t, grpcAddr, readyService); got != "SERVING" {
		t.Fatalf("fenced on redis-server: Health.Check(%q) = %s, want SERVING", readyService, got)
	}
	return liveFenced{grpcAddr: grpcAddr, metricsURL: metricsURL, stopRedis: stopRedis}
}

func counterSum(f *dto.MetricFamily) float64 {
	sum := 0.0
	for _, m := range f.GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// metricsAddr finds the metrics address in fenced's log line "serving
// metrics", text or JSON.
var metricsAddr = regexp.MustCompile(`serving metrics"?.*?\baddr"?[=:]"?([0-9.]+:[0-9]+)`)

// loggedAddr waits until re matches fenced's log and returns its group.
func loggedAddr(t *testing.T, log *syncBuffer, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if m := re.FindStringSubmatch(log.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("fenced logged no %s after %v:\n%s", re, waitFor, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startRedis runs a redis-server listening on a Unix socket alone (no TCP
// port to race for), without persistence, until the test ends or stop is
// called, and returns the socket's path once it answers.
func startRedis(t *testing.T) (sock string, stop func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found (make redis-server, or apt-get install -y redis-server): %v", err)
	}
	dir, err := os.MkdirTemp("", "fenced-redis-")
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(dir, "redis.sock")
	var log syncBuffer
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
		"--dir", dir, "--save", "", "--appendonly", "no")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cmd.Process.Kill()
			<-exited
		})
	}
	t.Cleanup(func() {
		stop()
		os.RemoveAll(dir)
		if t.Failed() {
			t.Logf("redis-server log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(strings.ToLower(log.String()), "ready to accept connections") {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("redis-server exited: %v\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server not ready after %v:\n%s", waitFor, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return sock, stop
}

// driveOutcomes makes one call of each outcome the metrics count: a lease
// grant, a committed batch, its replay, conflicts revision conflicts (at
// least one) and a stale-lease refusal.
func driveOutcomes(t *testing.T, addr string, conflicts int) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	defer conn.Close()
	c := reflectClient(t, conn, "fenced.v1.RecordsService", "fenced.v1.LeaseService")
	const slug = "monitoring-test"
	// The grant's epoch (Redis's clock in ms) fences the batches below.
	grant, err := c.call("fenced.v1.LeaseService/Acquire", `{"slug":"`+slug+`","owner":"tick-a","ttl_ms":600000}`)
	if err != nil {
		t.Fatalf("lease grant: Acquire: %v", err)
	}
	lease := grant.Get(grant.Descriptor().Fields().ByName("lease")).Message()
	epoch := strconv.FormatInt(lease.Get(lease.Descriptor().Fields().ByName("epoch")).Int(), 10)
	steps := []struct {
		what   string
		method string
		req    string
		code   codes.Code
		check  func(out protoreflect.Message) error
	}{
		{"commit", "fenced.v1.RecordsService/FencedBatch",
			`{"slug":"` + slug + `","request_id":"monitoring-1","fence":{"owner":"tick-a","epoch":` + epoch + `},"writes":[` +
				`{"kind":"WRITE_KIND_PUT","section":"claims","key":"T-1","expected":0,"value":"{}"}]}`, codes.OK, nil},
		{"replay", "fenced.v1.RecordsService/FencedBatch",
			`{"slug":"` + slug + `","request_id":"monitoring-1","fence":{"owner":"tick-a","epoch":` + epoch + `},"writes":[` +
				`{"kind":"WRITE_KIND_PUT","section":"claims","key":"T-1","expected":0,"value":"{}"}]}`, codes.OK,
			func(out protoreflect.Message) error {
				if f := out.Descriptor().Fields().ByName("replayed"); f == nil || !out.Get(f).Bool() {
					return fmt.Errorf("replayed not true")
				}
				return nil
			}},
		{"revision conflict", "fenced.v1.RecordsService/FencedBatch",
			`{"slug":"` + slug + `","fence":{"owner":"tick-a","epoch":` + epoch + `},"writes":[` +
				`{"kind":"WRITE_KIND_PUT","section":"claims","key":"T-1","expected":0,"value":"{}"}]}`, codes.Aborted, nil},
		{"stale lease", "fenced.v1.RecordsService/FencedBatch",
			`{"slug":"` + slug + `","fence":{"owner":"tick-old","epoch":7},"writes":[` +
				`{"kind":"WRITE_KIND_PUT","section":"claims","key":"T-2","expected":0,"value":"{}"}]}`, codes.FailedPrecondition, nil},
	}
	for range conflicts - 1 {
		steps = append(steps, steps[2])
	}
	for _, st := range steps {
		out, err := c.call(st.method, st.req)
		if got := status.Code(err); got != st.code {
			t.Fatalf("%s: %s(%s) = %v, want code %v", st.what, st.method, st.req, err, st.code)
		}
		if st.check != nil {
			if err := st.check(out); err != nil {
				t.Fatalf("%s: %s(%s) answered %v: %v", st.what, st.method, st.req, protojson.Format(out.Interface()), err)
			}
		}
	}
}

// reflectClient asks conn's reflection service for the files that define
// services (and everything they import).
func reflectClient(t *testing.T, conn *grpc.ClientConn, services ...string) *reflectedClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	stream, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	defer stream.CloseSend()
	byName := map[string]*descriptorpb.FileDescriptorProto{}
	for _, svc := range services {
		req := &rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: svc}}
		if err := stream.Send(req); err != nil {
			t.Fatalf("reflection: send: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reflection: %s: %v", svc, err)
		}
		fd := resp.GetFileDescriptorResponse()
		if fd == nil {
			t.Fatalf("reflection: %s: answered %v", svc, resp)
		}
		for _, b := range fd.GetFileDescriptorProto() {
			f := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(b, f); err != nil {
				t.Fatalf("reflection: %s: %v", svc, err)
			}
			byName[f.GetName()] = f
		}
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		set.File = append(set.File, byName[name])
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("reflection: build the descriptors of %q: %v", services, err)
	}
	return &reflectedClient{conn: conn, files: files}
}

// reflectedClient calls fenced's methods by name with JSON requests,
// learning their types from the server's reflection service, as grpcurl
// does.
type reflectedClient struct {
	conn  *grpc.ClientConn
	files *protoregistry.Files
}

// call invokes method ("package.Service/Method") with the JSON request and
// returns the answer.
func (c *reflectedClient) call(method, reqJSON string) (protoreflect.Message, error) {
	svc, name, _ := strings.Cut(method, "/")
	d, err := c.files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, err
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is a %T, not a service", svc, d)
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return nil, fmt.Errorf("%s has no method %s", svc, name)
	}
	in, out := dynamicpb.NewMessage(md.Input()), dynamicpb.NewMessage(md.Output())
	if err := protojson.Unmarshal([]byte(reqJSON), in); err != nil {
		return nil, fmt.Errorf("request %s: %w", reqJSON, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	err = c.conn.Invoke(ctx, "/"+method, in, out)
	return out, err
}

// TestAlertRules: the PrometheusRule's groups pass Prometheus's own rule
// validation (rulefmt: expressions, durations, label names, annotation
// templates); every alert has a severity of severities, a summary, a
// description and a runbook_url whose anchor is a section of
// docs/observability.md; every runbook section there is an alert's.
func TestAlertRules(t *testing.T) {
	pr := readRule(t)
	groups, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	rgs, errs := rulefmt.Parse(groups, false, model.UTF8Validation, parser.NewParser(parser.Options{}), logger)
	for _, err := range errs {
		t.Errorf("%s: rulefmt: %v\n%s", ruleFile, err, groups)
	}
	if rgs == nil || len(rgs.Groups) == 0 {
		t.Fatalf("%s: no rule groups", ruleFile)
	}
	anchors := docAnchors(t)
	runbooks := runbookSections(t)
	var alerts []string
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if !slices.Contains(severities, r.Labels["severity"]) {
				t.Errorf("%s: alert %s severity = %q, want one of %q", ruleFile, r.Alert, r.Labels["severity"], severities)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: alert %s has no %s annotation", ruleFile, r.Alert, a)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookURL)
			switch {
			case !ok:
				t.Errorf("%s: alert %s runbook_url = %q, want %s<anchor>", ruleFile, r.Alert, r.Annotations["runbook_url"], runbookURL)
			case !anchors[anchor]:
				t.Errorf("%s: alert %s runbook_url anchor #%s is no heading of %s", ruleFile, r.Alert, anchor, observabilityDoc)
			case anchor != githubAnchor(r.Alert):
				t.Errorf("%s: alert %s runbook_url anchor #%s, want its own section #%s", ruleFile, r.Alert, anchor, githubAnchor(r.Alert))
			}
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(alerts)), slices.Sorted(slices.Values(runbooks))) {
		t.Errorf("alerts %q, runbook sections of %s %q: want one section per alert", slices.Sorted(slices.Values(alerts)), observabilityDoc, slices.Sorted(slices.Values(runbooks)))
	}
}

// TestRuleValidationCatchesMistakes: the validation TestAlertRules relies
// on refuses a rule that does not parse and an annotation template that
// does not.
func TestRuleValidationCatchesMistakes(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for name, y := range map[string]string{
		"bad expression": "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(rate(x[5m])\n",
		"bad template":   "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x > 0\n    annotations:\n      summary: '{{ $labels.x '\n",
		"unknown field":  "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x > 0\n    severity: critical\n",
	} {
		if _, errs := rulefmt.Parse([]byte(y), false, model.UTF8Validation, parser.NewParser(parser.Options{}), logger); len(errs) == 0 {
			t.Errorf("rulefmt.Parse(%s) = no error, want one:\n%s", name, y)
		}
	}
}

var (
	mdHeading   = regexp.MustCompile(`(?m)^(#{1,6})\s+(.+?)\s*$`)
	mdCodeBlock = regexp.MustCompile("(?ms)^```.*?^```")
)

// readDocText returns docs/observability.md without its code blocks, whose
// # comments are no headings.
func readDocText(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(observabilityDoc)
	if err != nil {
		t.Fatal(err)
	}
	return mdCodeBlock.ReplaceAllString(string(doc), "")
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case,
// punctuation but - and _ dropped, spaces turned into -.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// docAnchors returns the anchors of every heading of docs/observability.md.
func docAnchors(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(readDocText(t), -1) {
		out[githubAnchor(strings.Trim(m[2], "`"))] = true
	}
	return out
}

// runbookSections returns the headings one level below the heading
// "Runbooks" of docs/observability.md: one per alert.
func runbookSections(t *testing.T) []string {
	t.Helper()
	var out []string
	level := 0
	sc := bufio.NewScanner(strings.NewReader(readDocText(t)))
	for sc.Scan() {
		m := mdHeading.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		switch l := len(m[1]); {
		case m[2] == "Runbooks":
			level = l
		case level > 0 && l == level+1:
			out = append(out, strings.Trim(m[2], "`"))
		case level > 0 && l <= level:
			level = 0
		}
	}
	if len(out) == 0 {
		t.Errorf("%s has no runbook sections (a heading Runbooks with one subheading per alert)", observabilityDoc)
	}
	return out
}

// TestDashboard: the dashboard JSON decodes; it has a datasource variable
// of type prometheus that every panel, target and query variable uses (no
// hard-coded data source); the rows dashboardRows in order; every panel a
// unique id, a place on the grid, a description, a query; and
// docs/observability.md describes every panel by its title.
func TestDashboard(t *testing.T) {
	d, _ := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("%s: uid %q title %q, want both", dashboardFile, d.UID, d.Title)
	}
	dsVar := ""
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			if q := variableQuery(v); q != "prometheus" {
				t.Errorf("%s: datasource variable %s query %q, want prometheus", dashboardFile, v.Name, q)
			}
			dsVar = v.Name
		}
	}
	if dsVar == "" {
		t.Fatalf("%s: no templating variable of type datasource", dashboardFile)
	}
	usesVar := func(s *grafanaSource) bool {
		return s != nil && (s.UID == "$"+dsVar || s.UID == "${"+dsVar+"}")
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" && !usesVar(v.Datasource) {
			t.Errorf("%s: variable %s datasource = %+v, want uid ${%s}", dashboardFile, v.Name, v.Datasource, dsVar)
		}
	}
	doc, err := os.ReadFile(observabilityDoc)
	if err != nil {
		t.Fatal(err)
	}
	panels, rowOf := flatPanels(d)
	var rows []string
	ids := map[int]bool{}
	for _, p := range panels {
		if ids[p.ID] {
			t.Errorf("%s: panel %q id %d is not unique", dashboardFile, p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: panel %q gridPos %+v, want a place within 24 columns", dashboardFile, p.Title, p.GridPos)
		}
		if p.Type == "row" {
			rows = append(rows, p.Title)
			if len(p.Targets) > 0 {
				t.Errorf("%s: row %q has queries", dashboardFile, p.Title)
			}
			continue
		}
		if rowOf[p.ID] == "" {
			t.Errorf("%s: panel %q is above the first row", dashboardFile, p.Title)
		}
		if !usesVar(p.Datasource) {
			t.Errorf("%s: panel %q datasource = %+v, want uid ${%s}", dashboardFile, p.Title, p.Datasource, dsVar)
		}
		if len(p.Targets) == 0 || p.Description == "" {
			t.Errorf("%s: panel %q has %d queries and description %q, want both", dashboardFile, p.Title, len(p.Targets), p.Description)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("%s: panel %q target %s has no expr", dashboardFile, p.Title, tg.RefID)
			}
			if tg.Datasource != nil && !usesVar(tg.Datasource) {
				t.Errorf("%s: panel %q target %s datasource = %+v, want uid ${%s}", dashboardFile, p.Title, tg.RefID, tg.Datasource, dsVar)
			}
		}
		if !strings.Contains(string(doc), "**"+p.Title+"**") {
			t.Errorf("%s does not describe the dashboard panel **%s**", observabilityDoc, p.Title)
		}
	}
	if !slices.Equal(rows, dashboardRows) {
		t.Errorf("%s: rows %q, want %q", dashboardFile, rows, dashboardRows)
	}
}

// checkMonitoring: a render with the monitoring component scrapes fenced's
// pods both ways, on the port and path fenced serves metrics on, carries
// the rule and the dashboard as their files hold them.
func checkMonitoring(t *testing.T, r *rendered, d *appsv1.Deployment) {
	c := fencedContainer(t, d)
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}

	// The ServiceMonitor selects a Service of fenced's pods whose port of
	// that name targets the container's metrics port.
	sm := one[*monitoringv1.ServiceMonitor](t, r, fencedName)
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("ServiceMonitor %s selector %v: %v", sm.Name, sm.Spec.Selector, err)
	}
	if len(sm.Spec.Endpoints) == 0 {
		t.Fatalf("ServiceMonitor %s has no endpoints", sm.Name)
	}
	for _, ep := range sm.Spec.Endpoints {
		if ep.Path != metricsPath || ep.Port == "" {
			t.Errorf("ServiceMonitor %s endpoint port %s path %q, want a named port and %s", sm.Name, ep.Port, ep.Path, metricsPath)
			continue
		}
		targets := 0
		for _, svc := range all[*corev1.Service](r) {
			if svc.Namespace != sm.Namespace || !sel.Matches(klabels.Set(svc.Labels)) {
				continue
			}
			for _, p := range svc.Spec.Ports {
				if p.Name != ep.Port {
					continue
				}
				targets++
				if tp := p.TargetPort; !(tp == intstr.FromString("metrics") || tp == intstr.FromInt32(metricsPort)) {
					t.Errorf("ServiceMonitor %s: Service %s port %s targets %s, want the container's metrics port %d", sm.Name, svc.Name, p.Name, tp.String(), metricsPort)
				}
				if got := selected(r, klabels.SelectorFromSet(svc.Spec.Selector)); !slices.Equal(got, []string{"Deployment/" + d.Name}) {
					t.Errorf("ServiceMonitor %s: Service %s selects %q, want fenced's pods", sm.Name, svc.Name, got)
				}
			}
		}
		if targets == 0 {
			t.Errorf("ServiceMonitor %s endpoint port %s: no Service it selects has that port", sm.Name, ep.Port)
		}
	}

	// Some NetworkPolicy of fenced's pods admits scrapes of that port.
	admitted := false
	for _, np := range all[*networkingv1.NetworkPolicy](r) {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(klabels.Set(d.Spec.Template.Labels)) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				admitted = admitted || (p.Port != nil && (p.Port.IntValue() == int(metricsPort) || p.Port.String() == "metrics"))
			}
		}
	}
	if !admitted {
		t.Errorf("no NetworkPolicy of fenced's pods admits scrapes of the metrics port %d", metricsPort)
	}

	// The plain annotations.
	ann := d.Spec.Template.Annotations
	want := map[string]string{
		"prometheus.io/scrape": "true",
		"prometheus.io/port":   fmt.Sprint(metricsPort),
		"prometheus.io/path":   metricsPath,
	}
	for k, v := range want {
		if ann[k] != v {
			t.Errorf("Deployment %s pod annotation %s = %q, want %q", d.Name, k, ann[k], v)
		}
	}

	// The rule, as its file holds it.
	pr := one[*monitoringv1.PrometheusRule](t, r, fencedName)
	if got, want := pr.Spec, readRule(t).Spec; !equalJSON(t, got, want) {
		t.Errorf("PrometheusRule %s renders other groups than %s", pr.Name, ruleFile)
	}

	// The dashboard, byte for byte, labelled for Grafana's sidecar.
	cm := one[*corev1.ConfigMap](t, r, dashboardConfigMap)
	_, data := readDashboard(t)
	if cm.Data[filepath.Base(dashboardFile)] != string(data) {
		t.Errorf("ConfigMap %s key %s differs from %s", cm.Name, filepath.Base(dashboardFile), dashboardFile)
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("ConfigMap %s labels %v, want grafana_dashboard=1 (Grafana's dashboard sidecar)", cm.Name, cm.Labels)
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}

// TestREADMEMonitoring: the deploy README and the observability doc say how
// to include the monitoring component.
func TestREADMEMonitoring(t *testing.T) {
	for _, f := range []string{"README.md", observabilityDoc} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), monitoringComponent) {
			t.Errorf("%s does not mention %s", f, monitoringComponent)
		}
	}
}
