package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/metrics"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// heldSections is a Store whose Sections reads wait for release, counting
// the reads running.
type heldSections struct {
	*store.Store
	release chan struct{}
	mu      sync.Mutex
	running int
}

func (h *heldSections) Sections(ctx context.Context, slug string, names []string) (*engine.Snapshot, error) {
	h.mu.Lock()
	h.running++
	h.mu.Unlock()
	defer func() { h.mu.Lock(); h.running--; h.mu.Unlock() }()
	<-h.release
	return h.Store.Sections(ctx, slug, names)
}

func (h *heldSections) inSections() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.running
}

// metricValue reads one series of m's registry: name, and the label value
// (or "" for none).
func metricValue(t *testing.T, m *metrics.Metrics, name, label string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			if label != "" && (len(s.GetLabel()) == 0 || s.GetLabel()[0].GetValue() != label) {
				continue
			}
			if g := s.GetGauge(); g != nil {
				return g.GetValue()
			}
			return s.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s{%s}", name, label)
	return 0
}

// TestASecondSectionsOfTheSameCallerWaitsAndIsCounted: over gRPC, a
// caller's second Sections waits while its first runs (one heavy read per
// caller by default): fenced_heavy_reads_waiting is 1 meanwhile and only
// one read is in the store; when the first ends the second runs, and
// fenced_heavy_read_waits_total{reason="caller"} counts it. Before, both
// ran at once: nothing kept one caller's reads from taking Redis and
// fenced's CPU from everyone (issue 26 §1).
func TestASecondSectionsOfTheSameCallerWaitsAndIsCounted(t *testing.T) {
	srv := redistest.Start(t)
	core := &heldSections{Store: openStore(t, srv), release: make(chan struct{})}
	m := metrics.New()
	e := serve(t, core, batch.DefaultLimits(), server.Options{Telemetry: server.Telemetry{Limits: m}})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: "reader", Names: []string{"claims"}})
			errs <- err
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for core.inSections() < 1 || metricValue(t, m, "fenced_heavy_reads_waiting", "") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: %d reads in the store, %v waiting; want 1 and 1", core.inSections(), metricValue(t, m, "fenced_heavy_reads_waiting", ""))
		}
		time.Sleep(time.Millisecond)
	}
	if n := core.inSections(); n != 1 {
		t.Errorf("%d Sections of one caller in the store at once, want 1", n)
	}
	close(core.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Sections: %v", err)
		}
	}
	if w, c := metricValue(t, m, "fenced_heavy_reads_waiting", ""), metricValue(t, m, "fenced_heavy_read_waits_total", server.ReadWaitCaller); w != 0 || c != 1 {
		t.Errorf("after both: %v waiting, %v caller waits counted; want 0 and 1", w, c)
	}
}
