package records

import (
	"errors"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/google/go-cmp/cmp"
)

// replyBatch is the batch the reply tables decode against: write 0 a put
// of claims/c read at revision 5, write 1 a check of tasks/t read at 9.
var replyBatch = &batch.Batch{Slug: "s", Writes: []batch.Write{
	{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: 5, Value: `1`},
	{Kind: batch.KindCheck, Section: "tasks", Key: "t", Expected: 9},
}}

// TestCommitResult decodes every reply commit.lua's header states, and
// the shapes around each, without Redis: a reply becomes the revision or
// the error errors.go defines for it (the exact value for a typed error,
// errors.Is for a sentinel); anything else is ErrMalformedReply.
func TestCommitResult(t *testing.T) {
	for _, c := range []struct {
		name  string
		reply []string
		rev   int64
		err   error // the exact error, or
		is    error // a sentinel it matches
	}{
		{name: "committed", reply: []string{"OK", "1764540000000000"}, rev: 1764540000000000},
		{name: "checks alone at revision 0", reply: []string{"OK", "0"}, rev: 0},
		{name: "replayed", reply: []string{"OK", "42", "REPLAYED"}, rev: 42},
		{name: "by-name index stale", reply: []string{"OK", "42", "BYNAME_STALE"}, rev: 42},
		{name: "revision at the limit", reply: []string{"OK", "9007199254740991"}, rev: batch.MaxRevision},
		{name: "revision above the limit", reply: []string{"OK", "9007199254740992"}, err: &engine.CorruptError{Key: protocol.KeyRevision}},
		{name: "revision not canonical", reply: []string{"OK", "042"}, err: &engine.CorruptError{Key: protocol.KeyRevision}},
		{name: "revision negative", reply: []string{"OK", "-1"}, err: &engine.CorruptError{Key: protocol.KeyRevision}},
		{name: "OK without revision", reply: []string{"OK"}, is: engine.ErrMalformedReply},
		{name: "OK with an unknown flag", reply: []string{"OK", "42", "FRESH"}, is: engine.ErrMalformedReply},
		{name: "OK too long", reply: []string{"OK", "42", "REPLAYED", ""}, is: engine.ErrMalformedReply},
		{name: "reused", reply: []string{"REUSED"}, is: ErrRequestIDReused},
		{name: "one conflict", reply: []string{"CONFLICT", "0", "6"},
			err: &engine.ConflictError{Conflicts: []engine.Conflict{{Index: 0, Section: "claims", Key: "c", Expected: 5, Actual: 6}}}},
		{name: "two conflicts in request order, one record absent", reply: []string{"CONFLICT", "0", "0", "1", "12"},
			err: &engine.ConflictError{Conflicts: []engine.Conflict{
				{Index: 0, Section: "claims", Key: "c", Expected: 5, Actual: 0},
				{Index: 1, Section: "tasks", Key: "t", Expected: 9, Actual: 12}}}},
		{name: "conflict without pairs", reply: []string{"CONFLICT"}, is: engine.ErrMalformedReply},
		{name: "conflict with half a pair", reply: []string{"CONFLICT", "0"}, is: engine.ErrMalformedReply},
		{name: "conflict naming no write", reply: []string{"CONFLICT", "2", "1"}, is: engine.ErrMalformedReply},
		{name: "conflict naming a negative write", reply: []string{"CONFLICT", "-1", "1"}, is: engine.ErrMalformedReply},
		{name: "conflict with a non-integer actual", reply: []string{"CONFLICT", "0", "x"}, is: engine.ErrMalformedReply},
		{name: "stale: no lease", reply: []string{"STALE", "", "", ""}, err: &engine.StaleError{Fence: "lease"}},
		{name: "stale: another lease", reply: []string{"STALE", "ctl:b", "8", "1764540000000"},
			err: &engine.StaleError{Present: true, Owner: "ctl:b", Epoch: 8, ExpiresAtMs: 1764540000000, Fence: "lease"}},
		{name: "stale claim of a batch without a claim fence", reply: []string{"STALE", "", "", "", "claim"}, is: engine.ErrMalformedReply},
		{name: "stale with an unknown fifth element", reply: []string{"STALE", "", "", "", "x"}, is: engine.ErrMalformedReply},
		{name: "stale with a non-integer epoch", reply: []string{"STALE", "ctl:b", "x", "1"}, is: engine.ErrMalformedReply},
		{name: "stale too short", reply: []string{"STALE", "ctl:b"}, is: engine.ErrMalformedReply},
		{name: "a write's field corrupt", reply: []string{"CORRUPT", "1"}, err: &engine.CorruptError{Section: "tasks", Key: "t"}},
		{name: "the counter corrupt", reply: []string{"CORRUPT", "", "revision"}, err: &engine.CorruptError{Key: "revision"}},
		{name: "meta/section_revisions corrupt", reply: []string{"CORRUPT", "", "meta/section_revisions"},
			err: &engine.CorruptError{Section: "meta", Key: "section_revisions"}},
		{name: "the log unusable", reply: []string{"CORRUPT", "", "log"}, err: &engine.CorruptError{Key: "log"}},
		{name: "corrupt naming no write", reply: []string{"CORRUPT", "2"}, is: engine.ErrMalformedReply},
		{name: "corrupt with a non-integer index", reply: []string{"CORRUPT", "x"}, is: engine.ErrMalformedReply},
		{name: "a BLIND write's record at the limit", reply: []string{"LIMIT", "0"}, err: &engine.LimitError{Section: "claims", Key: "c"}},
		{name: "the new revision over the limit", reply: []string{"LIMIT", "", "revision"}, err: &engine.LimitError{Key: "revision"}},
		{name: "meta/lease over the limit", reply: []string{"LIMIT", "", "meta/lease"}, err: &engine.LimitError{Section: "meta", Key: "lease"}},
		{name: "limit without what", reply: []string{"LIMIT"}, is: engine.ErrMalformedReply},
		{name: "a key of another type", reply: []string{"WRONGTYPE", "by-name", "string", "hash", "P:{s}:fence:by-name"},
			err: &engine.CorruptError{Key: "by-name", Type: "string", Want: "hash", RedisKey: "P:{s}:fence:by-name"}},
		{name: "wrong type too short", reply: []string{"WRONGTYPE", "log", "string", "stream"}, is: engine.ErrMalformedReply},
		{name: "layout unknown reaches no decoder", reply: []string{"LAYOUT_UNKNOWN"}, is: engine.ErrMalformedReply},
		{name: "a lease reply", reply: []string{"HELD", "ctl:b", "8", "1", "0"}, is: engine.ErrMalformedReply},
		{name: "an unknown tag", reply: []string{"MAYBE", "42"}, is: engine.ErrMalformedReply},
	} {
		t.Run(c.name, func(t *testing.T) {
			rev, err := commitResult(replyBatch, c.reply)
			checkDecoded(t, "commitResult", c.reply, rev, err, c.rev, c.err, c.is)
		})
	}
}

