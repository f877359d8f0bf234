package metrics_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/metrics"
	"github.com/agentihooks/fenced/internal/server/fair"
)

// series reads m's registry: "name{label=value,...}" (labels in the
// registry's order) -> value, for the families named.
func series(t *testing.T, m *metrics.Metrics, names ...string) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !want[mf.GetName()] {
			continue
		}
		for _, s := range mf.GetMetric() {
			key := mf.GetName() + "{"
			for i, l := range s.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			key += "}"
			switch {
			case s.GetCounter() != nil:
				out[key] = s.GetCounter().GetValue()
			case s.GetGauge() != nil:
				out[key] = s.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestFairQueueFamily: what the fair queue reports lands in its family by
// flow: calls by outcome, seconds by kind, the seats and waiting gauges.
func TestFairQueueFamily(t *testing.T) {
	m := metrics.New()
	m.QueueAdmitted("token:tick", 0)
	m.QueueAdmitted("token:tick", 3*time.Millisecond)
	m.QueueRefused("token:flood", fair.ReasonQueueFull)
	m.QueueRefused("token:flood", fair.ReasonDeadline)
	m.QueueFinished("token:tick", 2*time.Millisecond, 5*time.Millisecond)
	m.QueueLoad(func() (int, int) { return 7, 3 })
	got := series(t, m, "fenced_fair_calls_total", "fenced_fair_seconds_total", "fenced_fair_seats_in_use", "fenced_fair_calls_waiting")
	want := map[string]float64{
		"fenced_fair_calls_total{flow=token:tick,outcome=went}":        1,
		"fenced_fair_calls_total{flow=token:tick,outcome=waited}":      1,
		"fenced_fair_calls_total{flow=token:flood,outcome=queue_full}": 1,
		"fenced_fair_calls_total{flow=token:flood,outcome=deadline}":   1,
		"fenced_fair_seconds_total{flow=token:tick,kind=queue_wait}":   0.003,
		"fenced_fair_seconds_total{flow=token:tick,kind=redis}":        0.002,
		"fenced_fair_seconds_total{flow=token:tick,kind=charged}":      0.005,
		"fenced_fair_seats_in_use{}":                                   7,
		"fenced_fair_calls_waiting{}":                                  3,
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, w)
		}
	}
}

// TestFairQueueFlowLabelsAreBounded: past MaxFlowLabels flows (addresses
// are anyone's), the others are counted under "other": the family's series
// stay bounded however many callers come.
func TestFairQueueFlowLabelsAreBounded(t *testing.T) {
	m := metrics.New()
	const callers = metrics.MaxFlowLabels + 100
	for i := range callers {
		m.QueueAdmitted("address:10.0.0."+strconv.Itoa(i), 0)
	}
	got := series(t, m, "fenced_fair_calls_total")
	flows := map[string]bool{}
	var total float64
	for k, v := range got {
		total += v
		flows[k] = true
	}
	// Each flow label has its four outcomes.
	if n := len(flows) / 4; n != metrics.MaxFlowLabels+1 {
		t.Errorf("%d callers gave %d flow labels; want %d and %q", callers, n, metrics.MaxFlowLabels, metrics.OtherFlow)
	}
	if other := got["fenced_fair_calls_total{flow=other,outcome=went}"]; other != 100 {
		t.Errorf("calls counted under %q = %v, want 100", metrics.OtherFlow, other)
	}
	if total != callers {
		t.Errorf("calls counted in all = %v, want %d", total, callers)
	}
}
