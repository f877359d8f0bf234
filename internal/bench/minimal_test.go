package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/metrics"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The minimal path (d) and its comparison with fenced (c'), both at a fixed
// number of client goroutines, each goroutine one swarm holding a lease and
// committing batches of n puts of ~200-byte JSON values at the revisions it
// last saw (every batch commits), and with etcd (e, bench/etcd, read from
// the file FENCED_BENCH_ETCD names when `make bench` ran it first).

// minimalConcs are the client goroutine counts of BenchmarkMinimal.
var minimalConcs = []int{16, 64}

// minimalRecords is how many records each swarm cycles through; a multiple
// of every batch size.
const minimalRecords = 64

// minimalSection is the section fenced's side writes: not executions, so
// that no by-name upkeep runs (the prototype has none).
const minimalSection = "intents"

// minimalScript does what a fenced batch must at minimum: read the lease
// and compare owner, epoch and expiry with Redis TIME, HGET and compare
// each record's revision, INCR the counter, HSET each record as
// {"r":N,"v":...}, XADD one log entry. KEYS: lease hash, records hash,
// counter, log. ARGV: owner, epoch, then field, expected, value per put.
const minimalScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local l = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'expires')
if l[1] ~= ARGV[1] or l[2] ~= ARGV[2] or not l[3] or tonumber(l[3]) <= now then
  return redis.error_reply('STALE lease')