// TestCommitResultClaimFence decodes the claim fence's refusal of a batch
// fenced by a claim: the StaleError names the fence and the claim.
func TestCommitResultClaimFence(t *testing.T) {
	b := &batch.Batch{Slug: "s", Writes: replyBatch.Writes, Claim: &batch.ClaimFence{Name: "task/7", Owner: "w1", Epoch: 3}}
	for _, c := range []struct {
		name  string
		reply []string
		err   error
		is    error
	}{
		{name: "no grant", reply: []string{"STALE", "", "", "", "claim"}, err: &engine.StaleError{Fence: "claim", Claim: "task/7"}},
		{name: "another grant", reply: []string{"STALE", "w2", "9", "1764540000000", "claim"},
			err: &engine.StaleError{Present: true, Owner: "w2", Epoch: 9, ExpiresAtMs: 1764540000000, Fence: "claim", Claim: "task/7"}},
		{name: "the controller fence", reply: []string{"STALE", "ctl", "4", "1"},
			err: &engine.StaleError{Present: true, Owner: "ctl", Epoch: 4, ExpiresAtMs: 1, Fence: "lease"}},
		{name: "a non-integer epoch", reply: []string{"STALE", "w2", "x", "1", "claim"}, is: engine.ErrMalformedReply},
	} {
		t.Run(c.name, func(t *testing.T) {
			rev, err := commitResult(b, c.reply)
			checkDecoded(t, "commitResult", c.reply, rev, err, 0, c.err, c.is)
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
