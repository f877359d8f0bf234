// Package server is fenced's gRPC surface: the RecordsService handlers (each
// validates the request, calls the store, and maps the error through one
// table), the interceptor chain, health that follows Redis, and reflection.
package server

import (
	"context"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// Records is the core the handlers call: *store.Store implements it.
type Records interface {
	Layout(ctx context.Context, slug string) (store.Layout, error)
	Record(ctx context.Context, slug, section, key string) (*store.Record, int64, error)
	Sections(ctx context.Context, slug string, names []string) (*store.Snapshot, error)
	Commit(ctx context.Context, b *batch.Batch) (int64, error)
}

// Service implements fencedv1.RecordsServiceServer over a Records core.
type Service struct {
	fencedv1.UnimplementedRecordsServiceServer
	records Records
	limits  batch.Limits
}

// NewService returns the RecordsService handlers over records, enforcing
// limits (which must pass batch.Limits.Check).
func NewService(records Records, limits batch.Limits) *Service {
	return &Service{records: records, limits: limits}
}

var layouts = map[store.Layout]fencedv1.Layout{
	store.LayoutNone:     fencedv1.Layout_LAYOUT_UNSPECIFIED,
	store.LayoutRecords:  fencedv1.Layout_LAYOUT_RECORDS,
	store.LayoutDocument: fencedv1.Layout_LAYOUT_DOCUMENT,
}

// Layout answers how a swarm is stored.
func (s *Service) Layout(ctx context.Context, req *fencedv1.LayoutRequest) (*fencedv1.LayoutResponse, error) {
	if err := batch.CheckSlug(req.GetSlug()); err != nil {
		return nil, toStatus(err)
	}
	l, err := s.records.Layout(ctx, req.GetSlug())
	if err != nil {
		return nil, toStatus(err)
	}
	return &fencedv1.LayoutResponse{Layout: layouts[l]}, nil
}

// Sections answers one consistent snapshot of whole sections.
func (s *Service) Sections(ctx context.Context, req *fencedv1.SectionsRequest) (*fencedv1.SectionsResponse, error) {
	names, err := s.limits.CheckSections(req.GetSlug(), req.GetNames())
	if err != nil {
		return nil, toStatus(err)
	}
	snap, err := s.records.Sections(ctx, req.GetSlug(), names)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &fencedv1.SectionsResponse{
		Sections: make(map[string]*fencedv1.Section, len(snap.Sections)),
		Revision: snap.Revision,
	}
	for name, recs := range snap.Sections {
		sec := &fencedv1.Section{Records: make(map[string]*fencedv1.Record, len(recs))}
		for key, r := range recs {
			sec.Records[key] = &fencedv1.Record{Revision: r.Revision, Value: r.Value}
		}
		resp.Sections[name] = sec
	}
	return resp, nil
}

// Record answers one record and the swarm revision.
func (s *Service) Record(ctx context.Context, req *fencedv1.RecordRequest) (*fencedv1.RecordResponse, error) {
	if err := s.limits.CheckRecordRef(req.GetSlug(), req.GetSection(), req.GetKey()); err != nil {
		return nil, toStatus(err)
	}
	rec, rev, err := s.records.Record(ctx, req.GetSlug(), req.GetSection(), req.GetKey())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &fencedv1.RecordResponse{Revision: rev}
	if rec != nil {
		resp.Record = &fencedv1.Record{Revision: rec.Revision, Value: rec.Value}
	}
	return resp, nil
}

// FencedBatch validates a batch and commits it all or none.
func (s *Service) FencedBatch(ctx context.Context, req *fencedv1.FencedBatchRequest) (*fencedv1.FencedBatchResponse, error) {
	b := BatchFromProto(req)
	if err := s.limits.CheckBatch(b); err != nil {
		return nil, toStatus(err)
	}
	rev, err := s.records.Commit(ctx, b)
	if err != nil {
		return nil, toStatus(err)
	}
	return &fencedv1.FencedBatchResponse{Revision: rev}, nil
}

// BatchFromProto converts a request into the domain batch, unvalidated. The
// value strings are shared, not copied.
func BatchFromProto(req *fencedv1.FencedBatchRequest) *batch.Batch {
	b := &batch.Batch{Slug: req.GetSlug(), Writes: make([]batch.Write, len(req.GetWrites()))}
	for i, w := range req.GetWrites() {
		b.Writes[i] = batch.Write{
			Kind:     batch.Kind(w.GetKind()), // same numbering; pinned by a test
			Section:  w.GetSection(),
			Key:      w.GetKey(),
			Expected: w.GetExpected(),
			Value:    w.GetValue(),
		}
	}
	if f := req.GetFence(); f != nil {
		b.Fence = &batch.Fence{Owner: f.GetOwner(), Epoch: f.GetEpoch(), NowMs: f.GetNowMs()}
	}
	return b
}
