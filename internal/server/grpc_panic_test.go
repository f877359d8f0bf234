package server_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
)

// panicky is a Core whose Layout, Sections and CommitDurable panic (each with a
// different kind of value) and whose Record answers normally. It stands in
// for a handler bug, not for Redis. The embedded Core is nil: the methods it
// would provide (the lease operations) are never called here.
type panicky struct{ server.Core }

func (panicky) Layout(context.Context, string) (docstore.Layout, error) {
	panic("secret-layout-detail")
}

func (panicky) Sections(context.Context, string, []string) (*engine.Snapshot, error) {
	var m map[string]int
	m["secret-sections-detail"]++ // a runtime error: assignment to a nil map
	return nil, nil
}

func (panicky) CommitDurable(context.Context, *batch.Batch, engine.Durability) (engine.Committed, error) {
	panic(errors.New("secret-commit-detail"))
}

func (panicky) Record(context.Context, string, string, string) (*batch.Record, int64, error) {
	return &batch.Record{Revision: 7, Value: `{"ok":true}`}, 9, nil
}

func (panicky) Ping(context.Context) error { return nil }

func (panicky) LoadScripts(context.Context) error { return nil }

// TestPanicBecomesInternal: a panic in a handler answers INTERNAL without
// leaking the panic value, is logged, and the server keeps serving.
func TestPanicBecomesInternal(t *testing.T) {
	e := serve(t, panicky{}, batch.DefaultLimits(), server.Options{})
	awaitHealth(t, e, "", serving)

	tests := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Layout panics with a string", func(ctx context.Context) error {
			_, err := e.records.Layout(ctx, &fencedv1.LayoutRequest{Slug: "s"})
			return err
		}},
		{"Sections panics with a runtime error", func(ctx context.Context) error {
			_, err := e.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: "s"})
			return err
		}},
		{"FencedBatch panics with an error", func(ctx context.Context) error {
			_, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "s",
				Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := 0; i < 2; i++ { // twice: the first panic left the server whole
				err := tt.call(ctxT(t))
				st, _ := status.FromError(err)
				if st.Code() != codes.Internal {
					t.Errorf("call %d: code = %v (%v), want %v", i, st.Code(), err, codes.Internal)
				}
				if strings.Contains(st.Message(), "secret-") {
					t.Errorf("call %d: message %q leaks the panic value", i, st.Message())
				}
			}
			got, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "s", Section: "intents", Key: "a"})
			if err != nil {
				t.Fatalf("Record after a panic: %v", err)
			}
			want := &fencedv1.RecordResponse{Record: &fencedv1.Record{Revision: 7, Value: `{"ok":true}`}, Revision: 9}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Record after a panic mismatch (-want +got):\n%s", diff)
			}
			if st := check(t, e, ""); st != serving {
				t.Errorf("Health.Check(\"\") after a panic = %v, want %v", st, serving)
			}
		})
	}

	if _, err := e.logs.awaitNth(func(r logRecord) bool {
		return r.level == slog.LevelError && r.attrs["panic"] != ""
	}, 2*len(tests)); err != nil {
		t.Errorf("server log: %v: want one error record with the panic per panicking call (%d)", err, 2*len(tests))
	}
}
