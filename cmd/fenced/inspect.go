package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/docstore"
)

// inspectCmd is the configuration of "fenced inspect": a read-only look at
// one swarm, what an operator would otherwise ask Redis by hand.
type inspectCmd struct {
	redisFlags
	// Slug names the swarm.
	Slug string `arg:"" help:"The swarm's slug."`
	// Sections are the sections to count (the same list as serve's).
	Sections []string `env:"FENCED_SECTIONS" default:"executions,archive,intents,orphans,grants,registrations,claims,journals,fences,operations" help:"Section names besides meta, comma-separated (as for serve)."`
	// JSON switches the output to one JSON object.
	JSON bool `name:"json" help:"Print one JSON object instead of text, for scripts."`
	// LogEntries is how many of the newest log entries to show.
	LogEntries int `name:"log-entries" default:"10" help:"How many of the newest log entries to show (0: none)."`
	// PageSize is the HSCAN page size of the by-name check.
	PageSize int `name:"page-size" default:"1000" help:"Fields read per HSCAN page when checking by-name against executions: large sections are read page by page, never in one call."`
	// Repair rebuilds by-name's index and by-name before inspecting.
	Repair bool `name:"repair" help:"Rebuild by-name's index from executions and set by-name from it first (writes; bounded steps of --page-size records, batches keep committing meanwhile), then inspect."`
	// Timeout bounds the whole inspection.
	Timeout time.Duration `default:"30s" help:"Give up after this long."`
}

// maxMismatchLines bounds the mismatches the text output lists; --json
// lists them all.
const maxMismatchLines = 50

