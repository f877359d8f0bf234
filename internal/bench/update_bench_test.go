package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
)

// BenchmarkUpdateContention is TestConcurrentIncrements (client) as a
// measurement: per iteration, 8 callers each increment one counter record
// of a fresh swarm 50 times through client.Update, a caller told
// ErrKeptChanging calling again. It reports, per round of 400 increments,
// the reruns of the change after conflicts (reruns/round) and the Update
// calls that gave up with ErrKeptChanging after MaxUpdateAttempts
// (kept-changing/round): how often contention on this box outlasts
// Update's growing wait, a rate the test may not assert.
func BenchmarkUpdateContention(b *testing.B) {
	const callers, each = 8, 50
	srv := redistest.Start(b)
	addr := fencedtest.Start(b, srv).Addr
	clients := make([]*client.Client, callers)
	for i := range clients {
		c, err := client.Dial(addr)
		if err != nil {
			b.Fatalf("client.Dial(%s): %v", addr, err)
		}
		b.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	type counter struct {
		N int64 `json:"n"`
	}
	ctx := context.Background()
	var runs, kept, rounds int
	for ; b.Loop(); rounds++ {
		slug := fmt.Sprintf("contention-%d", rounds)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				myRuns, myKept := 0, 0
				for done := 0; done < each; {
					_, err := clients[i].Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
						myRuns++
						var v counter
						if _, err := tx.GetJSON("operations", "counter", &v); err != nil {
							return err
						}
						v.N++
						return tx.PutJSON("operations", "counter", v)
					})
					switch {
					case err == nil:
						done++
					case errors.Is(err, client.ErrKeptChanging):
						myKept++
					default:
						b.Errorf("caller %d: Update: %v", i, err)
						return
					}
				}
				mu.Lock()
				runs, kept = runs+myRuns, kept+myKept
				mu.Unlock()
			})
		}
		wg.Wait()
		rec, _, err := clients[0].Get(ctx, slug, "operations", "counter")
		if err != nil || rec == nil {
			b.Fatalf("Get(%s, operations/counter) = %v, %v", slug, rec, err)
		}
		var got counter
		if err := json.Unmarshal(rec.Value, &got); err != nil || got.N != callers*each {
			b.Fatalf("counter of %s = %s (%v), want n %d", slug, rec.Value, err, callers*each)
		}
	}
	b.ReportMetric(float64(runs-callers*each*rounds)/float64(rounds), "reruns/round")
	b.ReportMetric(float64(kept)/float64(rounds), "kept-changing/round")
}
