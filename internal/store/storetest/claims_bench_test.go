package storetest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// BenchmarkClaims is the cost of the three claim operations that must not
// grow with the number of claims (docs/design/12-claims.md §12.3, issue
// 27's scale rule) in a swarm holding 10 and 10,000 live claims (granted
// by AcquireClaim beforehand, each with its log entry): Acquire (a new
// grant of a name released outside the timer, so the count stays put),
// Renew of a live claim, a one-put batch fenced by one claim, the same put
// bound to that claim (§12.4), and Record of an unbound and of a bound
// record (the bound one reads its claim's grant too). Each
// sub-benchmark reports the wall time per call (ns/op: the round trip on
// loopback included) and redis-µs: the median Redis time of the script
// call (SLOWLOG, every command logged, reset before each timed call;
// EVALSHA, WithoutFunctions, so that the entry names the swarm). Compare
// a row's claims=10000 with its claims=10 in one run.
func BenchmarkClaims(b *testing.B) {
	srv := redistest.Start(b)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout, NoFunctions: true}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	ctx := context.Background()
	for _, n := range []int{10, 10000} {
		slug := "bench-claims-" + strconv.Itoa(n)
		var last batch.Lease
		for i := range n {
			if last, _, err = st.AcquireClaim(ctx, slug, "task/"+strconv.Itoa(i), "worker-"+strconv.Itoa(i%50), 3600_000); err != nil {
				b.Fatal(err)
			}
		}
		if got := srv.Do(b, "HLEN", key(slug, "claim-grants")); got != strconv.Itoa(n) {
			b.Fatalf("claim-grants holds %s claims, want %d", got, n)
		}
		fenced := &batch.ClaimFence{Name: "task/" + strconv.Itoa(n-1), Owner: last.Owner, Epoch: last.Epoch}
		ops := []struct {
			name string
			op   func(i int) error
			// after runs outside the timer, after each op.
			after func() error
		}{
			{"acquire", func(int) error {
				l, _, err := st.AcquireClaim(ctx, slug, "bench/new", "worker-x", 3600_000)
				last = l
				return err
			}, func() error {
				_, err := st.ReleaseClaim(ctx, slug, "bench/new", "worker-x", last.Epoch)
				return err
			}},
			{"renew", func(int) error {
				_, _, err := st.RenewClaim(ctx, slug, fenced.Name, fenced.Owner, fenced.Epoch, 3600_000)
				return err
			}, nil},
			{"fenced-put", func(i int) error {
				_, err := st.Commit(ctx, &batch.Batch{Slug: slug, Claim: fenced,
					Writes: []batch.Write{put("tasks", "t"+strconv.Itoa(i%64), batch.Blind, `{"n":1}`)}})
				return err
			}, nil},
			// A put bound to the fence's claim (§12.4): its set's SADD,
			// and over a bound record the HMGET of its claim's grant.
			{"bound-put", func(i int) error {
				_, err := st.Commit(ctx, &batch.Batch{Slug: slug, Claim: fenced,
					Writes: []batch.Write{bput("tasks", "b"+strconv.Itoa(i%64), batch.Blind, `{"n":1}`)}})
				return err
			}, nil},
			// Record of an unbound and of a bound record (the grant's HMGET
			// and TIME in read_record.lua).
			{"read-plain", func(int) error {
				_, _, err := st.Record(ctx, slug, "tasks", "t0")
				return err
			}, nil},
			{"read-bound", func(int) error {
				rec, _, err := st.Record(ctx, slug, "tasks", "b0")
				if err == nil && (rec == nil || rec.Claim == "") {
					err = fmt.Errorf("b0 = %+v, want bound", rec)
				}
				return err
			}, nil},
		}
		for _, o := range ops {
			b.Run(fmt.Sprintf("claims=%d/%s", n, o.name), func(b *testing.B) {
				srv.Do(b, "CONFIG", "SET", "slowlog-max-len", "16")
				srv.Do(b, "CONFIG", "SET", "slowlog-log-slower-than", "0")
				defer srv.Do(b, "CONFIG", "SET", "slowlog-log-slower-than", "10000")
				var times []time.Duration
				b.ResetTimer()
				for i := range b.N {
					b.StopTimer()
					srv.Do(b, "SLOWLOG", "RESET")
					b.StartTimer()
					if err := o.op(i); err != nil {
						b.Fatalf("%s: %v", o.name, err)
					}
					b.StopTimer()
					if ts := claimScriptTimes(b, srv, "{"+slug+"}"); len(ts) == 1 {
						times = append(times, ts[0])
					}
					if o.after != nil {
						if err := o.after(); err != nil {
							b.Fatalf("%s: after: %v", o.name, err)
						}
					}
					b.StartTimer()
				}
				b.StopTimer()
				if len(times) > 0 {
					slices.Sort(times)
					b.ReportMetric(float64(times[len(times)/2])/1e3, "redis-µs")
				}
			})
		}
	}
}