func (c *inspectCmd) Run(e *env) error {
	if err := batch.CheckSlug(c.Slug); err != nil {
		return fmt.Errorf("slug: %w", err)
	}
	limits := batch.DefaultLimits()
	limits.Sections = c.Sections
	if err := limits.Check(); err != nil {
		return fmt.Errorf("configuration: --sections: %w", err)
	}
	if c.LogEntries < 0 || c.PageSize < 1 || c.Timeout <= 0 {
		return errors.New("configuration: --log-entries must be >= 0, --page-size >= 1, --timeout > 0")
	}
	if c.RedisURL == "" && os.Getenv("AGENTIHOOKS_SWARM_REDIS_URL") == "" {
		return errors.New("inspect needs a Redis: set --redis-url, FENCED_REDIS_URL or AGENTIHOOKS_SWARM_REDIS_URL")
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, closeStore, err := c.open(log, store.Options{})
	if err != nil {
		return err
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(e.ctx, c.Timeout)
	defer cancel()
	var repair *repairReport
	if c.Repair {
		r, err := st.RebuildByName(ctx, c.Slug, c.PageSize)
		if err != nil {
			return err
		}
		repair = &repairReport{Clean: r.Clean, Busy: r.Busy, Rounds: r.Rounds, Steps: r.Steps, Scanned: r.Scanned,
			MembersRemoved: r.Removed, EntriesFixed: r.Fixed, EntriesRemoved: r.Extra}
	}
	rep, err := inspect(ctx, st, c.Slug, c.Sections, c.LogEntries, c.PageSize)
	if err != nil {
		return err
	}
	rep.ByName.Repair = repair
	rep.Prefix = c.KeyPrefix
	if c.JSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.writeText(e.stdout)
}

// inspection is what inspect prints: the JSON of --json, field for field.
type inspection struct {
	Slug string `json:"slug"`
	// Prefix is the key prefix; Topology "standalone" or "cluster".
	Prefix   string `json:"key_prefix"`
	Topology string `json:"topology"`
	// Layout is "records", "document" or "none".
	Layout   string         `json:"layout"`
	Revision int64          `json:"revision"`
	Stamp    stampReport    `json:"stamp"`
	Lease    leaseReport    `json:"lease"`
	Sections []sectionCount `json:"sections"`
	ByName   byNameReport   `json:"by_name"`
	Log      logReport      `json:"log"`
	// Problems lists meta records that could not be read.
	Problems []string `json:"problems"`
}

// stampReport is the standalone stamp in P:state:fencing:current.
type stampReport struct {
	// Kept is false on Cluster, where the stamp is never written.
	Kept  bool   `json:"kept"`
	Key   string `json:"key,omitempty"`
	Field string `json:"field,omitempty"`
	// Value is the stamp as stored; null when absent (or not kept).
	Value *string `json:"value"`
	// Agrees: the stamp names a revision from 1 to the swarm revision (that
	// of the commit that put the swarm on the records), or both are absent.
	Agrees bool `json:"agrees"`
	// Status: "agrees", "differs", "absent", "not kept on Cluster".
	Status string `json:"status"`
}

// leaseReport is meta/lease by Redis's clock.
type leaseReport struct {
	Present     bool   `json:"present"`
	Owner       string `json:"owner,omitempty"`
	Epoch       int64  `json:"epoch,omitempty"`
	ExpiresAtMs int64  `json:"expires_at_ms,omitempty"`
	// Live: the lease expires after NowMs; RemainingMs is what is left
	// (negative: expired that long ago).
	Live        bool  `json:"live"`
	RemainingMs int64 `json:"remaining_ms,omitempty"`
	NowMs       int64 `json:"now_ms"`
	// LastEpoch is meta/epoch (the last epoch ever granted) and
	// LeaderChanges meta/leader_changes.
	LastEpoch     int64 `json:"last_epoch"`
	LeaderChanges int64 `json:"leader_changes"`
}

// sectionCount is one section's record count and revision.
type sectionCount struct {
	Name     string `json:"name"`
	Records  int64  `json:"records"`
	Revision int64  `json:"revision"`
}

// byNameReport is by-name checked against executions.
type byNameReport struct {
	Entries    int64 `json:"entries"`
	Expected   int   `json:"expected"`
	Executions int64 `json:"executions_scanned"`
	Consistent bool  `json:"consistent"`
	// ChangedDuringCheck: the swarm revision moved while the sections were
	// scanned; rerun before trusting a mismatch.
	ChangedDuringCheck bool             `json:"changed_during_check"`
	Mismatches         []byNameMismatch `json:"mismatches"`
	Unreadable         []string         `json:"unreadable"`
	// Index is by-name's index: IndexConsistent when it holds one
	// member per executions record, none missing, not flagged;
	// IndexEntries records it holds, IndexMissing executions records it
	// lacks, IndexStale its flag (a batch found it not reflecting
	// executions: rebuilt in the background, or by --repair).
	IndexConsistent bool  `json:"index_consistent"`
	IndexEntries    int64 `json:"index_entries"`
	IndexMissing    int64 `json:"index_missing"`
	IndexStale      bool  `json:"index_stale"`
	// Repair is what --repair did; absent without it.
	Repair *repairReport `json:"repair,omitempty"`
}

// repairReport is a rebuild of by-name's index (byname.Rebuild).
type repairReport struct {
	Clean bool `json:"clean"`
	// Busy: another rebuild (a fenced replica) held the swarm's claim;
	// nothing was done.
	Busy           bool  `json:"busy"`
	Rounds         int   `json:"rounds"`
	Steps          int64 `json:"steps"`
	Scanned        int64 `json:"scanned"`
	MembersRemoved int64 `json:"members_removed"`
	EntriesFixed   int64 `json:"entries_fixed"`
	EntriesRemoved int64 `json:"entries_removed"`
}

type byNameMismatch struct {
	Name    string `json:"name"`
	Problem string `json:"problem"`
	Want    string `json:"want,omitempty"`
	Got     string `json:"got,omitempty"`
}

// logReport is the newest entries of the log stream, newest first.
type logReport struct {
	Length  int64      `json:"length"`
	Entries []logEntry `json:"entries"`
}

type logEntry struct {
	ID        string `json:"id"`
	Revision  int64  `json:"revision"`
	Owner     string `json:"owner"`
	Records   int64  `json:"records"`
	RequestID string `json:"request_id,omitempty"`
}

var layoutNames = map[docstore.Layout]string{docstore.LayoutNone: "none", docstore.LayoutRecords: "records", docstore.LayoutDocument: "document"}

// inspect reads everything inspect shows, read-only.
func inspect(ctx context.Context, st *store.Store, slug string, sections []string, logN, pageSize int) (*inspection, error) {
	o, err := st.Overview(ctx, slug, sections)
	if err != nil {
		return nil, err
	}
	check, err := st.CheckByName(ctx, slug, pageSize)
	if err != nil {
		return nil, err
	}
	entries, err := st.LogEntries(ctx, slug, logN)
	if err != nil {
		return nil, err
	}
	r := &inspection{
		Slug:     slug,
		Topology: "standalone",
		Layout:   layoutNames[o.Layout],
		Revision: o.Revision,
		Problems: o.Problems,
	}
	if r.Problems == nil {
		r.Problems = []string{}
	}
	if st.Cluster() {
		r.Topology = "cluster"
	}
	r.Stamp = stampReport{Kept: o.StampKept, Agrees: o.StampAgrees(), Status: "not kept on Cluster"}
	if o.StampKept {
		r.Stamp.Key, r.Stamp.Field = st.CurrentKey(), slug+":records"
		switch {
		case o.StampPresent:
			v := o.Stamp
			r.Stamp.Value = &v
			r.Stamp.Status = "differs"
			if r.Stamp.Agrees {
				r.Stamp.Status = "agrees"
			}
		case r.Stamp.Agrees:
			r.Stamp.Status = "absent (no commit yet)"
		default:
			r.Stamp.Status = "absent"
		}
	}
	r.Lease = leaseReport{NowMs: o.NowMs, LastEpoch: o.Epoch, LeaderChanges: o.LeaderChanges}
	if l := o.Lease; l != nil {
		r.Lease.Present, r.Lease.Owner, r.Lease.Epoch, r.Lease.ExpiresAtMs = true, l.Owner, l.Epoch, l.ExpiresAtMs
		r.Lease.RemainingMs = l.ExpiresAtMs - o.NowMs
		r.Lease.Live = r.Lease.RemainingMs > 0
	}
	for _, name := range sections {
		r.Sections = append(r.Sections, sectionCount{Name: name, Records: o.Records[name], Revision: o.SectionRevisions[name]})
	}
	r.ByName = byNameReport{
		Entries:            o.ByName,
		Expected:           check.Names,
		Executions:         check.Executions,
		Consistent:         len(check.Mismatches) == 0 && len(check.Unreadable) == 0,
		IndexConsistent:    check.IndexMissing == 0 && !o.ByNameIndexStale && o.ByNameIndex == check.Executions,
		IndexEntries:       o.ByNameIndex,
		IndexMissing:       check.IndexMissing,
		IndexStale:         o.ByNameIndexStale,
		ChangedDuringCheck: check.RevisionBefore != check.RevisionAfter,
		Mismatches:         make([]byNameMismatch, len(check.Mismatches)),
		Unreadable:         check.Unreadable,
	}
	if r.ByName.Unreadable == nil {
		r.ByName.Unreadable = []string{}
	}
	for i, m := range check.Mismatches {
		r.ByName.Mismatches[i] = byNameMismatch(m)
	}
	r.Log = logReport{Length: o.LogEntries, Entries: make([]logEntry, len(entries))}
	for i, e := range entries {
		r.Log.Entries[i] = logEntry(e)
	}
	return r, nil
}

// writeText prints r for a person: a block of facts, the section table,
// the by-name check and the newest log entries, each aligned.
func (r *inspection) writeText(out io.Writer) error {
	var b strings.Builder
	r.writeFacts(&b)
	r.writeSections(&b)
	r.writeByName(&b)
	r.writeLog(&b)
	_, err := io.WriteString(out, b.String())
	return err
}

// writeFacts writes the block of facts: the swarm, its layout, revision,
// stamp and lease, and the problems found.
func (r *inspection) writeFacts(b *strings.Builder) {
	p := func(label, format string, args ...any) {
		fmt.Fprintf(b, "%-10s%s\n", label, fmt.Sprintf(format, args...))
	}
	p("swarm", "%s  (%s Redis, key prefix %s)", r.Slug, r.Topology, r.Prefix)
	switch r.Layout {
	case "none":
		p("layout", "none  (no fencing state: nothing was ever committed)")
	case "document":
		p("layout", "document  (one JSON document of older writers: fenced serves it whole; fenced migrate moves it onto per record keys)")
	default:
		p("layout", "%s", r.Layout)
	}
	p("revision", "%d", r.Revision)
	switch {
	case !r.Stamp.Kept:
		p("stamp", "not kept on Cluster")
	case r.Stamp.Value == nil:
		p("stamp", "%s  (%s field %s)", r.Stamp.Status, r.Stamp.Key, r.Stamp.Field)
	default:
		status := r.Stamp.Status
		if !r.Stamp.Agrees {
			status = "DIFFERS: above the revision, or not a revision (the stamp names the commit that put the swarm on the records, at or below the revision): a writer bypassed the records commit, or the stamp was damaged"
		}
		p("stamp", "%s: %s  (%s field %s)", *r.Stamp.Value, status, r.Stamp.Key, r.Stamp.Field)
	}
	l := r.Lease
	switch {
	case !l.Present:
		p("lease", "none")
	case l.Live:
		p("lease", "%s at epoch %d, live: %s left  (expires %s by Redis's clock)", strconv.Quote(l.Owner), l.Epoch, msDuration(l.RemainingMs), msTime(l.ExpiresAtMs))
	default:
		p("lease", "%s at epoch %d, EXPIRED %s ago  (at %s by Redis's clock)", strconv.Quote(l.Owner), l.Epoch, msDuration(-l.RemainingMs), msTime(l.ExpiresAtMs))
	}
	p("", "last epoch granted %d, leader changes %d, Redis's clock %s", l.LastEpoch, l.LeaderChanges, msTime(l.NowMs))
	for _, pr := range r.Problems {
		p("PROBLEM", "%s", pr)
	}
}

// writeSections writes the section table: each section's record count and
// revision, and by-name's entries.
func (r *inspection) writeSections(b *strings.Builder) {
	nameW, countW := len("section"), len("records")
	for _, s := range r.Sections {
		nameW = max(nameW, len(s.Name))
		countW = max(countW, len(strconv.FormatInt(s.Records, 10)))
	}
	fmt.Fprintf(b, "\n%-*s  %*s  %s\n", nameW, "section", countW, "records", "revision")
	for _, s := range r.Sections {
		fmt.Fprintf(b, "%-*s  %*d  %s\n", nameW, s.Name, countW, s.Records, dash(strconv.FormatInt(s.Revision, 10)))
	}
	fmt.Fprintf(b, "%-*s  %*d  %s\n", nameW, "by-name", countW, r.ByName.Entries, "(derived from executions)")
}

// writeByName writes the by-name check: whether by-name agrees with
// executions, the first mismatches, its index, a repair's outcome and the
// fields that are not records.
func (r *inspection) writeByName(b *strings.Builder) {
	bn := r.ByName
	summary := fmt.Sprintf("%d entries; executions: %d records, %d names", bn.Entries, bn.Executions, bn.Expected)
	if bn.Consistent {
		fmt.Fprintf(b, "\nby-name   consistent with executions  (%s)\n", summary)
	} else {
		fmt.Fprintf(b, "\nby-name   %d MISMATCH(ES) with executions  (%s)\n", len(bn.Mismatches), summary)
	}
	if bn.ChangedDuringCheck {
		fmt.Fprintf(b, "          the swarm changed during the check: rerun before trusting a mismatch\n")
	}
	if len(bn.Mismatches) > 0 {
		rows := [][]string{{"name", "problem", "want", "got"}}
		for i, m := range bn.Mismatches {
			if i == maxMismatchLines {
				break
			}
			rows = append(rows, []string{m.Name, m.Problem, dash(m.Want), dash(m.Got)})
		}
		table(b, rows)
		if n := len(bn.Mismatches) - maxMismatchLines; n > 0 {
			fmt.Fprintf(b, "          ... and %d more (--json lists all)\n", n)
		}
	}
	index := fmt.Sprintf("index   %d records, %d executions records missing", bn.IndexEntries, bn.IndexMissing)
	switch {
	case bn.IndexStale:
		index += ", STALE (a writer bypassed fenced: rebuilt in the background, or run with --repair)"
	case !bn.IndexConsistent:
		index += ", DIFFERS from executions (run with --repair)"
	default:
		index += ", consistent"
	}
	fmt.Fprintf(b, "          %s\n", index)
	if rp := bn.Repair; rp != nil {
		status := "clean"
		switch {
		case rp.Busy:
			status = "NOT DONE: another rebuild (fenced in the background) holds the swarm's claim; try again shortly"
		case !rp.Clean:
			status = "NOT CLEAN: batches kept finding it stale (a writer keeps bypassing fenced)"
		}
		fmt.Fprintf(b, "          repaired: %s; %d rounds, %d steps, %d records scanned, %d index members removed, %d entries set, %d removed\n",
			status, rp.Rounds, rp.Steps, rp.Scanned, rp.MembersRemoved, rp.EntriesFixed, rp.EntriesRemoved)
	}
	if len(bn.Unreadable) > 0 {
		fmt.Fprintf(b, "          not records (skipped): %s\n", strings.Join(bn.Unreadable, ", "))
	}
}

// writeLog writes the newest log entries.
func (r *inspection) writeLog(b *strings.Builder) {
	fmt.Fprintf(b, "\nlog       newest %d of %d entries\n", len(r.Log.Entries), r.Log.Length)
	if len(r.Log.Entries) > 0 {
		rows := [][]string{{"revision", "owner", "records", "request_id", "id"}}
		for _, e := range r.Log.Entries {
			owner := "-"
			if e.Owner != "" {
				owner = strconv.Quote(e.Owner)
			}
			rows = append(rows, []string{strconv.FormatInt(e.Revision, 10), owner, strconv.FormatInt(e.Records, 10), dash(e.RequestID), e.ID})
		}
		table(b, rows)
	}
}

// table writes rows as columns, indented under the labels, each column as
// wide as its widest cell.
func table(b *strings.Builder, rows [][]string) {
	w := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, row := range rows {
		fmt.Fprintf(w, "          %s\n", strings.Join(row, "\t"))
	}
	w.Flush()
}

// dash stands in for an empty value or a zero revision.
func dash(s string) string {
	if s == "" || s == "0" {
		return "-"
	}
	return s
}

// msDuration renders ms as a duration rounded for reading.
func msDuration(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	if d >= time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// msTime renders a Unix time in ms as UTC, to the ms.
func msTime(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}
