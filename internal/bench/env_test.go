package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const (
	fixture = "../../testdata/swarm-state.json"
	prefix  = engine.DefaultPrefix
	// parallelism is b.SetParallelism: goroutines per GOMAXPROCS. Enough
	// calls in flight to keep both Redis and the Go side busy on 2 cores.
	parallelism = 4
	// recordsPerG is how many distinct executions records each goroutine
	// writes, in turn; a multiple of every batch size.
	recordsPerG = 128
	// leaseOwner and leaseEpoch are the lease written by hand and named by
	// every batch's fence.
	leaseOwner = "tick-1"
	leaseEpoch = 1
	// leaseTTL keeps the lease live through any sensible -benchtime; it is
	// written again at the start of each benchmark.
	leaseTTL = time.Hour
	// loadChunk is the number of puts per batch when loading the fixture.
	loadChunk = 256
)

// sizes are the batch sizes benchmarked.
var sizes = []int{1, 8, 64}

// env is what every benchmark of the binary shares: one redis-server, one
// Store over it, and the fixture swarm loaded into it.
type env struct {
	srv *redistest.Server
	st  *store.Store
	// rec tells what st sends for a batch (commitCommand) and sends it
	// bare (callScript).
	rec  *recorder
	slug string
	// templates are the fixture's executions values, by key order.
	templates []template
	// change is the fixture record BenchmarkOneRecordChangeBytes rewrites.
	changeKey, changeValue string
	// executions are the fixture's executions keys, sorted (other
	// benchmarks add records of their own to the section).
	executions []string
}

type template struct {
	value, id, name string
}

var (
	envOnce   sync.Once
	sharedEnv *env
	// owner holds the cleanups of everything tied to the test binary rather
	// than to one benchmark; TestMain runs them.
	owner = &binaryTB{}
)

// TestMain runs the benchmarks, prints the summary table, then stops the
// shared redis-server.
func TestMain(m *testing.M) {
	code := m.Run()
	printSummary(os.Stdout)
	printMinimal(os.Stdout)
	owner.close()
	os.Exit(code)
}

// binaryTB hands redistest.Start a testing.TB whose TempDir and Cleanup live
// as long as the test binary, so that one redis-server serves every
// benchmark; failures still go to the benchmark that started it (the
// embedded TB), which is live while Start runs.
type binaryTB struct {
	testing.TB
	mu       sync.Mutex
	dirs     []string
	cleanups []func()
}

func (o *binaryTB) Helper() {}

func (o *binaryTB) TempDir() string {
	dir, err := os.MkdirTemp("", "fenced-bench-")
	if err != nil {
		o.TB.Fatalf("temp dir: %v", err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dirs = append(o.dirs, dir)
	return dir
}

func (o *binaryTB) Cleanup(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cleanups = append(o.cleanups, f)
}

func (o *binaryTB) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := len(o.cleanups) - 1; i >= 0; i-- {
		o.cleanups[i]()
	}
	for _, d := range o.dirs {
		os.RemoveAll(d)
	}
}

// getEnv returns the shared env, starting Redis and loading the fixture on
// first use, and writes the lease afresh.
func getEnv(b *testing.B) *env {
	b.Helper()
	envOnce.Do(func() {
		owner.TB = b
		sharedEnv = newEnv(b)
	})
	if sharedEnv == nil {
		b.Fatal("shared benchmark setup failed earlier")
	}
	sharedEnv.setLease(b)
	return sharedEnv
}

func newEnv(b *testing.B) *env {
	raw, err := os.ReadFile(fixture)
	if err != nil {
		b.Fatalf("read fixture: %v", err)
	}
	var fx struct {
		Slug     string                                `json:"slug"`
		Sections map[string]map[string]json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		b.Fatalf("decode fixture: %v", err)
	}
	e := &env{srv: redistest.Start(owner), slug: fx.Slug}
	e.st, err = store.Open(e.srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		b.Fatalf("store.Open: %v", err)
	}
	owner.Cleanup(e.st.Close)
	if e.rec, err = newRecorder(e.srv.URL()); err != nil {
		b.Fatalf("recorder: %v", err)
	}
	owner.Cleanup(e.rec.st.Close)

	// Load the fixture, section by section, in blind unfenced batches.
	limits := batch.DefaultLimits()
	ctx := context.Background()
	for _, section := range slices.Sorted(maps.Keys(fx.Sections)) {
		recs := fx.Sections[section]
		keys := slices.Sorted(maps.Keys(recs))
		for start := 0; start < len(keys); start += loadChunk {
			bt := &batch.Batch{Slug: e.slug}
			for _, k := range keys[start:min(start+loadChunk, len(keys))] {
				bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: section, Key: k, Expected: batch.Blind, Value: string(recs[k])})
			}
			if err := limits.CheckBatch(bt); err != nil {
				b.Fatalf("load %s: %v", section, err)
			}
			if _, err := e.st.Commit(ctx, bt); err != nil {
				b.Fatalf("load %s: %v", section, err)
			}
		}
	}

	execs := fx.Sections["executions"]
	for _, k := range slices.Sorted(maps.Keys(execs)) {
		var v struct {
			ID   string `json:"execution_id"`
			Name string `json:"name"`
		}
		if err := json.Unmarshal(execs[k], &v); err != nil || v.ID == "" || v.Name == "" {
			b.Fatalf("fixture executions/%s: no execution_id or name (%v)", k, err)
		}
		e.templates = append(e.templates, template{value: string(execs[k]), id: v.ID, name: v.Name})
		e.executions = append(e.executions, k)
		if e.changeKey == "" {
			e.changeKey, e.changeValue = k, string(execs[k])
		}
	}
	return e
}

