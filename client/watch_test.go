package client_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// fencedOn serves fenced over its own Store on addr ("127.0.0.1:0" for any
// port) and answers the address and a stop function (Shutdown within 5 s,
// then the Store closed), also run when the test ends.
func fencedOn(t *testing.T, srv *redistest.Server, addr string) (string, func()) {
	t.Helper()
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", srv.URL(), err)
	}
	var lis net.Listener
	for deadline := time.Now().Add(waitLimit); ; {
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the port of a stopped server may linger
	}
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := server.New(st, batch.DefaultLimits(), server.Options{Logger: slog.New(slog.DiscardHandler)})
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background(), lis) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve returned %v after Shutdown, want nil", err)
		}
		st.Close()
	}
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

func TestWatchResumesAcrossFencedAndRedisRestarts(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF())
	addr, stop := fencedOn(t, srv, "127.0.0.1:0")
	writer, err := client.Dial(addr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer writer.Close()
	watcher, err := client.Dial(addr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer watcher.Close()
	slug := newSlug(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var committed []int64
	put := func(i int) {
		t.Helper()
		// Retried: right after a restart, fenced or Redis may still be
		// coming back; the request id keeps a retry from committing twice.
		id := client.NewRequestID()
		for {
			rev, err := writer.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: "k" + strconv.Itoa(i%3), Expected: client.Blind, Value: []byte(strconv.Itoa(i))}}, client.WithRequestID(id))
			if err == nil {
				committed = append(committed, rev)
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("Batch %d: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	put(0)
	put(1)
	start := committed[1]
	got := make(chan client.Event, 100)
	errs := make(chan error, 1)
	go func() {
		for ev, err := range watcher.Watch(ctx, slug, start) {
			if err != nil {
				errs <- err
				return
			}
			got <- ev
		}
	}()
	var seen []int64
	expect := func(n int) {
		t.Helper()
		for len(seen) < n {
			select {
			case ev := <-got:
				seen = append(seen, ev.Revision)
			case err := <-errs:
				t.Fatalf("Watch ended: %v (saw %v)", err, seen)
			case <-ctx.Done():
				t.Fatalf("saw %v, want %v", seen, committed[2:])
			}
		}
	}
	for i := 2; i < 5; i++ {
		put(i)
	}
	expect(3)

	// fenced restarts on the same address: the stream is cut and reopened
	// from the last revision seen.
	stop()
	put2 := func(from, to int) {
		for i := from; i < to; i++ {
			put(i)
		}
	}
	_, stop = fencedOn(t, srv, addr)
	defer stop()
	put2(5, 8)
	expect(6)

	// Redis restarts (AOF): the swarm's reader reads on from where it was.
	srv.Restart(t)
	put2(8, 11)
	expect(9)

	if !slices.Equal(seen, committed[2:]) {
		t.Errorf("watcher from %d saw %v, want %v: every later batch, in order, none twice", start, seen, committed[2:])
	}
	select {
	case ev := <-got:
		t.Errorf("extra event %+v", ev)
	default:
	}
}

func TestWatchReportsCompactionAsTypedError(t *testing.T) {
	f := start(t)
	slug := newSlug(t)
	ctx := ctxT(t)
	revs, oldest := fencedtest.FillLogPastItsCap(t, f.redis, key(slug, "log"), func(i int) int64 {
		rev, err := f.c.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "journals", Key: "j", Expected: client.Blind, Value: []byte(strconv.Itoa(i))}})
		if err != nil {
			t.Fatalf("Batch: %v", err)
		}
		return rev
	})
	for _, err := range f.c.Watch(ctx, slug, revs[0]) {
		var ce *client.CompactedError
		if !errors.As(err, &ce) || !errors.Is(err, client.ErrRevisionCompacted) || ce.Oldest != revs[oldest] || ce.From != revs[0] {
			t.Fatalf("Watch(from %d) = %v, want *CompactedError{From: %d, Oldest: %d}", revs[0], err, revs[0], revs[oldest])
		}
		break
	}
	// The list-then-watch pattern: read, then watch from the snapshot.
	snap, err := f.c.Snapshot(ctx, slug, "journals")
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	next, err := f.c.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "journals", Key: "j", Expected: snap.Sections["journals"]["j"].Revision, Value: []byte(`"after"`)}})
	if err != nil {
		t.Fatalf("Batch: %v", err)
	}
	for ev, err := range f.c.Watch(ctx, slug, snap.Revision, client.WatchSections("journals")) {
		if err != nil {
			t.Fatalf("Watch(from snapshot %d): %v", snap.Revision, err)
		}
		if ev.Revision != next || len(ev.Changes) != 1 || string(ev.Changes[0].Record.Value) != `"after"` {
			t.Errorf("event = %+v, want revision %d putting journals/j = \"after\"", ev, next)
		}
		break
	}
}
