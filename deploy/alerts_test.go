package deploy

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// scrapeTarget are the labels Prometheus would attach to every series of
// one fenced pod scraped through the ServiceMonitor.
var scrapeTarget = map[string]string{
	"job":       "fenced",
	"namespace": "fenced",
	"pod":       "fenced-6d4cf9b7c-x2x7q",
	"instance":  "10.0.0.7:7421",
}

// fsample is one float sample.
type fsample struct {
	t int64 // ms
	f float64
}

func (s fsample) T() int64                    { return s.t }
func (fsample) ST() int64                     { return 0 }
func (s fsample) F() float64                  { return s.f }
func (fsample) H() *histogram.Histogram       { return nil }
func (fsample) FH() *histogram.FloatHistogram { return nil }
func (fsample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s fsample) Copy() chunks.Sample         { return s }
func (s fsample) String() string              { return fmt.Sprintf("%v@%d", s.f, s.t) }

// seriesStore is an in-memory time series database: scrapes appended at
// given times, queried by the PromQL engine as Prometheus's storage would
// be.
type seriesStore struct {
	lbls   []labels.Labels
	points [][]chunks.Sample // by series, in time order
	byKey  map[string]int    // index of each series by its labels' text
}

func newSeriesStore() *seriesStore { return &seriesStore{byKey: map[string]int{}} }

func (s *seriesStore) queryable() storage.Queryable { return storage.QueryableFunc(s.querier) }

// add appends one scrape of fenced, taken at ts, with the target labels
// Prometheus attaches, as the samples Prometheus stores for it (a histogram
// as its _bucket, _sum and _count series).
func (s *seriesStore) add(ts time.Time, fams map[string]*dto.MetricFamily) {
	ms := ts.UnixMilli()
	put := func(name string, l []*dto.LabelPair, extra map[string]string, v float64) {
		b := labels.NewScratchBuilder(len(l) + len(extra) + len(scrapeTarget) + 1)
		b.Add(labels.MetricName, name)
		for _, lp := range l {
			b.Add(lp.GetName(), lp.GetValue())
		}
		for k, v := range extra {
			b.Add(k, v)
		}
		for k, v := range scrapeTarget {
			b.Add(k, v)
		}
		b.Sort()
		lbls := b.Labels()
		i, ok := s.byKey[lbls.String()]
		if !ok {
			i = len(s.lbls)
			s.byKey[lbls.String()] = i
			s.lbls = append(s.lbls, lbls)
			s.points = append(s.points, nil)
		}
		s.points[i] = append(s.points[i], fsample{ms, v})
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				put(name, m.GetLabel(), nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				put(name, m.GetLabel(), nil, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				put(name, m.GetLabel(), nil, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					put(name+"_bucket", m.GetLabel(), map[string]string{"le": formatLe(b.GetUpperBound())}, float64(b.GetCumulativeCount()))
				}
				put(name+"_bucket", m.GetLabel(), map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
				put(name+"_sum", m.GetLabel(), nil, h.GetSampleSum())
				put(name+"_count", m.GetLabel(), nil, float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					put(name, m.GetLabel(), map[string]string{"quantile": strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)}, q.GetValue())
				}
				put(name+"_sum", m.GetLabel(), nil, sm.GetSampleSum())
				put(name+"_count", m.GetLabel(), nil, float64(sm.GetSampleCount()))
			}
		}
	}
}

func formatLe(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// querier returns every stored series its matchers select, sorted by
// labels.
func (s *seriesStore) querier(_, _ int64) (storage.Querier, error) {
	return &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
		var out []storage.Series
		for i, l := range s.lbls {
			ok := true
			for _, m := range ms {
				ok = ok && m.Matches(l.Get(m.Name))
			}
			if ok {
				out = append(out, storage.NewListSeries(l, s.points[i]))
			}
		}
		slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
		return &seriesList{list: out, i: -1}
	}}, nil
}

// seriesList is a storage.SeriesSet over a slice.
type seriesList struct {
	list []storage.Series
	i    int
}

func (l *seriesList) Next() bool                      { l.i++; return l.i < len(l.list) }
func (l *seriesList) At() storage.Series              { return l.list[l.i] }
func (*seriesList) Err() error                        { return nil }
func (*seriesList) Warnings() annotations.Annotations { return nil }

