package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/docstore"
)

// Exit statuses of "fenced migrate" (docs/migration.md): 0 every swarm
// named moved, was on the records already or has no state (a dry run:
// planned); exitFailed a swarm was refused or failed and nothing was
// written for it (also for bad flags); exitUnknown no swarm failed but the
// outcome of at least one move is unknown (Redis did not answer it): run it
// again, a repeat is safe.
const (
	exitFailed  = 1
	exitUnknown = 3
)

// exitError is an error that ends fenced with its own exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// exitCode is the exit status fenced ends with after err (0: nil).
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	return exitFailed
}

// migrateCmd is the configuration of "fenced migrate": moving swarms from
// the document layout onto per-record keys (the AdminService.Migrate RPC
// does the same for one swarm).
type migrateCmd struct {
	redisFlags
	// Slug names the swarm; empty with --all.
	Slug string `arg:"" optional:"" help:"The swarm's slug (or --all)."`
	// All migrates every document swarm of the bucket.
	All bool `name:"all" help:"Migrate every swarm with a document in P:state:fencing:current, one at a time; a failure on one does not stop the others (non-zero exit)."`
	// WritersUpgraded confirms that every reader and writer reads records.
	WritersUpgraded bool `name:"writers-upgraded" help:"Confirm that every live fencing reader and writer reads and writes per record keys (older readers read only the document). Required."`
	// DryRun prints the plan and writes nothing.
	DryRun bool `name:"dry-run" help:"Print the plan (records and value bytes per section) and write nothing."`
	// Quiet prints the bare count of records written, for scripts.
	Quiet bool `name:"quiet" short:"q" help:"Print only the number of records written (with --all: their total), one line; what failed goes to stderr, and the exit status says how it went."`
	// Sections are the sections fenced serves: a document holding any
	// other is refused before anything is written.
	Sections []string `env:"FENCED_SECTIONS" default:"executions,archive,intents,orphans,grants,registrations,claims,journals,fences,operations" help:"Section names fenced serves besides meta, comma-separated (as fenced serve's --sections): a document holding another section is refused before anything is written."`
	// Timeout bounds each swarm's migration.
	Timeout time.Duration `default:"60s" help:"Give up on one swarm after this long: a move that loses to the swarm's writers is planned again (1 ms doubling to 250 ms, jittered) until then; each call to Redis is bounded by --redis-timeout within it."`
	// RedisTimeout bounds every call to Redis (as serve's).
	RedisTimeout time.Duration `name:"redis-timeout" env:"FENCED_REDIS_TIMEOUT" default:"3s" help:"Longest one call waits for Redis (a read of the document, the move): past it the attempt is tried again, within --timeout."`
}

// migrateOutcome is what one swarm's migration came to.
type migrateOutcome int

const (
	migrateDone migrateOutcome = iota
	migrateFailed
	migrateUnknown
)

