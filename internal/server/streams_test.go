package server_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// TestStreamSectionsSendsAnySnapshotInMessagesOfAtMostOneMebibyte: five
// 1 MB executions records stored in the in-house writers' form, which
// Sections refuses for their size, come over StreamSections byte for byte,
// every message within StreamMessageBytes of keys and values, a value over
// it in parts, and one end with the revision and section revisions.
func TestStreamSectionsSendsAnySnapshotInMessagesOfAtMostOneMebibyte(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	ctx := ctxT(t)
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: "big", Writes: []*fencedv1.RecordWrite{put("claims", "T-1", 0, `1`)}})
	want := map[string]string{"huge": `"` + strings.Repeat("ü", 800_000) + `"`}
	for i := range 5 {
		want[fmt.Sprintf("exe-%d", i)] = fmt.Sprintf(`{"name": "a%d", "score": NaN, "log": "%s"}`, i, strings.Repeat("x", 1<<20))
	}
	for k, v := range want {
		srv.Do(t, "HSET", redisKey("big", "executions"), k, fmt.Sprintf(`{"r": %d, "v": %s}`, rev, v))
	}
	if _, err := e.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: "big", Names: []string{"executions"}}); decode(t, err).code != codes.ResourceExhausted {
		t.Fatalf("Sections(executions) = %v; want RESOURCE_EXHAUSTED", err)
	}
	stream, err := e.records.StreamSections(ctx, &fencedv1.StreamSectionsRequest{Slug: "big", Names: []string{"executions", "claims"}})
	if err != nil {
		t.Fatal(err)
	}
	got, parts, messages := map[string]string{}, map[string]int{}, 0
	var end *fencedv1.SnapshotEnd
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if end != nil {
			t.Fatal("a message after the end")
		}
		messages++
		if size := proto.Size(resp); size > server.StreamMessageBytes+4096 {
			t.Errorf("message %d is %d bytes; want at most %d and framing", messages, size, server.StreamMessageBytes)
		}
		for _, r := range resp.GetRecords() {
			got[r.GetSection()+"/"+r.GetKey()] += r.GetRecord().GetValue()
			parts[r.GetKey()]++
		}
		end = resp.GetEnd()
	}
	if end == nil || end.GetRevision() != rev || len(end.GetSectionRevisions()) != 2 {
		t.Fatalf("end = %v; want revision %d and both sections' revisions", end, rev)
	}
	for k, v := range want {
		if got["executions/"+k] != v {
			t.Errorf("executions/%s = %d bytes; want the %d stored byte for byte", k, len(got["executions/"+k]), len(v))
		}
	}
	if got["claims/T-1"] != "1" || parts["huge"] != 2 || messages < 6 {
		t.Errorf("claims/T-1 %q, huge in %d parts, %d messages; want 1, 2 parts, at least 6 messages", got["claims/T-1"], parts["huge"], messages)
	}
}

// blockedStreams is a core whose StreamSections waits for release (after
// saying it entered), so that streams stay open.
type blockedStreams struct {
	*store.Store
	entered chan struct{}
	release chan struct{}
}

func (b blockedStreams) StreamSections(ctx context.Context, slug string, names []string, turn batch.Turn, sink batch.SnapshotSink) error {
	b.entered <- struct{}{}
	<-b.release
	return b.Store.StreamSections(ctx, slug, names, turn, sink)
}

// TestStreamSectionsOverItsCallersStreamsIsRefusedWithARetryDelay: with
// --max-section-streams-per-caller streams of one caller open, its next
// StreamSections is RESOURCE_EXHAUSTED TOO_MANY_SECTION_STREAMS (limit
// caller) with a RetryInfo, and reads nothing; once one ends, it reads.
func TestStreamSectionsOverItsCallersStreamsIsRefusedWithARetryDelay(t *testing.T) {
	srv := redistest.Start(t)
	core := blockedStreams{Store: openStore(t, srv), entered: make(chan struct{}, 4), release: make(chan struct{})}
	e := serve(t, core, batch.DefaultLimits(), server.Options{HealthInterval: noProbes,
		Records: server.ServiceOptions{SectionStreams: server.SectionStreamOptions{Max: 8, MaxPerCaller: 2}}})
	ctx := ctxT(t)
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "s", Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, `1`)}})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream, err := e.records.StreamSections(ctx, &fencedv1.StreamSectionsRequest{Slug: "s", Names: []string{"claims"}})
			if err == nil {
				for err == nil {
					_, err = stream.Recv()
				}
			}
			if err != io.EOF {
				t.Errorf("a held stream ended with %v; want its snapshot", err)
			}
		}()
		<-core.entered
	}
	stream, err := e.records.StreamSections(ctx, &fencedv1.StreamSectionsRequest{Slug: "s", Names: []string{"claims"}})
	if err == nil {
		_, err = stream.Recv()
	}
	d := decode(t, err)
	if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManySectionStreams || d.info.GetMetadata()["limit"] != "caller" ||
		d.retry.GetRetryDelay().AsDuration() <= 0 {
		t.Fatalf("a third stream = %v (%+v); want RESOURCE_EXHAUSTED TOO_MANY_SECTION_STREAMS, limit caller, with a retry delay", err, d)
	}
	close(core.release)
	wg.Wait()
	stream, err = e.records.StreamSections(ctx, &fencedv1.StreamSectionsRequest{Slug: "s", Names: []string{"claims"}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || resp.GetEnd() == nil || resp.GetRecords()[0].GetRecord().GetValue() != "1" {
		t.Fatalf("a stream once the others ended = %v, %v; want the snapshot", resp, err)
	}
}

// BenchmarkSectionsOrStream: one snapshot read over gRPC on loopback, by
// Sections and by StreamSections, of a small section (20 records of 200
// bytes: what most reads are) and, by StreamSections alone, of five 1 MB
// records (Sections refuses them). Whether the clients could always stream
// rather than ask Sections first is this comparison.
func BenchmarkSectionsOrStream(b *testing.B) {
	srv := redistest.Start(b)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	f := fencedtest.Serve(b, st, fencedtest.Config{Options: server.Options{HealthInterval: noProbes}})
	ctx := context.Background()
	var small []*fencedv1.RecordWrite
	for i := range 20 {
		small = append(small, put("claims", fmt.Sprintf("c-%02d", i), 0, `"`+strings.Repeat("v", 200)+`"`))
	}
	if _, err := f.Records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "small", Writes: small}); err != nil {
		b.Fatal(err)
	}
	for i := range 5 {
		srv.Do(b, "HSET", redisKey("large", "executions"), fmt.Sprintf("e-%d", i), `{"r":1,"v":"`+strings.Repeat("x", 1<<20)+`"}`)
	}
	srv.Do(b, "SET", redisKey("large", "revision"), "1")
	stream := func(b *testing.B, slug, section string) {
		s, err := f.Records.StreamSections(ctx, &fencedv1.StreamSectionsRequest{Slug: slug, Names: []string{section}})
		if err != nil {
			b.Fatal(err)
		}
		for {
			resp, err := s.Recv()
			if err != nil {
				b.Fatal(err)
			}
			if resp.GetEnd() != nil {
				return
			}
		}
	}
	b.Run("small/Sections", func(b *testing.B) {
		for b.Loop() {
			if _, err := f.Records.Sections(ctx, &fencedv1.SectionsRequest{Slug: "small", Names: []string{"claims"}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("small/StreamSections", func(b *testing.B) {
		for b.Loop() {
			stream(b, "small", "claims")
		}
	})
	b.Run("5MB/StreamSections", func(b *testing.B) {
		for b.Loop() {
			stream(b, "large", "executions")
		}
	})
}
