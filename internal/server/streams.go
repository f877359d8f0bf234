package server

import (
	"context"
	"errors"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/trailers"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// SectionStreamer is the core StreamSections needs: *store.Store
// implements it. A core without it answers StreamSections UNIMPLEMENTED.
type SectionStreamer interface {
	StreamSections(ctx context.Context, slug string, names []string, turn batch.Turn, sink batch.SnapshotSink) error
}

// SectionStreamOptions bound StreamSections streams. Zero fields take the
// defaults named.
type SectionStreamOptions struct {
	// Max bounds the StreamSections streams open at once in the process;
	// one more is RESOURCE_EXHAUSTED + TOO_MANY_SECTION_STREAMS (limit
	// "process") with RetryInfo. Default DefaultMaxSectionStreams.
	Max int
	// MaxPerCaller bounds those one caller has open at once (its flow, as
	// Fairness.FlowsBy tells callers apart; limit "caller"). Default
	// DefaultMaxSectionStreamsPerCaller.
	MaxPerCaller int
}

// Defaults of SectionStreamOptions. A stream holds at most one answer's
// worth of records at once (a snapshot within --max-snapshot-bytes is read
// whole, as Sections reads it; a larger one one step of at most ~512 KiB
// of Redis reads at a time) and one message (StreamMessageBytes), and one
// dedicated Redis connection while it reads in steps: 16 streams hold at
// most ~80 MiB at the default limits.
const (
	DefaultMaxSectionStreams          = 16
	DefaultMaxSectionStreamsPerCaller = 2
)

// StreamMessageBytes is the most bytes of values and keys one
// StreamSectionsResponse carries (1 MiB, as a Watch message): a fraction of
// gRPC clients' default 4 MiB receive limit. A value larger than that is
// sent in parts.
const StreamMessageBytes = 1 << 20

// sectionStreamRetry is the RetryInfo of TOO_MANY_SECTION_STREAMS: a slot
// frees when a stream ends, and a stream of the default limits' largest
// snapshots ends within about a second on a quiet box.
const sectionStreamRetry = time.Second

func (o SectionStreamOptions) withDefaults() SectionStreamOptions {
	if o.Max <= 0 {
		o.Max = DefaultMaxSectionStreams
	}
	if o.MaxPerCaller <= 0 {
		o.MaxPerCaller = DefaultMaxSectionStreamsPerCaller
	}
	return o
}

// sectionStreams counts open StreamSections streams, in all and by caller
// (flow).
type sectionStreams struct {
	mu       sync.Mutex
	open     int
	byCaller map[string]int
}

func (s *sectionStreams) acquire(flow string, o SectionStreamOptions) (release func(), limit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open >= o.Max {
		return nil, "process"
	}
	if s.byCaller[flow] >= o.MaxPerCaller {
		return nil, "caller"
	}
	s.open++
	s.byCaller[flow]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.open--
		if s.byCaller[flow]--; s.byCaller[flow] == 0 {
			delete(s.byCaller, flow)
		}
	}, ""
}

// tooManySectionStreamsError is a StreamSections refused over a bound.
type tooManySectionStreamsError struct{ limit string }

func (e *tooManySectionStreamsError) Error() string {
	return "too many StreamSections streams open on this " + e.limit + "; nothing was read, retry later"
}

func tooManySectionStreamsDetails(err error) []protoadapt.MessageV1 {
	md := map[string]string{}
	var te *tooManySectionStreamsError
	if errors.As(err, &te) {
		md["limit"] = te.limit
	}
	return []protoadapt.MessageV1{info(ReasonTooManySectionStreams, md), &errdetails.RetryInfo{RetryDelay: durationpb.New(sectionStreamRetry)}}
}

// ReasonTooManySectionStreams: a StreamSections refused over
// SectionStreamOptions.
var ReasonTooManySectionStreams = fencedv1.ErrorReason_TOO_MANY_SECTION_STREAMS.String()