end
local n = (#ARGV - 2) / 3
for i = 0, n - 1 do
  local f, exp = ARGV[3 + 3 * i], ARGV[4 + 3 * i]
  local cur = redis.call('HGET', KEYS[2], f)
  local r = '0'
  if cur then r = string.match(cur, '^{"r":(%d+)') end
  if r ~= exp then return redis.error_reply('CONFLICT ' .. f) end
end
local rev = tostring(redis.call('INCR', KEYS[3]))
local hs = {}
for i = 0, n - 1 do
  hs[#hs + 1] = ARGV[3 + 3 * i]
  hs[#hs + 1] = '{"r":' .. rev .. ',"v":' .. ARGV[5 + 3 * i] .. '}'
end
redis.call('HSET', KEYS[2], unpack(hs))
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000', '*', 'rev', rev, 'n', tostring(n))
return rev
`

// rawCodec passes messages through as bytes: the prototype's requests and
// replies are *[]byte.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

// minimalServer is the prototype's server: unary methods whose request is
// "slug\x00owner\x00epoch(\x00field\x00expected\x00value)*", answered
// with the committed revision in decimal: Commit runs minimalScript on the
// prototype's keys, CommitFloor floorScript on fenced's (the floor path:
// the thinnest service that writes fenced's bytes).
type minimalServer struct {
	rdb    rueidis.Client
	script *rueidis.Lua
	floor  *rueidis.Lua
}

func (m *minimalServer) commit(ctx context.Context, req []byte, floor bool) ([]byte, error) {
	parts := bytes.Split(req, []byte{0})
	slug := string(parts[0])
	keys := []string{"min:{" + slug + "}:lease", "min:{" + slug + "}:records", "min:{" + slug + "}:rev", "min:{" + slug + "}:log"}
	args := make([]string, 0, len(parts)+1)
	script := m.script
	if floor {
		keys = floorKeys(slug)
		args = append(args, string(parts[1]), string(parts[2]), minimalSection, slug)
		parts = parts[3:]
		script = m.floor
	} else {
		parts = parts[1:]
	}
	for _, p := range parts {
		args = append(args, string(p))
	}
	rev, err := script.Exec(ctx, m.rdb, keys, args).ToString()
	if err != nil {
		return nil, err
	}
	return []byte(rev), nil
}

var minimalDesc = grpc.ServiceDesc{
	ServiceName: "bench.Minimal",
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{minimalMethod("Commit", false), minimalMethod("CommitFloor", true)},
}

func minimalMethod(name string, floor bool) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var req []byte
			if err := dec(&req); err != nil {
				return nil, err
			}
			out, err := srv.(*minimalServer).commit(ctx, req, floor)
			if err != nil {
				return nil, err
			}
			return &out, nil
		},
	}
}

// startMinimal serves the prototype until b ends; it returns a connection
// to it.
func startMinimal(b *testing.B, e *env) *grpc.ClientConn {
	b.Helper()
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{e.srv.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatalf("minimal: rueidis: %v", err)
	}
	lis := listen(b)
	gs := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	gs.RegisterService(&minimalDesc, &minimalServer{rdb: rdb, script: rueidis.NewLuaScript(minimalScript), floor: rueidis.NewLuaScript(floorScript)})
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(lis)
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		b.Fatalf("minimal: dial: %v", err)
	}
	b.Cleanup(func() {
		cc.Close()
		gs.Stop()
		<-done
		rdb.Close()
	})
	return cc
}

// startDeployed serves fenced as `fenced serve` deploys it by default:
// metrics on (store observer and interceptors, whose exemplars read a
// caller's traceparent), authorization off, no trace exporter (then
// cmd/fenced installs no stats handler), the production logger (Info,
// JSON). It has a Store of its own, over the shared Redis, so that the
// store reports to the metrics.
func startDeployed(b *testing.B, e *env, o engine.Options) fencedv1.RecordsServiceClient {
	b.Helper()
	m := metrics.New()
	o.Prefix, o.Observer = prefix, m
	st, err := store.Open(e.srv.URL(), store.Options{Engine: o})
	if err != nil {
		b.Fatalf("store.Open: %v", err)
	}
	b.Cleanup(st.Close)
	logger := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	tel := server.Telemetry{Unary: m.UnaryInterceptor(), Stream: m.StreamInterceptor(), Ready: m.SetReady, Limits: m}
	f := fencedtest.Serve(b, st, fencedtest.Config{Options: server.Options{Logger: logger, Telemetry: tel}})
	m.GRPC.InitializeMetrics(f.Server)
	return f.Records
}

// minimalValue is goroutine g's ~200-byte JSON value for its i-th batch.
func minimalValue(g, i int) string {
	v := fmt.Sprintf(`{"execution_id":"exec-%04d-%06d","agent":"agent-%04d","status":"running","attempt":%d,"started_at":"2026-11-30T23:00:00Z","note":"`, g, i%1000000, g, i)
	return v + strings.Repeat("x", max(0, 196-len(v))) + `"}`
}

// swarmWriter is one client goroutine: its swarm, its lease's epoch and
// the revision it last saw of each of its records (0: absent).
type swarmWriter struct {
	slug  string
	epoch int64
	seen  [minimalRecords]int64
	next  int // batches sent
}

// minimalCase is one (concurrency, batch size) of BenchmarkMinimal: the
// swarms of both sides, kept across rounds.
type minimalCase struct {
	conc, size                int
	min, floor, fenced, alone []*swarmWriter
	minConn                   *grpc.ClientConn
	fencedClient, aloneClient fencedv1.RecordsServiceClient
}

func newMinimalCase(b *testing.B, e *env, cc *grpc.ClientConn, fc, ac fencedv1.RecordsServiceClient, conc, size int) *minimalCase {
	b.Helper()
	c := &minimalCase{conc: conc, size: size, minConn: cc, fencedClient: fc, aloneClient: ac}
	ctx := context.Background()
	tm := e.srv.DoArray(b, "TIME")
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	expires := strconv.FormatInt((sec+3600)*1000, 10)
	for g := range conc {
		slug := fmt.Sprintf("min-c%d-n%d-g%d", conc, size, g)
		e.srv.Do(b, "HSET", "min:{"+slug+"}:lease", "owner", leaseOwner, "epoch", "1", "expires", expires)
		c.min = append(c.min, &swarmWriter{slug: slug, epoch: 1})
		floorSlug := fmt.Sprintf("floor-c%d-n%d-g%d", conc, size, g)
		setFloorMeta(b, e.srv, floorSlug, expires)
		c.floor = append(c.floor, &swarmWriter{slug: floorSlug, epoch: 1})
		fslug := fmt.Sprintf("perf-c%d-n%d-g%d", conc, size, g)
		l, _, err := e.st.Acquire(ctx, fslug, leaseOwner, time.Hour.Milliseconds())
		if err != nil {
			b.Fatalf("acquire %s: %v", fslug, err)
		}
		c.fenced = append(c.fenced, &swarmWriter{slug: fslug, epoch: l.Epoch})
		aslug := fmt.Sprintf("alone-c%d-n%d-g%d", conc, size, g)
		l, _, err = e.st.Acquire(ctx, aslug, leaseOwner, time.Hour.Milliseconds())
		if err != nil {
			b.Fatalf("acquire %s: %v", aslug, err)
		}
		c.alone = append(c.alone, &swarmWriter{slug: aslug, epoch: l.Epoch})
	}
	return c
}

// minimalCall sends w's next batch through the prototype.
func (c *minimalCase) minimalCall(ctx context.Context, g int) error {
	return c.rawCall(ctx, c.min[g], g, "/bench.Minimal/Commit")
}

// floorCall sends w's next batch through the floor path.
func (c *minimalCase) floorCall(ctx context.Context, g int) error {
	return c.rawCall(ctx, c.floor[g], g, "/bench.Minimal/CommitFloor")
}

// rawCall sends w's next batch to the prototype's server's method.
func (c *minimalCase) rawCall(ctx context.Context, w *swarmWriter, g int, method string) error {
	first := (w.next * c.size) % minimalRecords
	var buf bytes.Buffer
	buf.WriteString(w.slug)
	buf.WriteString("\x00" + leaseOwner + "\x00" + strconv.FormatInt(w.epoch, 10))
	for j := first; j < first+c.size; j++ {
		fmt.Fprintf(&buf, "\x00r%04d\x00%d\x00%s", j, w.seen[j], minimalValue(g, w.next))
	}
	req, reply := buf.Bytes(), []byte(nil)
	if err := c.minConn.Invoke(ctx, method, &req, &reply); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	rev, err := strconv.ParseInt(string(reply), 10, 64)
	if err != nil {
		return fmt.Errorf("%s reply %q: %w", method, reply, err)
	}
	for j := first; j < first+c.size; j++ {
		w.seen[j] = rev
	}
	w.next++
	return nil
}

// fencedCall sends w's next batch through fenced.
func (c *minimalCase) fencedCall(ctx context.Context, g int) error {
	return c.fencedVia(ctx, c.fencedClient, c.fenced[g], g)
}

// aloneCall sends w's next batch through fenced without group commit.
func (c *minimalCase) aloneCall(ctx context.Context, g int) error {
	return c.fencedVia(ctx, c.aloneClient, c.alone[g], g)
}

func (c *minimalCase) fencedVia(ctx context.Context, client fencedv1.RecordsServiceClient, w *swarmWriter, g int) error {
	first := (w.next * c.size) % minimalRecords
	req := &fencedv1.FencedBatchRequest{Slug: w.slug, Fence: &fencedv1.LeaseFence{Owner: leaseOwner, Epoch: w.epoch}}
	for j := first; j < first+c.size; j++ {
		req.Writes = append(req.Writes, &fencedv1.RecordWrite{
			Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: minimalSection, Key: fmt.Sprintf("r%04d", j),
			Expected: w.seen[j], Value: minimalValue(g, w.next),
		})
	}
	resp, err := client.FencedBatch(ctx, req)
	if err != nil {
		return fmt.Errorf("fenced: %w", err)
	}
	for j := first; j < first+c.size; j++ {
		w.seen[j] = resp.GetRevision()
	}
	w.next++
	return nil
}

// minimalSample is one round of one side: per batch, wall time (with conc
// batches in flight), CPU of this process and of redis-server, and Redis's
// script time per batch (INFO commandstats usec of EVALSHA, EVAL and FCALL,
// reset before the round, over the round's batches: a group commit is one
// call for several batches).
type minimalSample struct {
	sample
	redisUs float64
}

// round runs call on c.conc goroutines for roundTime.
func (c *minimalCase) round(ctx context.Context, b *testing.B, e *env, call func(context.Context, int) error) minimalSample {
	e.srv.Do(b, "CONFIG", "RESETSTAT")
	var ops atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	var errOnce sync.Once
	var first error
	from := e.cpuNow(b, true)
	start := time.Now()
	for g := range c.conc {
		wg.Go(func() {
			for !stop.Load() {
				if err := call(ctx, g); err != nil {
					errOnce.Do(func() { first = err })
					stop.Store(true)
					return
				}
				ops.Add(1)
			}
		})
	}
	time.Sleep(roundTime)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	to := e.cpuNow(b, false)
	if first != nil {
		b.Fatalf("conc=%d size=%d: %v", c.conc, c.size, first)
	}
	usec, _ := scriptUsec(b, e.srv)
	return minimalSample{perBatch(from, to, elapsed.Nanoseconds(), int(ops.Load())), usec / float64(max(ops.Load(), 1))}
}

// minimalResults are BenchmarkMinimal's rounds: [case] -> rounds of
// [prototype, fenced, floor path].
var minimalResults = struct {
	sync.Mutex
	rounds map[[2]int][][4]minimalSample
}{rounds: map[[2]int][][4]minimalSample{}}

// BenchmarkMinimal compares fenced, deployed as by default (metrics on,
// authorization and tracing off), with the thinnest service that does a
// fenced batch's work: a grpc-go unary handler with a raw-bytes codec
// calling rueidis EVALSHA of minimalScript, and with the floor path: the
// same server running floorScript, the plainest Lua that writes fenced's
// bytes (what is left between it and fenced is fenced's own cost; between
// it and the prototype, the cost of the bytes fenced documents). Each
// iteration runs one round (roundTime) of each, in rotating order, at
// every concurrency (minimalConcs, each goroutine one swarm) and batch
// size; the summary
// reports the medians and the ratios paired per round, with etcd's figures
// when FENCED_BENCH_ETCD names bench/etcd's output.
func BenchmarkMinimal(b *testing.B) {
	e := getEnv(b)
	cc, fc, ac := startMinimal(b, e), startDeployed(b, e, engine.Options{}), startDeployed(b, e, engine.Options{NoGroupCommit: true})
	for _, conc := range minimalConcs {
		for _, size := range sizes {
			c := newMinimalCase(b, e, cc, fc, ac, conc, size)
			b.Run(fmt.Sprintf("conc=%d/size=%d", conc, size), func(b *testing.B) {
				ctx := context.Background()
				var ratios []float64
				for it := range b.N {
					var r [4]minimalSample
					calls := [4]func(context.Context, int) error{c.minimalCall, c.fencedCall, c.floorCall, c.aloneCall}
					for k := range 4 {
						side := (it + k) % 4
						r[side] = c.round(ctx, b, e, calls[side])
					}
					ratios = append(ratios, r[0].ns/r[1].ns)
					minimalResults.Lock()
					minimalResults.rounds[[2]int{conc, size}] = append(minimalResults.rounds[[2]int{conc, size}], r)
					minimalResults.Unlock()
				}
				b.ReportMetric(median(ratios), "fenced/minimal")
			})
		}
	}
}

// etcdFigures reads bench/etcd's lines from the file FENCED_BENCH_ETCD
// names: [conc, size] -> batches/s, CPU µs per batch.
func etcdFigures() map[[2]int][2]float64 {
	out := map[[2]int][2]float64{}
	name := os.Getenv("FENCED_BENCH_ETCD")
	if name == "" {
		return out
	}
	f, err := os.Open(name)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var conc, size int
		var rate, cpu float64
		if _, err := fmt.Sscanf(sc.Text(), "etcd conc=%d size=%d batches_per_s=%g cpu_us_per_batch=%g", &conc, &size, &rate, &cpu); err == nil {
			out[[2]int{conc, size}] = [2]float64{rate, cpu}
		}
	}
	return out
}

// printMinimal writes BenchmarkMinimal's table, when it ran.
func printMinimal(w io.Writer) {
	minimalResults.Lock()
	defer minimalResults.Unlock()
	if len(minimalResults.rounds) == 0 {
		return
	}
	etcd := etcdFigures()
	var buf bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&buf, format, args...) }
	p("\nfenced vs the minimal gRPC→Lua→Redis path vs etcd 3.6 Txn (fsync): each goroutine one swarm holding a lease, ~200-byte values, every batch commits\n")
	p("  batches/s (medians of %v rounds, the three sides in rotating order); fenced/min = median of paired ratios; targets: fenced/min >= 0.85, fenced/etcd >= 1.5, Redis µs fenced/min <= 1.3\n", roundTime)
	p("  floor: the prototype's server running floorScript, the plainest Lua writing fenced's bytes (floor/min, fenced/floor: medians of paired ratios)\n")
	p("  alone: fenced without group commit (store.WithoutGroupCommit), its own server on the same Redis; grp/alone: median of paired ratios\n")
	p("%-8s %6s %9s %9s %9s %9s %11s %14s %16s %9s %7s %9s %12s %10s %8s %9s %14s\n", "conc×n", "rounds", "minimal", "fenced", "fenced/min", "etcd", "fenced/etcd", "redis µs m/f", "go cpu µs m/f/e", "rds µs m/f",
		"floor", "floor/min", "fenced/floor", "redis µs fl", "alone", "grp/alone", "redis/rds µs a")
	for _, conc := range minimalConcs {
		for _, size := range sizes {
			rs := minimalResults.rounds[[2]int{conc, size}]
			if len(rs) == 0 {
				continue
			}
			var mns, fns, mus, fus, mgo, fgo, mr, fr, ratio, lns, lus, lRatio, flRatio, ans, aus, ar, gaRatio []float64
			for _, r := range rs {
				ans, aus, ar = append(ans, r[3].ns), append(aus, r[3].redisUs), append(ar, r[3].redisCPU)
				gaRatio = append(gaRatio, r[3].ns/r[1].ns)
				lns, lus = append(lns, r[2].ns), append(lus, r[2].redisUs)
				lRatio, flRatio = append(lRatio, r[0].ns/r[2].ns), append(flRatio, r[2].ns/r[1].ns)
				mns, fns = append(mns, r[0].ns), append(fns, r[1].ns)
				mus, fus = append(mus, r[0].redisUs), append(fus, r[1].redisUs)
				mgo, fgo = append(mgo, r[0].goCPU), append(fgo, r[1].goCPU)
				mr, fr = append(mr, r[0].redisCPU), append(fr, r[1].redisCPU)
				ratio = append(ratio, r[0].ns/r[1].ns)
			}
			mRate, fRate := 1e9/median(mns), 1e9/median(fns)
			et := etcd[[2]int{conc, size}]
			etcdRate, fe, ecpu := "-", "-", "-"
			if et[0] > 0 {
				etcdRate, fe, ecpu = fmt.Sprintf("%.0f", et[0]), fmt.Sprintf("%.2f", fRate/et[0]), fmt.Sprintf("%.0f", et[1])
			}
			goCPU := fmt.Sprintf("%.0f/%.0f/%s", median(mgo)/1e3, median(fgo)/1e3, ecpu)
			p("%-8s %6d %9.0f %9.0f %9.2f %9s %11s %7.0f/%-6.0f %16s %4.0f/%-4.0f %7.0f %9.2f %12.2f %10.0f %8.0f %9.2f %7.0f/%-6.0f\n",
				fmt.Sprintf("%d×%d", conc, size), len(rs), mRate, fRate, median(ratio), etcdRate, fe,
				median(mus), median(fus), goCPU, median(mr)/1e3, median(fr)/1e3,
				1e9/median(lns), median(lRatio), median(flRatio), median(lus),
				1e9/median(ans), median(gaRatio), median(aus), median(ar)/1e3)
		}
	}
	p("  redis µs: Redis's script time per batch (INFO commandstats usec of EVALSHA, EVAL and FCALL ÷ batches); go cpu: this process (client + server) per batch, e = etcd's process (client + server);\n")
	p("  rds: redis-server CPU per batch. etcd figures come from bench/etcd run just before (FENCED_BENCH_ETCD).\n")
	w.Write(buf.Bytes())
}
