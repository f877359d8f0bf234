package store

import (
	"errors"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
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
		{name: "revision at the limit", reply: []string{"OK", "9007199254740991"}, rev: MaxRevision},
		{name: "revision above the limit", reply: []string{"OK", "9007199254740992"}, err: &CorruptError{Key: protocol.KeyRevision}},
		{name: "revision not canonical", reply: []string{"OK", "042"}, err: &CorruptError{Key: protocol.KeyRevision}},
		{name: "revision negative", reply: []string{"OK", "-1"}, err: &CorruptError{Key: protocol.KeyRevision}},
		{name: "OK without revision", reply: []string{"OK"}, is: ErrMalformedReply},
		{name: "OK with an unknown flag", reply: []string{"OK", "42", "FRESH"}, is: ErrMalformedReply},
		{name: "OK too long", reply: []string{"OK", "42", "REPLAYED", ""}, is: ErrMalformedReply},
		{name: "reused", reply: []string{"REUSED"}, is: ErrRequestIDReused},
		{name: "one conflict", reply: []string{"CONFLICT", "0", "6"},
			err: &ConflictError{Conflicts: []Conflict{{Index: 0, Section: "claims", Key: "c", Expected: 5, Actual: 6}}}},
		{name: "two conflicts in request order, one record absent", reply: []string{"CONFLICT", "0", "0", "1", "12"},
			err: &ConflictError{Conflicts: []Conflict{
				{Index: 0, Section: "claims", Key: "c", Expected: 5, Actual: 0},
				{Index: 1, Section: "tasks", Key: "t", Expected: 9, Actual: 12}}}},
		{name: "conflict without pairs", reply: []string{"CONFLICT"}, is: ErrMalformedReply},
		{name: "conflict with half a pair", reply: []string{"CONFLICT", "0"}, is: ErrMalformedReply},
		{name: "conflict naming no write", reply: []string{"CONFLICT", "2", "1"}, is: ErrMalformedReply},
		{name: "conflict naming a negative write", reply: []string{"CONFLICT", "-1", "1"}, is: ErrMalformedReply},
		{name: "conflict with a non-integer actual", reply: []string{"CONFLICT", "0", "x"}, is: ErrMalformedReply},
		{name: "stale: no lease", reply: []string{"STALE", "", "", ""}, err: &StaleError{Fence: "lease"}},
		{name: "stale: another lease", reply: []string{"STALE", "ctl:b", "8", "1764540000000"},
			err: &StaleError{Present: true, Owner: "ctl:b", Epoch: 8, ExpiresAtMs: 1764540000000, Fence: "lease"}},
		{name: "stale claim of a batch without a claim fence", reply: []string{"STALE", "", "", "", "claim"}, is: ErrMalformedReply},
		{name: "stale with an unknown fifth element", reply: []string{"STALE", "", "", "", "x"}, is: ErrMalformedReply},
		{name: "stale with a non-integer epoch", reply: []string{"STALE", "ctl:b", "x", "1"}, is: ErrMalformedReply},
		{name: "stale too short", reply: []string{"STALE", "ctl:b"}, is: ErrMalformedReply},
		{name: "a write's field corrupt", reply: []string{"CORRUPT", "1"}, err: &CorruptError{Section: "tasks", Key: "t"}},
		{name: "the counter corrupt", reply: []string{"CORRUPT", "", "revision"}, err: &CorruptError{Key: "revision"}},
		{name: "meta/section_revisions corrupt", reply: []string{"CORRUPT", "", "meta/section_revisions"},
			err: &CorruptError{Section: "meta", Key: "section_revisions"}},
		{name: "the log unusable", reply: []string{"CORRUPT", "", "log"}, err: &CorruptError{Key: "log"}},
		{name: "corrupt naming no write", reply: []string{"CORRUPT", "2"}, is: ErrMalformedReply},
		{name: "corrupt with a non-integer index", reply: []string{"CORRUPT", "x"}, is: ErrMalformedReply},
		{name: "a BLIND write's record at the limit", reply: []string{"LIMIT", "0"}, err: &LimitError{Section: "claims", Key: "c"}},
		{name: "the new revision over the limit", reply: []string{"LIMIT", "", "revision"}, err: &LimitError{Key: "revision"}},
		{name: "meta/lease over the limit", reply: []string{"LIMIT", "", "meta/lease"}, err: &LimitError{Section: "meta", Key: "lease"}},
		{name: "limit without what", reply: []string{"LIMIT"}, is: ErrMalformedReply},
		{name: "a key of another type", reply: []string{"WRONGTYPE", "by-name", "string", "hash"},
			err: &CorruptError{Key: "by-name", Type: "string", Want: "hash"}},
		{name: "wrong type too short", reply: []string{"WRONGTYPE", "log", "string"}, is: ErrMalformedReply},
		{name: "layout unknown reaches no decoder", reply: []string{"LAYOUT_UNKNOWN"}, is: ErrMalformedReply},
		{name: "a lease reply", reply: []string{"HELD", "ctl:b", "8", "1", "0"}, is: ErrMalformedReply},
		{name: "an unknown tag", reply: []string{"MAYBE", "42"}, is: ErrMalformedReply},
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
		{name: "no grant", reply: []string{"STALE", "", "", "", "claim"}, err: &StaleError{Fence: "claim", Claim: "task/7"}},
		{name: "another grant", reply: []string{"STALE", "w2", "9", "1764540000000", "claim"},
			err: &StaleError{Present: true, Owner: "w2", Epoch: 9, ExpiresAtMs: 1764540000000, Fence: "claim", Claim: "task/7"}},
		{name: "the controller fence", reply: []string{"STALE", "ctl", "4", "1"},
			err: &StaleError{Present: true, Owner: "ctl", Epoch: 4, ExpiresAtMs: 1, Fence: "lease"}},
		{name: "a non-integer epoch", reply: []string{"STALE", "w2", "x", "1", "claim"}, is: ErrMalformedReply},
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

// TestLeaseResult decodes every reply lease.lua's header states, and the
// shapes around each, without Redis, into the LeaseEvent and revision the
// lease operations answer.
func TestLeaseResult(t *testing.T) {
	ok := func(granted, replacedOwner, replacedEpoch, replacedExpires string) []string {
		return []string{"OK", "1764540000000000", "ctl:a", "7", "1764540030000", granted, replacedOwner, replacedEpoch, replacedExpires}
	}
	lease := Lease{Owner: "ctl:a", Epoch: 7, ExpiresAtMs: 1764540030000}
	for _, c := range []struct {
		name  string
		reply []string
		want  LeaseEvent // without Err
		rev   int64
		err   error
		is    error
	}{
		{name: "renewed", reply: ok("0", "", "", ""), want: LeaseEvent{Op: "renew", Lease: lease}, rev: 1764540000000000},
		{name: "granted", reply: ok("1", "", "", ""), want: LeaseEvent{Op: "renew", Lease: lease, Granted: true}, rev: 1764540000000000},
		{name: "granted over an expired lease", reply: ok("1", "ctl:b", "6", "1764539990000"),
			want: LeaseEvent{Op: "renew", Lease: lease, Granted: true, Replaced: &Lease{Owner: "ctl:b", Epoch: 6, ExpiresAtMs: 1764539990000}},
			rev:  1764540000000000},
		{name: "granted flag neither 0 nor 1", reply: ok("2", "", "", ""), is: ErrMalformedReply},
		{name: "OK too short", reply: ok("1", "", "", "")[:8], is: ErrMalformedReply},
		{name: "revision above the limit", reply: []string{"OK", "9007199254740992", "ctl:a", "7", "1", "1", "", "", ""}, is: ErrMalformedReply},
		{name: "epoch above the limit", reply: []string{"OK", "1", "ctl:a", "9007199254740992", "1", "1", "", "", ""}, is: ErrMalformedReply},
		{name: "epoch not an integer", reply: []string{"OK", "1", "ctl:a", "x", "1", "1", "", "", ""}, is: ErrMalformedReply},
		{name: "replaced epoch not an integer", reply: ok("1", "ctl:b", "x", "1"), is: ErrMalformedReply},
		{name: "held", reply: []string{"HELD", "ctl:b", "8", "1764540030000", "1764540000000"},
			err: &HeldError{Holder: Lease{Owner: "ctl:b", Epoch: 8, ExpiresAtMs: 1764540030000}, NowMs: 1764540000000}},
		{name: "held too short", reply: []string{"HELD", "ctl:b", "8", "1764540030000"}, is: ErrMalformedReply},
		{name: "held with a non-integer now", reply: []string{"HELD", "ctl:b", "8", "1", "x"}, is: ErrMalformedReply},
		{name: "stale: no lease", reply: []string{"STALE", "", "", ""}, err: &StaleError{}},
		{name: "stale: another lease", reply: []string{"STALE", "ctl:b", "8", "1"}, err: &StaleError{Present: true, Owner: "ctl:b", Epoch: 8, ExpiresAtMs: 1}},
		{name: "meta/epoch corrupt", reply: []string{"CORRUPT", "", "meta/epoch"}, err: &CorruptError{Section: "meta", Key: "epoch"}},
		{name: "the new epoch over the limit", reply: []string{"LIMIT", "", "epoch"}, err: &LimitError{Key: "epoch"}},
		{name: "the log of another type", reply: []string{"WRONGTYPE", "log", "string", "stream"}, err: &CorruptError{Key: "log", Type: "string", Want: "stream"}},
		{name: "a write index means nothing here", reply: []string{"CORRUPT", "0"}, is: ErrMalformedReply},
		{name: "a commit's reply", reply: []string{"REUSED"}, is: ErrMalformedReply},
		{name: "an unknown tag", reply: []string{"MAYBE"}, is: ErrMalformedReply},
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

// TestParseInt: a reply's decimal integer, or ErrMalformedReply naming it.
func TestParseInt(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"42", 42, true}, {"-1", -1, true}, {"9223372036854775807", 1<<63 - 1, true},
		{"", 0, false}, {"1.5", 0, false}, {"x", 0, false}, {" 1", 0, false}, {"9223372036854775808", 0, false},
	} {
		got, err := parseInt(c.in)
		if c.ok && (err != nil || got != c.want) {
			t.Errorf("parseInt(%q) = %d, %v; want %d, nil", c.in, got, err, c.want)
		}
		if !c.ok && !errors.Is(err, ErrMalformedReply) {
			t.Errorf("parseInt(%q) = %d, %v; want ErrMalformedReply", c.in, got, err)
		}
	}
}