// firing evaluates every alert's expression at ts with Prometheus's PromQL
// engine and returns the alerts whose expression has a result (pending or
// firing: their for: clause is not applied).
func firing(t *testing.T, s *seriesStore, ts time.Time) []string {
	t.Helper()
	ng := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	var out []string
	for _, g := range readRule(t).Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			q, err := ng.NewInstantQuery(context.Background(), s.queryable(), nil, r.Expr.String(), ts)
			if err != nil {
				t.Fatalf("alert %s: %v", r.Alert, err)
			}
			res := q.Exec(context.Background())
			if res.Err != nil {
				t.Fatalf("alert %s at %v: %v", r.Alert, ts, res.Err)
			}
			v, err := res.Vector()
			if err != nil {
				t.Fatalf("alert %s: %v", r.Alert, err)
			}
			if len(v) > 0 {
				out = append(out, r.Alert)
			}
			q.Close()
		}
	}
	slices.Sort(out)
	return out
}

// TestAlertsFireOnLiveScrapes evaluates the alerts with Prometheus's PromQL
// engine over scrapes of a fenced running on redis-server, stored at chosen
// times as Prometheus would store them: with no fenced scraped only
// FencedMetricsAbsent fires; two scrapes of an idle fenced fire nothing;
// after a stale-lease refusal and 70 conflicts against one commit,
// FencedStaleLeaseRefusals and FencedConflictRatioHigh fire, and no other
// (FencedBatchLatencyHigh left out: it depends on this machine's load);
// with its redis-server killed, FencedRedisNotServing fires.
func TestAlertsFireOnLiveScrapes(t *testing.T) {
	const conflicts = 70 // above the alert's floor of 0.1 a second over 10m
	f := startFencedOnRedis(t)
	_, idle0 := scrape(t, f.metricsURL)
	_, idle1 := scrape(t, f.metricsURL)
	driveOutcomes(t, f.grpcAddr, conflicts)
	_, busy := scrape(t, f.metricsURL)
	f.stopRedis()
	waitNotServing(t, f.grpcAddr)
	_, down := scrape(t, f.metricsURL)
	// Redis down: fenced_redis_ready 0, FencedRedisNotServing fires.
	redisDown := []string{"FencedRedisNotServing"}

	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		scrapes []map[string]*dto.MetricFamily
		every   time.Duration
		want    []string
		ignore  []string
	}{
		{"no fenced scraped", nil, time.Minute, []string{"FencedMetricsAbsent"}, nil},
		{"idle", []map[string]*dto.MetricFamily{idle0, idle1}, time.Minute, nil, nil},
		{fmt.Sprintf("a stale refusal and %d conflicts within 30s", conflicts), []map[string]*dto.MetricFamily{idle1, busy}, 30 * time.Second,
			[]string{"FencedConflictRatioHigh", "FencedStaleLeaseRefusals"}, []string{"FencedBatchLatencyHigh"}},
		{"redis-server killed", []map[string]*dto.MetricFamily{busy, down}, 30 * time.Second,
			redisDown, []string{"FencedBatchLatencyHigh", "FencedRedisRefusals"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSeriesStore()
			at := t0
			for i, fams := range tt.scrapes {
				at = t0.Add(time.Duration(i) * tt.every)
				s.add(at, fams)
			}
			got := slices.DeleteFunc(firing(t, s, at), func(a string) bool { return slices.Contains(tt.ignore, a) })
			if !slices.Equal(got, tt.want) {
				t.Errorf("alerts with expressions true = %q, want %q", got, tt.want)
			}
		})
	}
}

// waitNotServing polls Health.Check(readyService) at addr until it answers
// NOT_SERVING, for at most waitFor.
func waitNotServing(t *testing.T, addr string) {
	t.Helper()
	if got := awaitHealthStatus(t, addr, readyService, healthpb.HealthCheckResponse_NOT_SERVING); got != "NOT_SERVING" {
		t.Fatalf("Health.Check(%q) = %s after %v with Redis stopped, want NOT_SERVING", readyService, got, waitFor)
	}
}
