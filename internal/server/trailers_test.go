package server_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/server/trailers"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// smallTrailerClient dials e with an 8 KiB header-list limit, the limit of
// common gRPC clients and proxies: a status whose trailers exceed it reaches
// the caller as INTERNAL (RST_STREAM) instead of its own code.
func smallTrailerClient(t *testing.T, e *endpoint) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithMaxHeaderListSize(8192),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", e.addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// wideKey is a record key of n bytes: "é" repeated (2 bytes each, 6 once
// percent-encoded), numbered so that keys differ.
func wideKey(i, n int) string {
	p := strconv.Itoa(i) + "-"
	return p + strings.Repeat("é", (n-len(p))/2)
}

// TestErrorsFitEightKiBTrailers sends every error kind at its largest to a
// client that accepts 8 KiB of trailers: each answers its own code and
// ErrorInfo, and a list cut to fit says how much it left out.
func TestErrorsFitEightKiBTrailers(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	conn := smallTrailerClient(t, e)
	records := fencedv1.NewRecordsServiceClient(conn)
	leases := fencedv1.NewLeaseServiceClient(conn)
	maxWrites := batch.DefaultLimits().MaxWrites

	checks := func(n, keyBytes int, key func(i, n int) string) []*fencedv1.RecordWrite {
		ws := make([]*fencedv1.RecordWrite, n)
		for i := range ws {
			ws[i] = chk("claims", key(i, keyBytes), 5)
		}
		return ws
	}
	asciiKey := func(i, n int) string { return fmt.Sprintf("%0*d", n, i) }
	badPuts := func(n int, key func(int) string) []*fencedv1.RecordWrite {
		ws := make([]*fencedv1.RecordWrite, n)
		for i := range ws {
			ws[i] = put("intents", key(i), 0, "{oops")
		}
		return ws
	}
	// A lease owner of 1024 bytes that percent-encodes to three times that.
	owner := strings.Repeat("é", 512)
	now := redisNowMs(t, srv)
	setLease(t, srv, "trailers-stale", owner, 7, now+3_600_000)
	setLease(t, srv, "trailers-held", owner, 7, now+3_600_000)
	corruptKey := wideKey(0, batch.MaxKeyBytes)
	srv.Do(t, "HSET", redisKey("trailers-corrupt", "claims"), corruptKey, "not a record")

	tests := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
		// listed is how many violations must be listed at least; total,
		// when > 0, what listed and violations_omitted must add up to
		// (validation stops at batch.MaxViolations).
		listed, total int
	}{
		{"64 checks on absent 36-byte keys", func() error {
			_, err := records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "trailers-64", Writes: checks(64, 36, asciiKey)})
			return err
		}, codes.Aborted, server.ReasonRevisionConflict, 1, 64},
		{"every write a conflict on a 1 KiB key", func() error {
			_, err := records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "trailers-max", Writes: checks(maxWrites, batch.MaxKeyBytes, wideKey)})
			return err
		}, codes.Aborted, server.ReasonRevisionConflict, 1, maxWrites},
		{"64 puts of invalid JSON", func() error {
			_, err := records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "trailers-json", Writes: badPuts(64, strconv.Itoa)})
			return err
		}, codes.InvalidArgument, server.ReasonInvalidArgument, 1, batch.MaxViolations},
		{"every write invalid, on 1 KiB keys", func() error {
			_, err := records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "trailers-json",
				Writes: badPuts(maxWrites, func(i int) string { return wideKey(i, batch.MaxKeyBytes) })})
			return err
		}, codes.InvalidArgument, server.ReasonInvalidArgument, 1, batch.MaxViolations},
		{"stale fence against a 1 KiB owner", func() error {
			_, err := records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "trailers-stale",
				Fence: &fencedv1.LeaseFence{Owner: strings.Repeat("ü", 512), Epoch: 6}, Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, "1")}})
			return err
		}, codes.FailedPrecondition, server.ReasonLeaseStale, 0, 0},
		{"acquire held by a 1 KiB owner", func() error {
			_, err := leases.Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: "trailers-held", Owner: strings.Repeat("ü", 512), TtlMs: 10_000})
			return err
		}, codes.FailedPrecondition, server.ReasonLeaseHeld, 0, 0},
		{"corrupt record under a 1 KiB key", func() error {
			_, err := records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "trailers-corrupt", Writes: []*fencedv1.RecordWrite{chk("claims", corruptKey, 1)}})
			return err
		}, codes.DataLoss, server.ReasonRecordCorrupt, 0, 0},
		{"read of the corrupt record", func() error {
			_, err := records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "trailers-corrupt", Section: "claims", Key: corruptKey})
			return err
		}, codes.DataLoss, server.ReasonRecordCorrupt, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			d := decode(t, err)
			if d.code != tt.code {
				t.Fatalf("code = %v (%v), want %v", d.code, err, tt.code)
			}
			if got := d.info.GetReason(); got != tt.reason {
				t.Fatalf("ErrorInfo reason = %q, want %q", got, tt.reason)
			}
			listed := len(d.precond.GetViolations()) + len(d.badReq.GetFieldViolations())
			if listed < tt.listed {
				t.Errorf("violations listed = %d, want at least %d", listed, tt.listed)
			}
			md := d.info.GetMetadata()
			total := listed
			if s, ok := md[trailers.MetaViolationsOmitted]; ok {
				n, err := strconv.Atoi(s)
				if err != nil || n <= 0 {
					t.Errorf("metadata %s = %q, want a positive count", trailers.MetaViolationsOmitted, s)
				}
				total += n
			}
			if c, ok := md["conflicts"]; ok && c != strconv.Itoa(total) {
				t.Errorf("conflicts = %s, but %d listed + %s omitted = %d", c, listed, md[trailers.MetaViolationsOmitted], total)
			}
			if tt.total > 0 && total != tt.total {
				t.Errorf("violations listed + omitted = %d + %d, want %d in all", listed, total-listed, tt.total)
			}
			switch tt.reason {
			case server.ReasonLeaseStale, server.ReasonLeaseHeld:
				if md["owner"] != owner {
					t.Errorf("metadata owner = %.40q... (%d bytes), want the holder's %d bytes", md["owner"], len(md["owner"]), len(owner))
				}
			case server.ReasonRecordCorrupt:
				if tt.name == "corrupt record under a 1 KiB key" && md["key"] != corruptKey {
					t.Errorf("metadata key = %d bytes, want the %d-byte key", len(md["key"]), len(corruptKey))
				}
			}
		})
	}
}
