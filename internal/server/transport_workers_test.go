package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// barrier is a Core whose CommitDurable returns only once n commits are in
// flight at the same time (or the call's context ends). The embedded Core
// is nil: nothing else is called.
type barrier struct {
	server.Core
	wg *sync.WaitGroup
}

func (b barrier) CommitDurable(ctx context.Context, _ *batch.Batch, _ engine.Durability) (engine.Committed, error) {
	b.wg.Done()
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return engine.Committed{Revision: 1}, nil
	case <-ctx.Done():
		return engine.Committed{}, ctx.Err()
	}
}

func (barrier) Ping(context.Context) error        { return nil }
func (barrier) LoadScripts(context.Context) error { return nil }

// TestCallsBeyondTheStreamWorkersRunAtOnce: with one stream worker, eight
// calls still run at the same time (each waits until all eight are in the
// handler): a call finding every worker busy gets a goroutine of its own.
func TestCallsBeyondTheStreamWorkersRunAtOnce(t *testing.T) {
	const calls = 8
	var wg sync.WaitGroup
	wg.Add(calls)
	e := serve(t, barrier{wg: &wg}, batch.DefaultLimits(), server.Options{Transport: server.Transport{StreamWorkers: 1}})
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: fmt.Sprintf("w%d", i),
				Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
			errs <- err
		}()
	}
	for range calls {
		if err := <-errs; err != nil {
			t.Errorf("FencedBatch with %d calls in flight and one stream worker: %v, want all to commit", calls, err)
		}
	}
}
