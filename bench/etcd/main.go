// Command etcd is the etcd side of `make bench`: it embeds an etcd 3.6
// server (go.etcd.io/etcd/server/v3/embed, its WAL fsynced on every commit,
// as etcd always does), talks to it over loopback gRPC with clientv3, and
// runs the workload fenced's comparison runs: each client goroutine is one
// swarm holding a lease, committing batches of n puts of ~200-byte JSON
// values in one Txn that compares the mod-revision of the lease key and of
// every record key with the revision it last saw. Every batch commits.
//
// It prints one line per case, "etcd conc=C size=N batches_per_s=X
// cpu_us_per_batch=Y", which internal/bench reads (FENCED_BENCH_ETCD) to
// put etcd beside fenced in one table. It lives in a module of its own so
// fenced's go.mod does not gain etcd's dependencies.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func main() {
	dur := flag.Duration("duration", 2*time.Second, "measuring time per case")
	concs := flag.String("conc", "16,64", "client goroutines (swarms), comma-separated")
	sizes := flag.String("sizes", "1,8,64", "puts per batch, comma-separated")
	out := flag.String("out", "", "also write the result lines to this file")
	flag.Parse()

	dir, err := os.MkdirTemp("", "fenced-bench-etcd-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Logger = "zap"
	cfg.LogLevel = "fatal"
	cfg.LogOutputs = []string{"stderr"}
	client, peer := mustURL("http://127.0.0.1:0"), mustURL("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("start etcd: %v", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		log.Fatal("etcd not ready in 30s")
	}
	addr := e.Clients[0].Addr().String()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		log.Fatalf("client: %v", err)
	}
	defer cli.Close()

	var w io.Writer = os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		w = io.MultiWriter(os.Stdout, f)
	}
	for _, c := range ints(*concs) {
		for _, n := range ints(*sizes) {
			rate, cpu := run(cli, c, n, *dur)
			fmt.Fprintf(w, "etcd conc=%d size=%d batches_per_s=%.0f cpu_us_per_batch=%.1f\n", c, n, rate, cpu)
		}
	}
}

// swarm is one client goroutine's state: its lease key and records, with
// the mod-revisions it last saw.
type swarm struct {
	lease    string
	leaseRev int64
	keys     []string
	revs     map[string]int64
}

// value is a ~200-byte JSON record value.
func value(g, i int) string {
	v := fmt.Sprintf(`{"execution_id":"exec-%04d-%04d","agent":"agent-%04d","status":"running","attempt":%d,"started_at":"2026-11-30T23:00:00Z","note":"`, g, i, g, i)
	return v + strings.Repeat("x", 196-len(v)) + `"}`
}

// run measures c goroutines committing batches of n puts for d; it returns
// batches/s and this process's CPU µs per batch (client and etcd server).
func run(cli *clientv3.Client, c, n int, d time.Duration) (float64, float64) {
	ctx := context.Background()
	tag := fmt.Sprintf("c%d-n%d", c, n)
	sw := make([]*swarm, c)
	for g := range sw {
		s := &swarm{lease: fmt.Sprintf("/swarm/%s-%d/meta/lease", tag, g), revs: map[string]int64{}}
		r, err := cli.Put(ctx, s.lease, `{"owner":"tick-1","epoch":1}`)
		if err != nil {
			log.Fatalf("lease: %v", err)
		}
		s.leaseRev = r.Header.Revision
		for i := range 64 {
			s.keys = append(s.keys, fmt.Sprintf("/swarm/%s-%d/executions/exec-%04d", tag, g, i))
		}
		sw[g] = s
	}
	var ops atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	batch := func(g, it int) {
		s := sw[g]
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.lease), "=", s.leaseRev)}
		var puts []clientv3.Op
		keys := make([]string, 0, n)
		for k := range n {
			key := s.keys[(it*n+k)%len(s.keys)]
			keys = append(keys, key)
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", s.revs[key]))
			puts = append(puts, clientv3.OpPut(key, value(g, it)))
		}
		r, err := cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			log.Fatalf("txn: %v", err)
		}
		if !r.Succeeded {
			log.Fatalf("txn did not commit (conc %d size %d)", c, n)
		}
		for _, k := range keys {
			s.revs[k] = r.Header.Revision
		}
	}
	// Warm up: every goroutine commits once, untimed.
	for g := range c {
		batch(g, 0)
	}
	cpu0 := processCPU()
	start := time.Now()
	for g := range c {
		wg.Go(func() {
			for it := 1; !stop.Load(); it++ {
				batch(g, it)
				ops.Add(1)
			}
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start)
	cpu := processCPU() - cpu0
	nb := float64(ops.Load())
	return nb / el.Seconds(), float64(cpu) / 1e3 / nb
}

func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func ints(s string) []int {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			log.Fatalf("bad number %q", f)
		}
		out = append(out, v)
	}
	return out
}

func mustURL(s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		log.Fatal(err)
	}
	return *u
}
