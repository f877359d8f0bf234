// Package server is fenced's gRPC surface: the RecordsService and
// LeaseService handlers (each converts the request, checks it with
// internal/batch, calls the store, and maps the error through one table),
// the interceptor chain, health that follows Redis, and reflection.
package server

import (
	"context"
	"errors"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/server/admission"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/protobuf/proto"
)

// Records is the core the handlers call: *store.Store implements it.
type Records interface {
	Layout(ctx context.Context, slug string) (docstore.Layout, error)
	Record(ctx context.Context, slug, section, key string) (*batch.Record, int64, error)
	Sections(ctx context.Context, slug string, names []string) (*batch.Snapshot, error)
	ScanSection(ctx context.Context, slug, section, position string, count int) (*batch.Page, error)
	CommitDurable(ctx context.Context, b *batch.Batch, d batch.Durability) (batch.Committed, error)
}

// ServiceOptions are the RecordsService settings beyond the batch limits.
type ServiceOptions struct {
	// Durability is what a batch waits for when it does not say
	// (replica_ack unset). Zero: no wait.
	Durability batch.Durability
	// MaxSnapshotBytes bounds a Sections answer, in bytes (the encoded
	// response). Zero: DefaultMaxSnapshotBytes.
	MaxSnapshotBytes int
	// MaxAckReplicas bounds replica_ack.replicas: a batch asking for more
	// is refused (INVALID_ARGUMENT naming the field and the bound) before
	// anything is written, instead of committing and then answering
	// REPLICATION_TIMEOUT. Zero: DefaultMaxAckReplicas.
	MaxAckReplicas int
	// MaxAckTimeout bounds replica_ack.timeout_ms, likewise. Zero:
	// DefaultMaxAckTimeout.
	MaxAckTimeout time.Duration
	// Watch bounds Watch streams (watch.go).
	Watch WatchOptions
	// SectionStreams bounds StreamSections streams (streams.go).
	SectionStreams SectionStreamOptions
}

// Defaults of ServiceOptions' replica_ack bounds: a Redis primary seldom
// has more than a few replicas, and a wait holds a dedicated Redis
// connection for its whole timeout.
const (
	DefaultMaxAckReplicas = 8
	DefaultMaxAckTimeout  = 5 * time.Minute
)

// DefaultMaxSnapshotBytes keeps a Sections answer under gRPC's default 4 MiB
// receive limit of most clients, with room for framing. The store refuses a
// snapshot certainly above it before reading it out of Redis (give it the
// same limit with batch.ReadLimits.MaxSnapshotBytes); the handler checks the
// encoded answer.
const DefaultMaxSnapshotBytes = batch.DefaultMaxSnapshotBytes

// Service implements fencedv1.RecordsServiceServer over a Records core.
type Service struct {
	fencedv1.UnimplementedRecordsServiceServer
	records Records
	limits  batch.Limits
	opts    ServiceOptions
	// watchSlots counts open Watch streams; limitsObs and watchObs are told
	// of them (set by New from Telemetry.Limits).
	watchSlots *watchSlots
	limitsObs  bounds.Observer
	watchObs   WatchObserver
	// admit gives Watch opens their turn in the fair queue (set by New;
	// nil: no queue).
	admit *admission.Admission
	// sectionStreams counts open StreamSections streams (streams.go).
	sectionStreams *sectionStreams
}

// NewService returns the RecordsService handlers over records, enforcing
// limits (which must pass batch.Limits.Check).
func NewService(records Records, limits batch.Limits, opts ServiceOptions) *Service {
	if opts.MaxSnapshotBytes <= 0 {
		opts.MaxSnapshotBytes = DefaultMaxSnapshotBytes
	}
	if opts.MaxAckReplicas <= 0 {
		opts.MaxAckReplicas = DefaultMaxAckReplicas
	}
	if opts.MaxAckTimeout <= 0 {
		opts.MaxAckTimeout = DefaultMaxAckTimeout
	}
	opts.Watch = opts.Watch.withDefaults()
	opts.SectionStreams = opts.SectionStreams.withDefaults()
	return &Service{records: records, limits: limits, opts: opts,
		watchSlots: &watchSlots{byConn: map[string]int{}, byCaller: map[string]int{}}, limitsObs: bounds.Nop{}, watchObs: nopWatch{},
		sectionStreams: &sectionStreams{byCaller: map[string]int{}}}
}

var layouts = map[docstore.Layout]fencedv1.Layout{
	docstore.LayoutNone:     fencedv1.Layout_LAYOUT_UNSPECIFIED,
	docstore.LayoutRecords:  fencedv1.Layout_LAYOUT_RECORDS,
	docstore.LayoutDocument: fencedv1.Layout_LAYOUT_DOCUMENT,
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
		resp.Sections[name] = &fencedv1.Section{Records: recordsProto(recs), Revision: snap.SectionRevisions[name]}
	}
	if size := proto.Size(resp); size > s.opts.MaxSnapshotBytes {
		return nil, toStatus(&engine.TooLargeError{Bytes: int64(size), MaxBytes: s.opts.MaxSnapshotBytes})
	}
	return resp, nil
}

