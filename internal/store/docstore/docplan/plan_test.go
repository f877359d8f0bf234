package docplan

import (
	"errors"
	"slices"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

// leaseDoc is a document at revision 5 whose meta holds hive-a's lease at
// epoch 7 until 2000 ms, and section a one record.
const leaseDoc = `{"revision":5,"meta":{"lease":{"owner":"hive-a","epoch":7,"expires_at":2000},"epoch":7},"sections":{"a":{"x": 1}}}`

func mustParse(t *testing.T, raw string) *Document {
	t.Helper()
	d, err := Parse([]byte(raw))
	if err != nil {
		t.Fatalf("Parse(%s): %v", raw, err)
	}
	return d
}

func put(section, key string, expected int64, value string) batch.Write {
	return batch.Write{Kind: batch.KindPut, Section: section, Key: key, Expected: expected, Value: value}
}

// TestNextRevisionIsLaterThanBothAndAtLeastTheClock: the document's
// numbering rule is lib_commit.lua's: the clock in 100 µs unless an era-2
// floor is at or above it (then that floor plus one); an era-1 floor
// (fenced's former µs revisions, 16 digits) or an era-0 one (a counter)
// ranks below the clock; nothing above 10^14-1 is issued.
func TestNextRevisionIsLaterThanBothAndAtLeastTheClock(t *testing.T) {
	const (
		nowUs  = 1_796_150_326_467_912 // 2026-12-01
		nowRev = 17_961_503_264_679    // the same in 100 µs
		oldUs  = 1_796_079_180_861_096 // a revision fenced issued in µs
	)
	tests := []struct {
		name                   string
		counter, docRev, nowUs int64
		want                   int64
	}{
		{"the counter is ahead", 10, 4, 0, 11},
		{"the document is ahead", 4, 10, 0, 11},
		{"the clock is ahead", 4, 10, nowUs, nowRev},
		{"the clock is behind", nowRev + 5, 0, nowUs, nowRev + 6},
		{"the document is behind the clock", 0, nowRev + 5, nowUs, nowRev + 6},
		{"a µs counter ranks below the clock", oldUs, 4, nowUs, nowRev},
		{"a µs counter far ahead ranks below the clock", protocol.RevMax, 0, nowUs, nowRev},
		{"a µs document ranks below an era-2 counter", nowRev + 5, oldUs, nowUs, nowRev + 6},
		{"up to the limit", protocol.IssueMax - 1, 0, nowUs, protocol.IssueMax},
	}
	for _, tt := range tests {
		got, err := NextRevision(tt.counter, tt.docRev, tt.nowUs)
		if got != tt.want || err != nil {
			t.Errorf("%s: NextRevision(%d, %d, %d) = %d, %v; want %d", tt.name, tt.counter, tt.docRev, tt.nowUs, got, err, tt.want)
		}
		if got >= 100_000_000_000_000 {
			t.Errorf("%s: NextRevision = %d, want below 10^14", tt.name, got)
		}
	}
	for _, args := range [][3]int64{{protocol.IssueMax, 0, nowUs}, {0, protocol.IssueMax, nowUs}, {0, 0, (protocol.IssueMax + 1) * protocol.RevisionTickUs}} {
		_, err := NextRevision(args[0], args[1], args[2])
		var le *LimitError
		if !errors.As(err, &le) || le.Key != "revision" {
			t.Errorf("NextRevision%v = %v, want *LimitError revision", args, err)
		}
	}
}

func TestPlanBatchRefusesAStaleFence(t *testing.T) {
	hiveA := &Lease{Owner: "hive-a", Epoch: 7, ExpiresAtMs: 2000}
	tests := []struct {
		name  string
		doc   string
		fence *batch.Fence
		nowMs int64
		stale *Lease // nil with ok false: no lease
		ok    bool
	}{
		{"unfenced", leaseDoc, nil, 5000, nil, true},
		{"owner and epoch", leaseDoc, &batch.Fence{Owner: "hive-a", Epoch: 7}, 1999, nil, true},
		{"epoch alone matches any owner", leaseDoc, &batch.Fence{Epoch: 7}, 1000, nil, true},
		{"another owner", leaseDoc, &batch.Fence{Owner: "hive-b", Epoch: 7}, 1000, hiveA, false},
		{"another epoch", leaseDoc, &batch.Fence{Owner: "hive-a", Epoch: 6}, 1000, hiveA, false},
		{"expired by Redis's clock", leaseDoc, &batch.Fence{Owner: "hive-a", Epoch: 7}, 2000, hiveA, false},
		{"expired by the caller's clock", leaseDoc, &batch.Fence{Owner: "hive-a", Epoch: 7, NowMs: 2000}, 1000, hiveA, false},
		{"no lease", `{"revision":5,"meta":{"epoch":7}}`, &batch.Fence{Epoch: 7}, 1000, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &batch.Batch{Slug: "s", Fence: tt.fence, Writes: []batch.Write{put("a", "y", batch.Absent, `2`)}}
			newDoc, rev, err := PlanBatch(mustParse(t, tt.doc), b, 0, 100*protocol.RevisionTickUs, tt.nowMs)
			if tt.ok {
				if err != nil || newDoc == nil || rev != 100 {
					t.Errorf("PlanBatch = %s, %d, %v; want a document at revision 100", newDoc, rev, err)
				}
				return
			}
			var se *StaleError
			if !errors.As(err, &se) || (se.Lease == nil) != (tt.stale == nil) || (se.Lease != nil && *se.Lease != *tt.stale) {
				t.Fatalf("PlanBatch = %s, %d, %v; want *StaleError naming %+v", newDoc, rev, err, tt.stale)
			}
			if newDoc != nil || rev != 0 {
				t.Errorf("refused PlanBatch planned %s at %d; want nothing", newDoc, rev)
			}
		})
	}
	_, _, err := PlanBatch(mustParse(t, `{"meta":{"lease":{"owner":"a"}}}`), &batch.Batch{Fence: &batch.Fence{Epoch: 1}}, 0, 0, 0)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Section != "meta" || ce.Key != "lease" {
		t.Errorf("PlanBatch fenced on an unreadable lease = %v, want *CorruptError meta/lease", err)
	}
}