// claimScriptTimes are the durations SLOWLOG holds of the scripts (EVAL,
// EVALSHA) whose arguments name tag.
func claimScriptTimes(b *testing.B, srv *redistest.Server, tag string) []time.Duration {
	b.Helper()
	c := srv.Client(b)
	entries, err := c.Do(context.Background(), c.B().Arbitrary("SLOWLOG", "GET", "-1").Build()).ToArray()
	if err != nil {
		b.Fatalf("SLOWLOG GET: %v", err)
	}
	var out []time.Duration
	for _, e := range entries {
		fields, err := e.ToArray()
		if err != nil || len(fields) < 4 {
			b.Fatalf("SLOWLOG entry %v: %v", e, err)
		}
		us, err := fields[2].AsInt64()
		if err != nil {
			b.Fatalf("SLOWLOG entry's duration: %v", err)
		}
		args, err := fields[3].AsStrSlice()
		if err != nil || len(args) == 0 {
			b.Fatalf("SLOWLOG entry's arguments: %v", err)
		}
		if cmd := strings.ToUpper(args[0]); (cmd == "EVAL" || cmd == "EVALSHA") && slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, tag) }) {
			out = append(out, time.Duration(us)*time.Microsecond)
		}
	}
	return out
}

// BenchmarkClaimsBulkLapse is a worker fleet dying at once (issue 27's
// rule: claims lapsing in bulk never run a script of more than ~2 ms): in
// one swarm, claims=1000 with records=10 bound records each (seeded in
// §12.4's form), or one claim with 5,000 (each reaper step then deletes a
// full budget), lapse together; one reaper pass (ReapOnce, timed) ends them
// all. It reports the pass's wall time (ns/op), the longest and the median
// Redis time of one reaper script (SLOWLOG, every command logged:
// redis-max-µs, redis-median-µs; reap.lua and reap_plan.lua alike), and how
// many scripts ran (scripts). Run with -benchtime=1x: each iteration seeds
// the records outside the timer.
func BenchmarkClaimsBulkLapse(b *testing.B) {
	srv := redistest.Start(b)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout, NoFunctions: true}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	ctx := context.Background()
	// As fenced serve does at start: no first step pays for the script's
	// compilation (EVAL after NOSCRIPT).
	if err := st.LoadScripts(ctx); err != nil {
		b.Fatal(err)
	}
	c := srv.Client(b)
	for _, tc := range []struct{ claims, per int }{{1000, 10}, {1, 5000}} {
		b.Run(fmt.Sprintf("claims=%d/records=%d", tc.claims, tc.per), func(b *testing.B) {
			var worst, median time.Duration
			scripts := 0
			for it := range b.N {
				b.StopTimer()
				slug := fmt.Sprintf("bench-lapse-%d-%d", tc.claims, it)
				var last batch.Lease
				for i := range tc.claims {
					name := "task/" + strconv.Itoa(i)
					if last, _, err = st.AcquireClaim(ctx, slug, name, "worker-"+strconv.Itoa(i%50), 2000); err != nil {
						b.Fatal(err)
					}
					cmds := make(rueidis.Commands, 0, 2*tc.per)
					for j := range tc.per {
						k := fmt.Sprintf("r%d-%d", i, j)
						cmds = append(cmds,
							c.B().Hset().Key(key(slug, "claims")).FieldValue().FieldValue(k,
								fmt.Sprintf(`{"r":%d,"claim":%q,"claim_epoch":%d,"v":{"n":1}}`, last.Epoch, name, last.Epoch)).Build(),
							c.B().Sadd().Key(key(slug, "claim:"+name)).Member("claims\n"+k).Build())
					}
					for _, r := range c.DoMulti(ctx, cmds...) {
						if err := r.Error(); err != nil {
							b.Fatal(err)
						}
					}
				}
				waitClaimLapsedB(b, st, slug, "task/"+strconv.Itoa(tc.claims-1))
				srv.Do(b, "CONFIG", "SET", "slowlog-max-len", "100000")
				srv.Do(b, "CONFIG", "SET", "slowlog-log-slower-than", "0")
				srv.Do(b, "SLOWLOG", "RESET")
				b.StartTimer()
				r, err := st.ReapOnce(ctx)
				b.StopTimer()
				srv.Do(b, "CONFIG", "SET", "slowlog-log-slower-than", "10000")
				if err != nil {
					b.Fatalf("ReapOnce: %v", err)
				}
				if r.Lapsed != tc.claims || r.Records != tc.claims*tc.per {
					b.Fatalf("ReapOnce = %+v, want %d lapses and %d records", r, tc.claims, tc.claims*tc.per)
				}
				times := claimScriptTimes(b, srv, "{"+slug+"}")
				slices.Sort(times)
				scripts = len(times)
				if len(times) > 0 {
					worst = max(worst, times[len(times)-1])
					median = times[len(times)/2]
				}
			}
			b.ReportMetric(float64(worst)/1e3, "redis-max-µs")
			b.ReportMetric(float64(median)/1e3, "redis-median-µs")
			b.ReportMetric(float64(scripts), "scripts")
		})
	}
}

// waitClaimLapsedB is waitClaimLapsed for a benchmark.
func waitClaimLapsedB(b *testing.B, st *store.Store, slug, name string) {
	b.Helper()
	for range 1000 {
		l, now, _, err := st.CurrentClaim(context.Background(), slug, name)
		if err != nil {
			b.Fatalf("CurrentClaim: %v", err)
		}
		if l == nil || l.ExpiresAtMs <= now {
			return
		}
		time.Sleep(time.Duration(l.ExpiresAtMs-now+1) * time.Millisecond)
	}
	b.Fatal("claim did not lapse")
}
