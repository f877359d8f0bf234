package client_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// prefix is the key prefix of every test store (docs/design/02-redis-layout.md §2.1).
const prefix = fencedtest.Prefix

// waitLimit bounds every wait for an event (a lease expiring, a keeper
// noticing a takeover). It is a failure bound, never a measurement.
const waitLimit = 15 * time.Second

// fixture is a real redis-server, an in-process fenced server over it on a
// loopback port, and a client dialled to that server.
type fixture struct {
	redis *redistest.Server
	addr  string
	c     *client.Client
}

// start starts redis-server, fenced (fencedtest.Start: default limits and
// lease bounds) and a client; all are stopped when the test ends.
func start(t *testing.T) *fixture {
	t.Helper()
	return startOn(t, redistest.Start(t))
}

// redisTimeout is the Redis timeout of the fixture's store, and its
// connections' write timeout (rueidis cuts a connection whose replies are
// that late: 5 s by default, store.ClientOptions): longer than any call's
// deadline (waitLimit), so that a Redis slowed by a busy box never answers
// a test UNAVAILABLE (the default Redis timeout is 3 s). startOn's options
// may set another Redis timeout.
const redisTimeout = 2 * waitLimit

// startOn is start over a Redis the test already runs (a primary with
// replicas, say), with the store options given (after redisTimeout).
func startOn(t *testing.T, srv *redistest.Server, opts ...func(*store.Options)) *fixture {
	t.Helper()
	url := srv.URL() + "?write_timeout=" + redisTimeout.String()
	o := store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout}}
	for _, opt := range opts {
		opt(&o)
	}
	st, err := store.Open(url, o)
	if err != nil {
		t.Fatalf("store.Open(%s): %v", url, err)
	}
	t.Cleanup(st.Close)
	f := &fixture{redis: srv, addr: fencedtest.Serve(t, st, fencedtest.Config{}).Addr}
	f.c = f.dial(t)
	return f
}

// dial returns another client of the fixture's server, closed when the test
// ends.
func (f *fixture) dial(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.Dial(f.addr)
	if err != nil {
		t.Fatalf("client.Dial(%s): %v", f.addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// raw returns the generated LeaseService client over a fresh connection,
// for requests the typed client cannot express (a TTL of 2^53 ms does not
// fit a time.Duration).
func (f *fixture) raw(t *testing.T) fencedv1.LeaseServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", f.addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return fencedv1.NewLeaseServiceClient(conn)
}

// key is the Redis key of one of a swarm's hashes, strings or streams.
func key(slug, name string) string { return prefix + ":swarm:{" + slug + "}:fence:" + name }

var slugs atomic.Int64

// newSlug returns a slug no other test of this run uses.
func newSlug(t *testing.T) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	if len(name) > 100 {
		name = name[:100]
	}
	return "s" + strconv.FormatInt(slugs.Add(1), 10) + "-" + name
}

// ctxT is a context bounded by waitLimit, cancelled when the test ends.
func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// logEntry is one entry of a swarm's log stream.
type logEntry struct {
	id        string
	revision  int64
	owner     string
	records   int64
	requestID string
}

// log reads a swarm's whole log stream (XRANGE - +) straight from Redis.
func (f *fixture) log(t *testing.T, slug string) []logEntry {
	t.Helper()
	rc := f.redis.Client(t)
	entries, err := rc.Do(context.Background(), rc.B().Xrange().Key(key(slug, "log")).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", key(slug, "log"), err)
	}
	var out []logEntry
	for _, entry := range entries {
		e := logEntry{id: entry.ID}
		for field, v := range entry.FieldValues {
			switch field {
			case "revision":
				e.revision = mustInt(t, v)
			case "owner":
				e.owner = v
			case "records":
				e.records = mustInt(t, v)
			case "request_id":
				e.requestID = v
			case "changes", "sections", "prev": // what Watch reads
			default:
				t.Fatalf("XRANGE %s: entry %s has field %q", key(slug, "log"), e.id, field)
			}
		}
		out = append(out, e)
	}
	return out
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q is not an integer: %v", s, err)
	}
	return n
}

// revision reads the swarm revision through Current.
func (f *fixture) revision(t *testing.T, slug string) int64 {
	t.Helper()
	_, _, _, rev, err := f.c.Current(ctxT(t), slug)
	if err != nil {
		t.Fatalf("Current(%s): %v", slug, err)
	}
	return rev
}

// redisNowMs is Redis's clock (TIME) in ms.
func (f *fixture) redisNowMs(t *testing.T) int64 {
	t.Helper()
	tm := f.redis.DoArray(t, "TIME")
	if len(tm) != 2 {
		t.Fatalf("TIME = %q, want two fields", tm)
	}
	return mustInt(t, tm[0])*1000 + mustInt(t, tm[1])/1000
}

// waitExpired polls Current until the swarm's lease is no longer live by
// Redis's clock, and returns the expired lease.
func (f *fixture) waitExpired(t *testing.T, slug string) client.Lease {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		l, live, _, _, err := f.c.Current(ctxT(t), slug)
		if err != nil {
			t.Fatalf("Current(%s): %v", slug, err)
		}
		if l == nil {
			t.Fatalf("Current(%s): no lease, want an expired one", slug)
		}
		if !live {
			return *l
		}
		if time.Now().After(deadline) {
			t.Fatalf("Current(%s): lease %+v still live after %v", slug, *l, waitLimit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