func TestPlanBatchListsEveryConflictInBatchOrder(t *testing.T) {
	doc := mustParse(t, leaseDoc)
	b := &batch.Batch{Slug: "s", Writes: []batch.Write{
		put("a", "x", 5, `2`),            // present at the document's revision
		put("a", "y", batch.Absent, `2`), // absent
		put("a", "x", 4, `3`),            // conflict: actual 5
		{Kind: batch.KindDelete, Section: "a", Key: "z", Expected: 3}, // conflict: absent
		{Kind: batch.KindCheckSection, Section: "a", Expected: 4},     // conflict: actual 5
		put("a", "x", batch.Blind, `4`),                               // no check
		{Kind: batch.KindCheck, Section: "b", Key: "q", Expected: batch.Absent},
		{Kind: batch.KindCheckSection, Section: "b", Expected: 5},           // a section check reads the document's revision
		{Kind: batch.KindCheck, Section: "meta", Key: "epoch", Expected: 1}, // conflict: actual 5
	}}
	newDoc, rev, err := PlanBatch(doc, b, 0, 0, 0)
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("PlanBatch = %s, %d, %v; want *ConflictError", newDoc, rev, err)
	}
	want := []Conflict{
		{Index: 2, Section: "a", Key: "x", Expected: 4, Actual: 5},
		{Index: 3, Section: "a", Key: "z", Expected: 3, Actual: 0},
		{Index: 4, Section: "a", Expected: 4, Actual: 5},
		{Index: 8, Section: "meta", Key: "epoch", Expected: 1, Actual: 5},
	}
	if !slices.Equal(ce.Conflicts, want) {
		t.Errorf("PlanBatch conflicts = %+v\nwant %+v", ce.Conflicts, want)
	}
	if newDoc != nil || rev != 0 {
		t.Errorf("PlanBatch with conflicts planned %s at %d; want nothing", newDoc, rev)
	}
}