func recordsProto(recs map[string]batch.Record) map[string]*fencedv1.Record {
	out := make(map[string]*fencedv1.Record, len(recs))
	for key, r := range recs {
		out[key] = &fencedv1.Record{Revision: r.Revision, Value: r.Value, Claim: r.Claim, ClaimEpoch: r.ClaimEpoch}
	}
	return out
}

// ScanSection answers one page of a section.
func (s *Service) ScanSection(ctx context.Context, req *fencedv1.ScanSectionRequest) (*fencedv1.ScanSectionResponse, error) {
	scan, err := s.limits.CheckScan(req.GetSlug(), req.GetSection(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, toStatus(err)
	}
	page, err := s.records.ScanSection(ctx, req.GetSlug(), req.GetSection(), scan.Position, scan.PageSize)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &fencedv1.ScanSectionResponse{Records: recordsProto(page.Records), Revision: page.Revision, SectionRevision: page.SectionRevision}
	if page.Next != "" {
		resp.NextPageToken = batch.EncodePageToken(req.GetSlug(), req.GetSection(), page.Next)
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
		resp.Record = &fencedv1.Record{Revision: rec.Revision, Value: rec.Value, Claim: rec.Claim, ClaimEpoch: rec.ClaimEpoch}
	}
	return resp, nil
}

// FencedBatch validates a batch and commits it all or none.
func (s *Service) FencedBatch(ctx context.Context, req *fencedv1.FencedBatchRequest) (*fencedv1.FencedBatchResponse, error) {
	b, ack := BatchFromProto(req), replicaAckFromProto(req.GetReplicaAck())
	bounds := batch.AckBounds{MaxReplicas: s.opts.MaxAckReplicas, MaxTimeout: s.opts.MaxAckTimeout}
	if err := s.limits.CheckFencedBatch(b, ack, bounds); err != nil {
		return nil, toStatus(err)
	}
	c, err := s.records.CommitDurable(ctx, b, s.durability(ack))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			// The script may have been sent: it runs whenever Redis gets
			// to it (docs/design/03-fenced-batch.md §3.5).
			err = &outcomeUnknownError{err: err, requestID: b.RequestID}
		}
		return nil, toStatus(err)
	}
	return &fencedv1.FencedBatchResponse{Revision: c.Revision, Replayed: c.Replayed, ReplicasAcked: int32(c.ReplicasAcked)}, nil
}

// replicaAckFromProto converts a batch's replica_ack; nil when unset.
func replicaAckFromProto(ack *fencedv1.ReplicaAck) *batch.ReplicaAck {
	if ack == nil {
		return nil
	}
	return &batch.ReplicaAck{Replicas: ack.GetReplicas(), TimeoutMs: ack.GetTimeoutMs()}
}

// durability is what a checked batch waits for: its own replica_ack, else
// the server's default.
func (s *Service) durability(ack *batch.ReplicaAck) batch.Durability {
	if ack == nil {
		return s.opts.Durability
	}
	return batch.Durability{Replicas: int(ack.Replicas), Timeout: time.Duration(ack.TimeoutMs) * time.Millisecond}
}

// BatchFromProto converts a request into the domain batch, unvalidated. The
// value strings are shared, not copied.
func BatchFromProto(req *fencedv1.FencedBatchRequest) *batch.Batch {
	// One allocation holds the batch, its fence and a one-write batch's
	// write (most batches have one): three per call before.
	a := &struct {
		b   batch.Batch
		f   batch.Fence
		one [1]batch.Write
	}{}
	if c := req.GetClaim(); c != nil {
		a.b.Claim = &batch.ClaimFence{Name: c.GetName(), Owner: c.GetOwner(), Epoch: c.GetEpoch(), NowMs: c.GetNowMs()}
	}
	ws := req.GetWrites()
	b := &a.b
	b.Slug, b.RequestID = req.GetSlug(), req.GetRequestId()
	if len(ws) <= len(a.one) {
		b.Writes = a.one[:len(ws)]
	} else {
		b.Writes = make([]batch.Write, len(ws))
	}
	for i, w := range ws {
		b.Writes[i] = batch.Write{
			Kind:     batch.Kind(w.GetKind()), // same numbering; pinned by a test
			Section:  w.GetSection(),
			Key:      w.GetKey(),
			Expected: w.GetExpected(),
			Value:    w.GetValue(),
			Bound:    w.GetBindToClaim(),
			// A count check's (WRITE_KIND_CHECK_COUNT); 0 for every other kind.
			Count:       w.GetCount(),
			RevisionSum: w.GetRevisionSum(),
		}
		if cs := w.GetChecks(); len(cs) > 0 {
			checks := make([]batch.RecordCheck, len(cs))
			for j, c := range cs {
				checks[j] = batch.RecordCheck{Key: c.GetKey(), Expected: c.GetExpected()}
			}
			b.Writes[i].Checks = checks
		}
	}
	if f := req.GetFence(); f != nil {
		a.f = batch.Fence{Owner: f.GetOwner(), Epoch: f.GetEpoch(), NowMs: f.GetNowMs()}
		b.Fence = &a.f
	}
	return b
}