// StreamSections answers one consistent snapshot of whole sections of any
// size, in messages of at most StreamMessageBytes
// (proto/fenced/v1/records.proto): the checks of Sections, a slot among
// the process's and the caller's streams, then the core's read, whose
// every step of reading takes its turn in the caller's flow of the fair
// queue (admission.Admission.Step).
func (s *Service) StreamSections(req *fencedv1.StreamSectionsRequest, stream fencedv1.RecordsService_StreamSectionsServer) error {
	names, err := s.limits.CheckSections(req.GetSlug(), req.GetNames())
	if err != nil {
		return toStatus(err)
	}
	core, ok := s.records.(SectionStreamer)
	if !ok {
		return trailers.Fit(codes.Unimplemented, "streamed sections are not served by this core", nil).Err()
	}
	ctx := stream.Context()
	flow := s.admit.Flow(ctx)
	release, limit := s.sectionStreams.acquire(flow, s.opts.SectionStreams)
	if release == nil {
		s.limitsObs.Refused(bounds.LimitSectionStreams)
		return toStatus(&tooManySectionStreamsError{limit: limit})
	}
	defer release()
	sink := &streamSink{send: stream.Send, budget: StreamMessageBytes, resp: &fencedv1.StreamSectionsResponse{}}
	if err := core.StreamSections(ctx, req.GetSlug(), names, s.admit.Step(flow), sink); err != nil {
		return toStatus(err)
	}
	return nil
}

// streamSinkOverhead is what one SectionRecord costs a message beyond its
// section, key and value bytes (tags, lengths, the revision, the claim's
// epoch), counted generously.
const streamSinkOverhead = 48

// streamSink packs a snapshot's records into StreamSectionsResponse
// messages of at most budget bytes of keys and values (each
// streamSinkOverhead more), splitting a value over budget into parts at
// UTF-8 character boundaries, and sends each message once full.
type streamSink struct {
	send   func(*fencedv1.StreamSectionsResponse) error
	budget int
	resp   *fencedv1.StreamSectionsResponse
	size   int
	// sent: a message of the current attempt has left.
	sent bool
}

func (k *streamSink) flush() error {
	if len(k.resp.Records) == 0 && k.resp.End == nil && !k.resp.Restart {
		return nil
	}
	err := k.send(k.resp)
	k.resp, k.size, k.sent = &fencedv1.StreamSectionsResponse{}, 0, true
	return err
}

func (k *streamSink) add(r *fencedv1.SectionRecord, size int) error {
	if k.size > 0 && k.size+size > k.budget {
		if err := k.flush(); err != nil {
			return err
		}
	}
	k.resp.Records = append(k.resp.Records, r)
	k.size += size
	return nil
}

func (k *streamSink) Records(section string, recs map[string]batch.Record) error {
	for key, rec := range recs {
		fixed := len(section) + len(key) + len(rec.Claim) + streamSinkOverhead
		value := rec.Value
		for {
			part, more := value, false
			if room := max(k.budget-fixed, 1); len(part) > room {
				cut := room
				for cut > 0 && !utf8.RuneStart(part[cut]) {
					cut--
				}
				if cut == 0 {
					cut = room
				}
				part, value, more = part[:cut], part[cut:], true
			}
			r := &fencedv1.SectionRecord{Section: section, Key: key, More: more,
				Record: &fencedv1.Record{Revision: rec.Revision, Value: part, Claim: rec.Claim, ClaimEpoch: rec.ClaimEpoch}}
			if err := k.add(r, fixed+len(part)); err != nil {
				return err
			}
			if !more {
				break
			}
		}
	}
	return nil
}

func (k *streamSink) Restart() error {
	k.resp, k.size = &fencedv1.StreamSectionsResponse{}, 0
	if !k.sent {
		return nil // nothing of the attempt left: nothing to take back
	}
	k.resp.Restart = true
	err := k.flush()
	k.sent = false
	return err
}

func (k *streamSink) End(revision int64, sectionRevisions map[string]int64) error {
	k.resp.End = &fencedv1.SnapshotEnd{Revision: revision, SectionRevisions: sectionRevisions}
	return k.flush()
}