// TestPlanBatchChecksEveryPairOfARecordsCheck: each pair of a
// WRITE_KIND_CHECK_RECORDS reads as a record (the document's revision, 0
// when absent); its conflicts name the write and the pair, in order.
func TestPlanBatchChecksEveryPairOfARecordsCheck(t *testing.T) {
	doc := mustParse(t, leaseDoc)
	recs := batch.Write{Kind: batch.KindCheckRecords, Section: "a", Checks: []batch.RecordCheck{
		{Key: "x", Expected: 5}, {Key: "y", Expected: batch.Absent}, {Key: "x2", Expected: 5}, {Key: "x", Expected: 4},
	}}
	b := &batch.Batch{Slug: "s", Writes: []batch.Write{put("b", "n", batch.Absent, `1`), recs}}
	_, _, err := PlanBatch(doc, b, 0, 0, 0)
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("PlanBatch = %v; want *ConflictError", err)
	}
	want := []Conflict{
		{Index: 1, Section: "a", Key: "x2", Expected: 5, Actual: 0, InChecks: true, Check: 2},
		{Index: 1, Section: "a", Key: "x", Expected: 4, Actual: 5, InChecks: true, Check: 3},
	}
	if !slices.Equal(ce.Conflicts, want) {
		t.Errorf("PlanBatch conflicts = %+v\nwant %+v", ce.Conflicts, want)
	}
	recs.Checks = recs.Checks[:2]
	b.Writes[1] = recs
	newDoc, rev, err := PlanBatch(doc, b, 0, 0, 0)
	if err != nil || newDoc == nil || rev <= 5 {
		t.Errorf("PlanBatch with every pair matching = %s, %d, %v; want a new document above revision 5", newDoc, rev, err)
	}
}

func TestPlanBatchOfChecksOnlyPlansNothing(t *testing.T) {
	b := &batch.Batch{Slug: "s", Fence: &batch.Fence{Epoch: 7}, Writes: []batch.Write{
		{Kind: batch.KindCheck, Section: "a", Key: "x", Expected: 5},
		{Kind: batch.KindCheckSection, Section: "a", Expected: 5},
	}}
	newDoc, rev, err := PlanBatch(mustParse(t, leaseDoc), b, 9, 100, 1000)
	if newDoc != nil || rev != 5 || err != nil {
		t.Errorf("PlanBatch of checks = %s, %d, %v; want nil at the document's revision 5", newDoc, rev, err)
	}
}

func TestPlanBatchRewritesWhatItWritesAndKeepsTheRest(t *testing.T) {
	const raw = `{"slug": "s", "revision": 5, "meta": {"epoch": 7, "x": [ ]},
		"sections": {"a": {"x": {"n": 12345678901234567890}, "y": 1}, "b": {"only": 1}, "c": {"k": "v"}}}`
	b := &batch.Batch{Slug: "s", Writes: []batch.Write{
		put("a", "y", 5, `[ ]`),
		put("a", "new", batch.Absent, `"é\/"`),
		{Kind: batch.KindDelete, Section: "b", Key: "only", Expected: batch.Blind},
		put("d", "k", batch.Blind, `{}`),
		put("meta", "legacy_owner", batch.Blind, `"hive-a"`),
		{Kind: batch.KindDelete, Section: "meta", Key: "x", Expected: batch.Blind},
		{Kind: batch.KindDelete, Section: "c", Key: "absent", Expected: batch.Blind},
	}}
	newDoc, rev, err := PlanBatch(mustParse(t, raw), b, 8, 6, 0)
	if err != nil || rev != 9 {
		t.Fatalf("PlanBatch = %d, %v; want revision 9 (above the counter 8)", rev, err)
	}
	want := `{"slug":"s","revision":9,"meta":{"epoch":7,"legacy_owner":"hive-a"},` +
		`"sections":{"a":{"x":{"n": 12345678901234567890},"y":[ ],"new":"é\/"},"c":{"k":"v"},"d":{"k":{}}}}`
	if string(newDoc) != want {
		t.Errorf("PlanBatch =\n%s\nwant\n%s", newDoc, want)
	}
}