func (c *migrateCmd) Run(e *env) error {
	if !c.WritersUpgraded {
		return errors.New("--writers-upgraded not given: " + batch.WritersNotUpgraded)
	}
	if c.All == (c.Slug != "") {
		return errors.New("name one swarm or pass --all")
	}
	if c.Slug != "" {
		if err := batch.CheckSlug(c.Slug); err != nil {
			return fmt.Errorf("slug: %w", err)
		}
	}
	if c.Timeout <= 0 || c.RedisTimeout < time.Millisecond {
		return errors.New("--timeout must be above 0 and --redis-timeout at least 1ms")
	}
	// The section names are checked as serve checks them; the other limits
	// play no part in a migration.
	limits := batch.DefaultLimits()
	limits.Sections = c.Sections
	if err := limits.Check(); err != nil {
		return fmt.Errorf("--sections: %w", err)
	}
	if c.RedisURL == "" && os.Getenv("AGENTIHOOKS_SWARM_REDIS_URL") == "" {
		return errors.New("migrate needs a Redis: set --redis-url, FENCED_REDIS_URL or AGENTIHOOKS_SWARM_REDIS_URL")
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var o store.Options
	o.Engine.RedisTimeout, o.Docs.Sections = c.RedisTimeout, c.Sections
	st, closeStore, err := c.open(log, o)
	if err != nil {
		return err
	}
	defer closeStore()
	if st.Cluster() {
		return errors.New("migrate: the document layout exists on standalone Redis only; on Redis Cluster there is nothing to migrate (document swarms there are refused)")
	}
	slugs := []string{c.Slug}
	if c.All {
		ctx, cancel := context.WithTimeout(e.ctx, c.Timeout)
		slugs, err = st.DocumentSlugs(ctx)
		cancel()
		if err != nil {
			return err
		}
	}
	// out gets the human lines (stdout), or, with --quiet, only those of
	// what failed (stderr).
	out := e.stdout
	if c.Quiet {
		out = e.stderr
	}
	var failed, unknown []string
	written, moved := 0, 0
	for _, slug := range slugs {
		line, n, outcome := c.one(e, st, slug)
		switch outcome {
		case migrateFailed:
			failed = append(failed, slug)
		case migrateUnknown:
			unknown = append(unknown, slug)
		default:
			if n > 0 {
				moved++
			}
			written += n
			if c.Quiet {
				continue
			}
		}
		fmt.Fprintln(out, line)
	}
	if c.Quiet {
		fmt.Fprintln(e.stdout, strconv.Itoa(written))
	} else if c.All {
		verb := "moved"
		if c.DryRun {
			verb = "would move"
		}
		fmt.Fprintf(out, "%d swarms: %s %d, %d records, %d failed", len(slugs), verb, moved, written, len(failed))
		if len(unknown) > 0 {
			fmt.Fprintf(out, ", %d unknown", len(unknown))
		}
		fmt.Fprintln(out)
	}
	switch {
	case len(failed) > 0:
		return &exitError{exitFailed, fmt.Errorf("migrate: %d swarm(s) failed, nothing written for them: %s%s", len(failed), strings.Join(failed, ", "), unknownNote(unknown))}
	case len(unknown) > 0:
		return &exitError{exitUnknown, fmt.Errorf("migrate: the outcome of %d move(s) is unknown: %s; run it again: a repeat is safe", len(unknown), strings.Join(unknown, ", "))}
	}
	return nil
}

// unknownNote names the swarms whose outcome is unknown, after a failure.
func unknownNote(unknown []string) string {
	if len(unknown) == 0 {
		return ""
	}
	return fmt.Sprintf("; the outcome of %d move(s) is unknown: %s (run it again: a repeat is safe)", len(unknown), strings.Join(unknown, ", "))
}

// one migrates a swarm and answers its line, the records written and how
// it went.
func (c *migrateCmd) one(e *env, st *store.Store, slug string) (string, int, migrateOutcome) {
	ctx, cancel := context.WithTimeout(e.ctx, c.Timeout)
	defer cancel()
	m, err := st.Migrate(ctx, slug, c.DryRun)
	switch {
	case errors.Is(err, docstore.ErrOutcomeUnknown):
		return fmt.Sprintf("%s: outcome unknown: %v", slug, err), 0, migrateUnknown
	case err != nil:
		return fmt.Sprintf("%s: failed: %v", slug, err), 0, migrateFailed
	case m.NoState:
		return slug + ": no fencing state; 0 records written", 0, migrateDone
	case m.AlreadyMoved:
		return slug + ": already on per record keys; 0 records written", 0, migrateDone
	}
	var b strings.Builder
	if c.DryRun {
		fmt.Fprintf(&b, "%s: would write %d records (dry run: nothing written)", slug, m.Records)
		for _, s := range m.Sections {
			fmt.Fprintf(&b, "\n  %-14s %7d records %10d bytes", s.Name, s.Records, s.Bytes)
		}
	} else {
		fmt.Fprintf(&b, "%s: %d records written at revision %d", slug, m.Records, m.Revision)
	}
	return b.String(), m.Records, migrateDone
}
