package fencedtest_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStartServesThenStopRefuses: a started fenced answers over its
// connection (a batch commits and reads back through the typed client);
// after Stop, Serve has returned nil and calls fail; a second Stop answers
// the same.
func TestStartServesThenStopRefuses(t *testing.T) {
	f := fencedtest.Start(t, redistest.Start(t))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := f.Records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "s1", Writes: []*fencedv1.RecordWrite{
		{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: "c1", Value: `{"by":"tick"}`},
	}})
	if err != nil {
		t.Fatalf("FencedBatch: %v", err)
	}
	rec, rev, err := f.Client.Get(ctx, "s1", "claims", "c1")
	if err != nil || rec == nil || string(rec.Value) != `{"by":"tick"}` || rev != resp.GetRevision() {
		t.Fatalf("Get(s1, claims, c1) = %+v, %d, %v; want the value put at revision %d", rec, rev, err, resp.GetRevision())
	}
	if err := f.Stop(ctx); err != nil {
		t.Fatalf("Stop = %v, want nil", err)
	}
	if err := f.Stop(ctx); err != nil {
		t.Errorf("second Stop = %v, want nil", err)
	}
	if _, err := f.Records.Layout(ctx, &fencedv1.LayoutRequest{Slug: "s1"}); status.Code(err) != codes.Unavailable {
		t.Errorf("Layout after Stop = %v, want UNAVAILABLE", err)
	}
}

// TestLogBufferKeepsEveryConcurrentWrite: lines written from many
// goroutines while the test reads are all there, none torn.
func TestLogBufferKeepsEveryConcurrentWrite(t *testing.T) {
	var b fencedtest.LogBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("line\n"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "line\n"); got != 800 {
		t.Errorf("LogBuffer holds %d lines, want 800", got)
	}
}