func TestPlanBatchUpToTheRevisionLimit(t *testing.T) {
	b := &batch.Batch{Slug: "s", Writes: []batch.Write{put("a", "y", batch.Blind, `1`)}}
	_, _, err := PlanBatch(mustParse(t, leaseDoc), b, protocol.IssueMax, 0, 0)
	var le *LimitError
	if !errors.As(err, &le) || le.Key != "revision" {
		t.Errorf("PlanBatch past the limit = %v, want *LimitError revision", err)
	}
}

func TestPlanLeaseKeepsLeaseRules(t *testing.T) {
	const (
		noLease   = `{"revision":5,"meta":{"epoch":3,"leader_changes":2}}`
		expiredB  = `{"revision":5,"meta":{"lease":{"owner":"hive-b","epoch":9,"expires_at":500},"epoch":4,"leader_changes":2}}`
		liveA     = `{"revision":5,"meta":{"lease":{"owner":"hive-a","epoch":7,"expires_at":2000},"epoch":7,"leader_changes":2}}`
		badLease  = `{"revision":5,"meta":{"lease":[]}}`
		nowMs     = 1000
		nowUs     = 10
		counter   = 20
		wantRev   = 21
		ttlMs     = 3000
		leaseText = `"lease":{"owner":"hive-a","epoch":`
	)
	hiveA := Lease{Owner: "hive-a", Epoch: 7, ExpiresAtMs: 2000}
	hiveB := Lease{Owner: "hive-b", Epoch: 9, ExpiresAtMs: 500}
	tests := []struct {
		name    string
		doc     string
		op      string
		owner   string
		epoch   int64
		want    LeaseChange
		wantDoc string
		err     error
	}{
		{name: "acquire with no lease grants above meta/epoch and at least the clock in ms", doc: noLease, op: protocol.LeaseAcquire, owner: "hive-a",
			want:    LeaseChange{Lease: Lease{Owner: "hive-a", Epoch: 1000, ExpiresAtMs: 4000}, Granted: true},
			wantDoc: `{"revision":21,"meta":{"epoch":1000,"leader_changes":3,` + leaseText + `1000,"expires_at":4000}}}`},
		{name: "acquire over another owner's expired lease replaces it", doc: expiredB, op: protocol.LeaseAcquire, owner: "hive-a",
			want:    LeaseChange{Lease: Lease{Owner: "hive-a", Epoch: 1000, ExpiresAtMs: 4000}, Granted: true, Replaced: &hiveB},
			wantDoc: `{"revision":21,"meta":{` + leaseText + `1000,"expires_at":4000},"epoch":1000,"leader_changes":3}}`},
		{name: "acquire by the live holder extends and keeps the epoch", doc: liveA, op: protocol.LeaseAcquire, owner: "hive-a",
			want:    LeaseChange{Lease: Lease{Owner: "hive-a", Epoch: 7, ExpiresAtMs: 4000}},
			wantDoc: `{"revision":21,"meta":{` + leaseText + `7,"expires_at":4000},"epoch":7,"leader_changes":2}}`},
		{name: "acquire over another's live lease", doc: liveA, op: protocol.LeaseAcquire, owner: "hive-b",
			err: &HeldError{Holder: hiveA, NowMs: nowMs}},
		{name: "renew", doc: liveA, op: protocol.LeaseRenew, owner: "hive-a", epoch: 7,
			want:    LeaseChange{Lease: Lease{Owner: "hive-a", Epoch: 7, ExpiresAtMs: 4000}},
			wantDoc: `{"revision":21,"meta":{` + leaseText + `7,"expires_at":4000},"epoch":7,"leader_changes":2}}`},
		{name: "renew at another epoch", doc: liveA, op: protocol.LeaseRenew, owner: "hive-a", epoch: 6, err: &StaleError{Lease: &hiveA}},
		{name: "renew by another owner", doc: liveA, op: protocol.LeaseRenew, owner: "hive-b", epoch: 7, err: &StaleError{Lease: &hiveA}},
		{name: "renew of an expired lease", doc: expiredB, op: protocol.LeaseRenew, owner: "hive-b", epoch: 9, err: &StaleError{Lease: &hiveB}},
		{name: "renew with no lease", doc: noLease, op: protocol.LeaseRenew, owner: "hive-a", epoch: 3, err: &StaleError{}},
		{name: "release removes the lease and keeps the epoch", doc: liveA, op: protocol.LeaseRelease, owner: "hive-a", epoch: 7,
			want:    LeaseChange{Lease: Lease{Owner: "hive-a", Epoch: 7, ExpiresAtMs: nowMs}},
			wantDoc: `{"revision":21,"meta":{"epoch":7,"leader_changes":2}}`},
		{name: "release by another owner", doc: liveA, op: protocol.LeaseRelease, owner: "hive-b", epoch: 7, err: &StaleError{Lease: &hiveA}},
		{name: "an unreadable lease", doc: badLease, op: protocol.LeaseAcquire, owner: "hive-a", err: &CorruptError{Section: "meta", Key: "lease"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, newDoc, rev, err := PlanLease(mustParse(t, tt.doc), tt.op, tt.owner, tt.epoch, ttlMs, counter, nowUs, nowMs)
			if tt.err != nil {
				if !sameRefusal(err, tt.err) {
					t.Fatalf("PlanLease = %v, want %v", err, tt.err)
				}
				if newDoc != nil || rev != 0 {
					t.Errorf("refused PlanLease planned %s at %d; want nothing", newDoc, rev)
				}
				return
			}
			if err != nil || rev != wantRev {
				t.Fatalf("PlanLease = %d, %v; want revision %d", rev, err, wantRev)
			}
			if got.Lease != tt.want.Lease || got.Granted != tt.want.Granted ||
				(got.Replaced == nil) != (tt.want.Replaced == nil) || (got.Replaced != nil && *got.Replaced != *tt.want.Replaced) {
				t.Errorf("PlanLease = %+v (replaced %+v), want %+v (replaced %+v)", got, got.Replaced, tt.want, tt.want.Replaced)
			}
			if string(newDoc) != tt.wantDoc {
				t.Errorf("PlanLease document =\n%s\nwant\n%s", newDoc, tt.wantDoc)
			}
		})
	}
}

