package records

import (
	"context"
	"fmt"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// snapshotAttempts is how many times a snapshot is read in steps before it
// is read as one MULTI (which always completes): each attempt ends when a
// watched key changed before its EXEC.
const snapshotAttempts = 3

// sectionSize is what the checks before a snapshot found of one section:
// HLEN and MEMORY USAGE ... SAMPLES 0 (bytes; 0 when not asked).
type sectionSize struct{ records, bytes int64 }

// snapshotStep is one round trip of a chunked snapshot: HGETALL of whole
// sections, HKEYS of one section, or HMGET of some keys of one section.
type snapshotStep struct {
	kind    byte // 'a' HGETALL, 'k' HKEYS, 'm' HMGET
	section []int
	keys    []string // 'm': the fields
}

// stepPlan plans a snapshot's steps over sections of hlen records
// (sizes: each one's MEMORY USAGE and records when it was measured,
// scaled to its records now; unknown: recordEnvelope bytes a record), at
// most records records and bytes bytes a step.
type stepPlan struct {
	hlen           []int64
	sizes          []sectionSize
	records, bytes int64
}

func (sp stepPlan) bytesOf(i int) int64 {
	if sp.sizes[i].records <= 0 || sp.sizes[i].bytes <= 0 {
		return sp.hlen[i] * recordEnvelope
	}
	return sp.sizes[i].bytes * sp.hlen[i] / sp.sizes[i].records
}

// steps: a section over a step alone is read by its keys ('k', then
// keySteps), smaller ones whole ('a') together up to a step. Empty
// sections have no step.
func (sp stepPlan) steps() []snapshotStep {
	var plan []snapshotStep
	var group snapshotStep
	var groupRecords, groupBytes int64
	for i := range sp.hlen {
		n, b := sp.hlen[i], sp.bytesOf(i)
		if n == 0 {
			continue
		}
		if n > sp.records || b > sp.bytes {
			plan = append(plan, snapshotStep{kind: 'k', section: []int{i}})
			continue
		}
		if len(group.section) > 0 && (groupRecords+n > sp.records || groupBytes+b > sp.bytes) {
			plan = append(plan, group)
			group, groupRecords, groupBytes = snapshotStep{}, 0, 0
		}
		group.kind = 'a'
		group.section = append(group.section, i)
		groupRecords, groupBytes = groupRecords+n, groupBytes+b
	}
	if len(group.section) > 0 {
		plan = append(plan, group)
	}
	return plan
}

// keySteps are the HMGET steps ('m') of section i's keys, each within a
// step's records and bytes.
func (sp stepPlan) keySteps(i int, keys []string) []snapshotStep {
	per := sp.records
	if b := sp.bytesOf(i); b > 0 && sp.hlen[i] > 0 {
		per = min(per, max(1, sp.bytes*sp.hlen[i]/b))
	}
	var more []snapshotStep
	for from := 0; from < len(keys); from += int(per) {
		more = append(more, snapshotStep{kind: 'm', section: []int{i}, keys: keys[from:min(from+int(per), len(keys))]})
	}
	return more
}

// readSectionsChunked reads a snapshot in steps on one dedicated
// connection, each step one round trip of at most the step size
// (Options.SnapshotStepRecords, SnapshotStepBytes), so that Redis serves other clients between them:
//
//   - step 0: WATCH revision, meta, section-revisions and every section;
//     GET revision, HGET meta/section_revisions (retired), HGETALL
//     section-revisions, HLEN of each section;
//   - whole sections grouped by HGETALL up to the step's records and bytes;
//   - a section larger than one step: HKEYS, then HMGET of its keys, a
//     step's worth at a time (HSCAN would cost ~3x HGETALL a field on
//     Redis 7.0, which copies each field and value before answering);
//   - MULTI and EXEC (empty) with the last step: EXEC answers only when no
//     watched key was written since the WATCH, by any writer (fenced's
//     commits, lease changes and the Python writers' scripts alike, whether
//     they keep section revisions or not).
//
// So what was read is every section, the revision and section revisions
// as they all were at the WATCH: one state of the swarm. done is false with
// a nil error when a watched key changed (the caller tries again), with an
// error when Redis answered one inside a step (a key of another type: the
// script's error is the one to return). Else done is true: the snapshot, or
// its refusal (the record and byte limits, checked again on what was read;
// a field that is no record), or a transport or context error.
func (rs *Records) readSectionsChunked(ctx context.Context, k engine.Keys, names []string, sizes []sectionSize, attempt int, start time.Time) (*batch.Snapshot, bool, error) {
	dc, release := rs.e.Client().Dedicate()
	watching := false
	defer func() {
		if watching {
			// An attempt left before its EXEC: the connection goes back to
			// rueidis's pool, which would keep the WATCH for its next user.
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			if dc.Do(uctx, dc.B().Unwatch().Build()).Error() != nil {
				dc.Close()
			}
			cancel()
		}
		release()
	}()
	failed := func(err error) (*batch.Snapshot, bool, error) {
		if ctx.Err() != nil || !answered(err) {
			err = rs.e.Classify(ctx, err)
			rs.e.Observer().ScriptDone(engine.ScriptReadSections, time.Since(start), err)
			return nil, true, fmt.Errorf("store: read sections: %w", err)
		}
		return nil, false, err
	}
	hook := func(step int) {
		if o, ok := rs.e.Observer().(SnapshotStepObserver); ok {
			o.SnapshotStepRead(k.Slug, attempt, step)
		}
	}

	// Step 0.
	// claim-grants is watched too, and EXISTS tells whether the swarm has
	// grants: without any, every bound record read is absent (§12.4); with
	// some, the grants of the claims met are read with Redis's clock inside
	// the closing MULTI, under the same WATCH.
	watch := append(make([]string, 0, 4+len(names)), k.Revision(), k.Meta(), k.SectionRevisions(), k.Claims())
	for _, n := range names {
		watch = append(watch, k.Section(n))
	}
	cmds := make([]rueidis.Completed, 0, 5+len(names))
	cmds = append(cmds, dc.B().Watch().Key(watch...).Build().Pin(), dc.B().Get().Key(k.Revision()).Build().Pin(),
		dc.B().Hget().Key(k.Meta()).Field(protocol.FieldSectionRevisions).Build().Pin(),
		dc.B().Hgetall().Key(k.SectionRevisions()).Build().Pin(),
		dc.B().Exists().Key(k.Claims()).Build().Pin())
	for _, n := range names {
		cmds = append(cmds, dc.B().Hlen().Key(k.Section(n)).Build().Pin())
	}
	res := dc.DoMulti(ctx, cmds...)
	if err := res[0].Error(); err != nil {
		return failed(err)
	}
	watching = true
	head := make([]rueidis.RedisMessage, 3)
	for i, r := range res[1:4] {
		m, err := r.ToMessage()
		if err != nil && !rueidis.IsRedisNil(err) {
			return failed(err)
		}
		head[i] = m
	}
	grants, err := res[4].AsInt64()
	if err != nil {
		return failed(err)
	}
	var records int64
	hlen := make([]int64, len(names))
	for i, r := range res[5:] {
		v, err := r.AsInt64()
		if err != nil {
			return failed(err)
		}
		hlen[i] = v
		records += v
	}
	if records > int64(rs.limits.MaxSnapshotRecords) {
		rs.e.Observer().ScriptDone(engine.ScriptReadSections, time.Since(start), nil)
		return nil, true, fmt.Errorf("store: read sections: %w", &engine.TooLargeError{Records: records, Max: rs.limits.MaxSnapshotRecords})
	}
	hook(1)

	// The steps.
	sp := stepPlan{hlen: hlen, sizes: sizes, records: int64(rs.opts.SnapshotStepRecords), bytes: int64(rs.opts.SnapshotStepBytes)}
	plan := sp.steps()

	fieldMaps := make([]map[string]rueidis.RedisMessage, len(names))
	for i := range fieldMaps {
		fieldMaps[i] = map[string]rueidis.RedisMessage{}
	}
	execed := false
	for step := 0; step < len(plan); step++ {
		p := plan[step]
		// A new slice per round trip: one passed to DoMulti is never
		// reused (readSectionsMulti says why).
		cmds = make([]rueidis.Completed, 0, len(p.section)+2)
		switch p.kind {
		case 'a':
			for _, i := range p.section {
				cmds = append(cmds, dc.B().Hgetall().Key(k.Section(names[i])).Build().Pin())
			}
		case 'k':
			cmds = append(cmds, dc.B().Hkeys().Key(k.Section(names[p.section[0]])).Build().Pin())
		case 'm':
			cmds = append(cmds, dc.B().Hmget().Key(k.Section(names[p.section[0]])).Field(p.keys...).Build().Pin())
		}
		// HKEYS plans more steps; with grants, the MULTI comes after the
		// reads (it reads the grants of the claims they met).
		last := step == len(plan)-1 && p.kind != 'k' && grants == 0
		if last {
			cmds = append(cmds, dc.B().Multi().Build().Pin(), dc.B().Exec().Build().Pin())
		}
		res := dc.DoMulti(ctx, cmds...)
		reads := res
		if last {
			reads = res[:len(res)-2]
			if err := res[len(res)-2].Error(); err != nil {
				return failed(err)
			}
			watching = false // EXEC unwatches, answered or not
			if _, err := res[len(res)-1].ToArray(); err != nil {
				if rueidis.IsRedisNil(err) {
					return nil, false, nil // a watched key changed
				}
				watching = !answered(err)
				return failed(err)
			}
			execed = true
		}
		for j, r := range reads {
			if err := r.Error(); err != nil {
				return failed(err)
			}
			switch p.kind {
			case 'a':
				fields, err := r.AsMap()
				if err != nil {
					return nil, true, fmt.Errorf("store: read sections: %w: section %s: %v", engine.ErrMalformedReply, names[p.section[j]], err)
				}
				fieldMaps[p.section[j]] = fields
			case 'k':
				keys, err := r.AsStrSlice()
				if err != nil {
					return nil, true, fmt.Errorf("store: read sections: %w: section %s: %v", engine.ErrMalformedReply, names[p.section[0]], err)
				}
				more := sp.keySteps(p.section[0], keys)
				plan = append(plan[:step+1], append(more, plan[step+1:]...)...)
			case 'm':
				vals, err := r.ToArray()
				if err != nil || len(vals) != len(p.keys) {
					return nil, true, fmt.Errorf("store: read sections: %w: section %s", engine.ErrMalformedReply, names[p.section[0]])
				}
				for v, key := range p.keys {
					if !vals[v].IsNil() {
						fieldMaps[p.section[0]][key] = vals[v]
					}
				}
			}
		}
		if !last {
			hook(step + 2)
		}
	}
	var snap *batch.Snapshot
	var snapErr error
	var live batch.LiveClaims
	if !execed {
		// No read step after step 0 (every section emptied since the
		// checks), the last one was HKEYS of an empty section, or the
		// swarm has grants: then the grants of the claims of the bound
		// records read, and Redis's clock, in the MULTI.
		var met []string
		if grants > 0 {
			if snap, snapErr = rs.snapshotOf(names, head, fieldMaps); snapErr == nil {
				met = claimsMet(snap)
			}
		}
		cmds = append(make([]rueidis.Completed, 0, 4), dc.B().Multi().Build().Pin())
		if len(met) > 0 {
			cmds = append(cmds, dc.B().Time().Build().Pin(), dc.B().Hmget().Key(k.Claims()).Field(met...).Build().Pin())
		}
		res := dc.DoMulti(ctx, append(cmds, dc.B().Exec().Build().Pin())...)
		if err := res[0].Error(); err != nil {
			return failed(err)
		}
		watching = false
		exec, err := res[len(res)-1].ToArray()
		if err != nil {
			if rueidis.IsRedisNil(err) {
				return nil, false, nil
			}
			watching = !answered(err)
			return failed(err)
		}
		for _, m := range exec {
			if err := m.Error(); err != nil {
				// Redis's answer inside the MULTI (claim-grants of another
				// type): the script's error is the one to return.
				return nil, false, err
			}
		}
		if len(met) > 0 {
			if live, err = engine.ExecGrants(met, exec); err != nil {
				return nil, true, fmt.Errorf("store: read sections: %w", err)
			}
		}
	}
	rs.e.Observer().ScriptDone(engine.ScriptReadSections, time.Since(start), nil)
	if snap == nil && snapErr == nil {
		snap, snapErr = rs.snapshotOf(names, head, fieldMaps)
	}
	if snapErr != nil {
		return nil, true, snapErr
	}
	dropDead(snap, live)
	return snap, true, nil
}
