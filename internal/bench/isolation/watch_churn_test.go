package isolation

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// churnMax bounds the attacker's calls in one phase of
// BenchmarkWatchChurn; churnRate is the rate it makes them at (the issue's
// loop made ~180 opens a second), so that both loops are compared at one
// rate. FENCED_BENCH_CHURN_RATE overrides it (0: as fast as it can).
const (
	churnMax  = 200_000
	churnRate = 200
)

// BenchmarkWatchChurn (issue 26 §2a): one caller opens a Watch from now
// on its swarm, waits for its first answer (the progress event) and
// cancels it, in a loop at churnRate a second, while the victim (FencedBatch and Renew,
// alternating, one at a time) is timed; as the control, the same caller
// loops LeaseService.Current, a unary read, instead. Reported, each over
// the victim alone (idle): the victim's p99 (p99-ratio-watch,
// p99-ratio-current) and throughput (tput-ratio-watch,
// tput-ratio-current); the attacker's calls a second; and the Redis
// connections accepted during each phase (INFO stats
// total_connections_received; before, about one per Watch open: 617 for
// 782).
func BenchmarkWatchChurn(b *testing.B) {
	rate := churnRate
	if s := os.Getenv("FENCED_BENCH_CHURN_RATE"); s != "" {
		var err error
		if rate, err = strconv.Atoi(s); err != nil || rate < 0 {
			b.Fatalf("FENCED_BENCH_CHURN_RATE=%q: want calls a second, 0 for unpaced", s)
		}
	}
	srv := redistest.Start(b)
	f := startFenced(b, srv.URL())
	v := newVictim(b, f.addr, "victim-a")
	v.run(200, nil) // warm up
	start := time.Now()
	idle, _ := v.run(victimCalls, nil)
	idleTput := float64(len(idle)) / time.Since(start).Seconds()

	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	records := fencedv1.NewRecordsServiceClient(conn)
	leases := fencedv1.NewLeaseServiceClient(conn)
	authed := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+attackerToken)

	watch := func() error {
		ctx, cancel := context.WithTimeout(authed, 10*time.Second)
		defer cancel()
		stream, err := records.Watch(ctx, &fencedv1.WatchRequest{Slug: "attacker-w"})
		if err == nil {
			_, err = stream.Recv()
		}
		return err
	}
	current := func() error {
		ctx, cancel := context.WithTimeout(authed, 10*time.Second)
		defer cancel()
		_, err := leases.Current(ctx, &fencedv1.CurrentRequest{Slug: "attacker-w"})
		return err
	}
	type phase struct {
		p99, tput, rate float64
		conns           int64
		attackErr       error
	}
	attack := func(call func() error) phase {
		before := srv.InfoInt(b, "stats", "total_connections_received")
		stop := make(chan struct{})
		calls := make(chan int, 1)
		var attackErr error
		go func() {
			var tick <-chan time.Time
			if rate > 0 {
				t := time.NewTicker(time.Second / time.Duration(rate))
				defer t.Stop()
				tick = t.C
			}
			n := 0
			for ; n < churnMax; n++ {
				if tick != nil {
					select {
					case <-stop:
						calls <- n
						return
					case <-tick:
					}
				}
				select {
				case <-stop:
					calls <- n
					return
				default:
				}
				if err := call(); err != nil && attackErr == nil {
					attackErr = err
				}
			}
			calls <- n
		}()
		t0 := time.Now()
		during, _ := v.run(victimCalls, nil)
		elapsed := time.Since(t0)
		close(stop)
		n := <-calls
		after := srv.InfoInt(b, "stats", "total_connections_received")
		return phase{
			p99:       float64(p99(during)) / float64(p99(idle)),
			tput:      float64(len(during)) / elapsed.Seconds() / idleTput,
			rate:      float64(n) / elapsed.Seconds(),
			conns:     after - before - 1, // the INFO that read after
			attackErr: errors.Join(attackErr),
		}
	}
	w := attack(watch)
	c := attack(current)
	if w.attackErr != nil || c.attackErr != nil {
		b.Logf("attacker errors: watch %v, current %v", w.attackErr, c.attackErr)
	}
	b.ReportMetric(float64(p99(idle).Microseconds()), "p99-idle-µs")
	b.ReportMetric(w.p99, "p99-ratio-watch")
	b.ReportMetric(w.tput, "tput-ratio-watch")
	b.ReportMetric(w.rate, "watch-opens/s")
	b.ReportMetric(float64(w.conns), "redis-conns-watch")
	b.ReportMetric(c.p99, "p99-ratio-current")
	b.ReportMetric(c.tput, "tput-ratio-current")
	b.ReportMetric(c.rate, "current-calls/s")
	b.ReportMetric(float64(c.conns), "redis-conns-current")
	b.Logf("Watch open/cancel loop: %.0f opens/s, victim p99 %.2fx idle, throughput %.2fx, %d new Redis connections; "+
		"Current loop: %.0f calls/s, victim p99 %.2fx, throughput %.2fx, %d new Redis connections (idle p99 %v, %.0f calls/s)",
		w.rate, w.p99, w.tput, w.conns, c.rate, c.p99, c.tput, c.conns, p99(idle), idleTput)
}