// sameRefusal reports whether got is a refusal of want's type and fields.
func sameRefusal(got, want error) bool {
	switch w := want.(type) {
	case *HeldError:
		var g *HeldError
		return errors.As(got, &g) && *g == *w
	case *StaleError:
		var g *StaleError
		return errors.As(got, &g) && (g.Lease == nil) == (w.Lease == nil) && (g.Lease == nil || *g.Lease == *w.Lease)
	case *CorruptError:
		var g *CorruptError
		return errors.As(got, &g) && g.Section == w.Section && g.Key == w.Key
	case *LimitError:
		var g *LimitError
		return errors.As(got, &g) && *g == *w
	}
	return false
}

// TestPlanLeaseUpToTheLimits: no epoch or revision above 10^14-1 is issued
// (before: up to 2^53-1, which a Lua writer formats as 1.7961503264679e+15).
func TestPlanLeaseUpToTheLimits(t *testing.T) {
	for _, epoch := range []string{"99999999999999", "9007199254740991"} {
		doc := mustParse(t, `{"revision":5,"meta":{"epoch":`+epoch+`}}`)
		if _, _, _, err := PlanLease(doc, protocol.LeaseAcquire, "a", 0, 1000, 0, 0, 0); !sameRefusal(err, &LimitError{Key: "epoch"}) {
			t.Errorf("PlanLease granting after epoch %s = %v, want *LimitError epoch", epoch, err)
		}
	}
	doc := mustParse(t, `{"revision":99999999999998,"meta":{"epoch":99999999999998}}`)
	if c, _, rev, err := PlanLease(doc, protocol.LeaseAcquire, "a", 0, 1000, 0, 0, 0); err != nil || c.Lease.Epoch != protocol.IssueMax || rev != protocol.IssueMax {
		t.Errorf("PlanLease just below the limits = epoch %d r%d, %v; want both at 10^14-1", c.Lease.Epoch, rev, err)
	}
	doc = mustParse(t, `{"revision":5}`)
	if _, _, _, err := PlanLease(doc, protocol.LeaseAcquire, "a", 0, 1000, protocol.IssueMax, 0, 0); !sameRefusal(err, &LimitError{Key: "revision"}) {
		t.Errorf("PlanLease at the revision limit = %v, want *LimitError revision", err)
	}
	for _, epoch := range []string{`9007199254740992`, `1e300`, `Infinity`, `NaN`} {
		over := mustParse(t, `{"revision":5,"meta":{"epoch":`+epoch+`}}`)
		_, _, _, err := PlanLease(over, protocol.LeaseAcquire, "a", 0, 1000, 0, 0, 0)
		if epoch == `NaN` {
			if err != nil {
				t.Errorf("PlanLease with meta/epoch NaN (not a number: counts 0, as lease.lua reads it) = %v, want a grant", err)
			}
			continue
		}
		if !sameRefusal(err, &LimitError{Key: "meta/epoch"}) {
			t.Errorf("PlanLease with meta/epoch %s = %v, want *LimitError meta/epoch (no epoch above it can be granted)", epoch, err)
		}
	}
	if _, _, _, err := PlanLease(doc, "steal", "a", 0, 1000, 0, 0, 0); err == nil {
		t.Error("PlanLease of an unknown op = nil, want an error")
	}
}