// setLease writes meta/lease by hand, as the lease service will: owner
// leaseOwner, epoch leaseEpoch, expiring leaseTTL after Redis's clock.
func (e *env) setLease(b *testing.B) {
	b.Helper()
	tm := e.srv.DoArray(b, "TIME")
	if len(tm) != 2 {
		b.Fatalf("TIME answered %q", tm)
	}
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	expires := sec*1000 + usec/1000 + leaseTTL.Milliseconds()
	lease := fmt.Sprintf(`{"r":1,"v":{"owner":%q,"epoch":%d,"expires_at":%d}}`, leaseOwner, leaseEpoch, expires)
	e.srv.Do(b, "HSET", prefix+":swarm:{"+e.slug+"}:fence:meta", "lease", lease)
}

// fence is the fence every benchmark batch carries.
func fence() *batch.Fence { return &batch.Fence{Owner: leaseOwner, Epoch: leaseEpoch} }

// record is goroutine g's j-th executions record: its own execution id (36
// bytes, like the fixture's) and agent name, in a fixture value.
func (e *env) record(g, j int) (key, value string) {
	t := e.templates[(g*recordsPerG+j)%len(e.templates)]
	key = fmt.Sprintf("exe-%016x%016x", 0xbe7c000+g, j)
	name := fmt.Sprintf("benchgo-%06d-%04d", g, j)
	v := strings.Replace(t.value, `"execution_id":"`+t.id+`"`, `"execution_id":"`+key+`"`, 1)
	v = strings.Replace(v, `"name":"`+t.name+`"`, `"name":"`+name+`"`, 1)
	return key, v
}

// workload is the batches of one size for each of nG goroutines:
// batches[g][slot], slot < recordsPerG/size; batch i of goroutine g is
// batches[g][i%len(batches[g])]. Every batch is valid and fenced.
func (e *env) workload(b *testing.B, size, nG int) [][]*batch.Batch {
	b.Helper()
	limits := batch.DefaultLimits()
	out := make([][]*batch.Batch, nG)
	for g := range out {
		for slot := 0; slot < recordsPerG/size; slot++ {
			bt := &batch.Batch{Slug: e.slug, Fence: fence()}
			for j := slot * size; j < (slot+1)*size; j++ {
				k, v := e.record(g, j)
				bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: "executions", Key: k, Expected: batch.Blind, Value: v})
			}
			if err := limits.CheckBatch(bt); err != nil {
				b.Fatalf("workload batch: %v", err)
			}
			out[g] = append(out[g], bt)
		}
	}
	return out
}

// toProto is the request a client sends for bt.
func toProto(bt *batch.Batch) *fencedv1.FencedBatchRequest {
	req := &fencedv1.FencedBatchRequest{Slug: bt.Slug}
	for _, w := range bt.Writes {
		req.Writes = append(req.Writes, &fencedv1.RecordWrite{
			Kind:     fencedv1.WriteKind(w.Kind),
			Section:  w.Section,
			Key:      w.Key,
			Expected: w.Expected,
			Value:    w.Value,
		})
	}
	if f := bt.Fence; f != nil {
		req.Fence = &fencedv1.LeaseFence{Owner: f.Owner, Epoch: f.Epoch, NowMs: f.NowMs}
	}
	return req
}

// bareForwarder is (b): FencedBatch forwarded to the store and nothing
// else; no validation, no interceptors, every error INTERNAL.
type bareForwarder struct {
	fencedv1.UnimplementedRecordsServiceServer
	st *store.Store
}

func (f *bareForwarder) FencedBatch(ctx context.Context, req *fencedv1.FencedBatchRequest) (*fencedv1.FencedBatchResponse, error) {
	rev, err := f.st.Commit(ctx, server.BatchFromProto(req))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &fencedv1.FencedBatchResponse{Revision: rev}, nil
}

// listen opens 127.0.0.1:0.
func listen(b *testing.B) net.Listener {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatalf("listen: %v", err)
	}
	return lis
}

// dial returns a RecordsService client of addr; every benchmark dials the
// same way. The connection is closed when b ends.
func dial(b *testing.B, addr string) fencedv1.RecordsServiceClient {
	b.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatalf("dial %s: %v", addr, err)
	}
	b.Cleanup(func() { cc.Close() })
	return fencedv1.NewRecordsServiceClient(cc)
}

// startBare serves (b) until b ends and returns a client of it.
func startBare(b *testing.B, e *env) fencedv1.RecordsServiceClient {
	b.Helper()
	lis := listen(b)
	gs := grpc.NewServer()
	fencedv1.RegisterRecordsServiceServer(gs, &bareForwarder{st: e.st})
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(lis)
	}()
	b.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return dial(b, lis.Addr().String())
}

// startFenced serves (c), fenced's own server, until b ends and returns a
// client of it. The logger is a production one (Info, JSON), writing
// nowhere: successful calls log at Debug and are dropped, as in production.
func startFenced(b *testing.B, e *env) fencedv1.RecordsServiceClient {
	b.Helper()
	logger := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return dial(b, fencedtest.Serve(b, e.st, fencedtest.Config{Options: server.Options{Logger: logger}}).Addr)
}
