package lease

import (
	"errors"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/google/go-cmp/cmp"
)

// replyBatch is the batch the reply tables decode against: write 0 a put
// of claims/c read at revision 5, write 1 a check of tasks/t read at 9.
var replyBatch = &batch.Batch{Slug: "s", Writes: []batch.Write{
	{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: 5, Value: `1`},
	{Kind: batch.KindCheck, Section: "tasks", Key: "t", Expected: 9},
}}

// TestLeaseResult decodes every reply lease.lua's header states, and the
// shapes around each, without Redis, into the LeaseEvent and revision the
// lease operations answer.
func TestLeaseResult(t *testing.T) {
	ok := func(granted, replacedOwner, replacedEpoch, replacedExpires string) []string {
		return []string{"OK", "1764540000000000", "ctl:a", "7", "1764540030000", granted, replacedOwner, replacedEpoch, replacedExpires}
	}
	lease := batch.Lease{Owner: "ctl:a", Epoch: 7, ExpiresAtMs: 1764540030000}
	for _, c := range []struct {
		name  string
		reply []string
		want  batch.LeaseEvent // without Err
		rev   int64
		err   error
		is    error
	}{
		{name: "renewed", reply: ok("0", "", "", ""), want: batch.LeaseEvent{Op: "renew", Lease: lease}, rev: 1764540000000000},
		{name: "granted", reply: ok("1", "", "", ""), want: batch.LeaseEvent{Op: "renew", Lease: lease, Granted: true}, rev: 1764540000000000},
		{name: "granted over an expired lease", reply: ok("1", "ctl:b", "6", "1764539990000"),
			want: batch.LeaseEvent{Op: "renew", Lease: lease, Granted: true, Replaced: &batch.Lease{Owner: "ctl:b", Epoch: 6, ExpiresAtMs: 1764539990000}},
			rev:  1764540000000000},
		{name: "granted flag neither 0 nor 1", reply: ok("2", "", "", ""), is: engine.ErrMalformedReply},
		{name: "OK too short", reply: ok("1", "", "", "")[:8], is: engine.ErrMalformedReply},
		{name: "revision above the limit", reply: []string{"OK", "9007199254740992", "ctl:a", "7", "1", "1", "", "", ""}, is: engine.ErrMalformedReply},
		{name: "epoch above the limit", reply: []string{"OK", "1", "ctl:a", "9007199254740992", "1", "1", "", "", ""}, is: engine.ErrMalformedReply},
		{name: "epoch not an integer", reply: []string{"OK", "1", "ctl:a", "x", "1", "1", "", "", ""}, is: engine.ErrMalformedReply},
		{name: "replaced epoch not an integer", reply: ok("1", "ctl:b", "x", "1"), is: engine.ErrMalformedReply},
		{name: "held", reply: []string{"HELD", "ctl:b", "8", "1764540030000", "1764540000000"},
			err: &engine.HeldError{Holder: batch.Lease{Owner: "ctl:b", Epoch: 8, ExpiresAtMs: 1764540030000}, NowMs: 1764540000000}},
		{name: "held too short", reply: []string{"HELD", "ctl:b", "8", "1764540030000"}, is: engine.ErrMalformedReply},
		{name: "held with a non-integer now", reply: []string{"HELD", "ctl:b", "8", "1", "x"}, is: engine.ErrMalformedReply},
		{name: "stale: no lease", reply: []string{"STALE", "", "", ""}, err: &engine.StaleError{}},
		{name: "stale: another lease", reply: []string{"STALE", "ctl:b", "8", "1"}, err: &engine.StaleError{Present: true, Owner: "ctl:b", Epoch: 8, ExpiresAtMs: 1}},
		{name: "meta/epoch corrupt", reply: []string{"CORRUPT", "", "meta/epoch"}, err: &engine.CorruptError{Section: "meta", Key: "epoch"}},
		{name: "the new epoch over the limit", reply: []string{"LIMIT", "", "epoch"}, err: &engine.LimitError{Key: "epoch"}},
		{name: "the log of another type", reply: []string{"WRONGTYPE", "log", "string", "stream", "P:{s}:fence:log"}, err: &engine.CorruptError{Key: "log", Type: "string", Want: "stream", RedisKey: "P:{s}:fence:log"}},
		{name: "a write index means nothing here", reply: []string{"CORRUPT", "0"}, is: engine.ErrMalformedReply},
		{name: "a commit's reply", reply: []string{"REUSED"}, is: engine.ErrMalformedReply},
		{name: "an unknown tag", reply: []string{"MAYBE"}, is: engine.ErrMalformedReply},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, rev := leaseResult("renew", c.reply)
			err := e.Err
			checkDecoded(t, "leaseResult", c.reply, rev, err, c.rev, c.err, c.is)
			if c.err == nil && c.is == nil {
				if diff := cmp.Diff(c.want, e); diff != "" {
					t.Errorf("leaseResult(%q) event (-want +got):\n%s", c.reply, diff)
				}
			} else if e.Op != "renew" {
				t.Errorf("leaseResult(%q) event Op %q, want renew", c.reply, e.Op)
			}
		})
	}
}

// checkDecoded compares a decoder's answer for reply with the wanted
// revision and error (exact, or a sentinel it must match).
func checkDecoded(t *testing.T, decoder string, reply []string, rev int64, err error, wantRev int64, wantErr, wantIs error) {
	t.Helper()
	switch {
	case wantErr != nil:
		if diff := cmp.Diff(wantErr, err); diff != "" {
			t.Errorf("%s(%q) error (-want +got):\n%s", decoder, reply, diff)
		}
	case wantIs != nil:
		if !errors.Is(err, wantIs) {
			t.Errorf("%s(%q) = %d, %v; want an error matching %v", decoder, reply, rev, err, wantIs)
		}
	case err != nil || rev != wantRev:
		t.Errorf("%s(%q) = %d, %v; want %d, nil", decoder, reply, rev, err, wantRev)
	}
	if (wantErr != nil || wantIs != nil) && rev != 0 {
		t.Errorf("%s(%q) = revision %d with error %v; want 0", decoder, reply, rev, err)
	}
}