func TestPlanLeaseGrantsAboveEveryEarlierEpoch(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want int64
	}{
		{"the expired lease's epoch is above meta/epoch", `{"meta":{"lease":{"owner":"b","epoch":9,"expires_at":1},"epoch":4}}`, 10},
		{"meta/epoch is above the expired lease's", `{"meta":{"lease":{"owner":"b","epoch":4,"expires_at":1},"epoch":9}}`, 10},
		{"no lease", `{"meta":{"epoch":9}}`, 10},
		{"no epoch at all: the clock", `{}`, 5},
		// meta/epoch as a writer formatting doubles stores it (cjson's %.14g,
		// Python's float): read as lease.lua reads it, rounded up; before,
		// read as 0 and granted below it.
		{"meta/epoch written as a double", `{"meta":{"epoch":1.7961503264679e+12}}`, 1_796_150_326_469},
		{"meta/epoch with a fraction", `{"meta":{"epoch":8.5}}`, 10},
		{"meta/epoch that is no number counts 0", `{"meta":{"epoch":"9"}}`, 5},
	}
	for _, tt := range tests {
		c, _, _, err := PlanLease(mustParse(t, tt.doc), protocol.LeaseAcquire, "a", 0, 1000, 0, 0, 5)
		if err != nil || !c.Granted || c.Lease.Epoch != tt.want {
			t.Errorf("%s: PlanLease acquire at 5 ms = %+v, %v; want epoch %d granted", tt.name, c, err, tt.want)
		}
	}
}
