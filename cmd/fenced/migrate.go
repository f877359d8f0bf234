package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store"
)

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
	// Timeout bounds each swarm's migration.
	Timeout time.Duration `default:"60s" help:"Give up on one swarm after this long."`
}

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
	if c.RedisURL == "" && os.Getenv("AGENTIHOOKS_SWARM_REDIS_URL") == "" {
		return errors.New("migrate needs a Redis: set --redis-url, FENCED_REDIS_URL or AGENTIHOOKS_SWARM_REDIS_URL")
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, closeStore, err := c.open(log)
	if err != nil {
		return err
	}
	defer closeStore()
	if st.Cluster() {
		return errors.New("migrate: the document layout exists on standalone Redis only; on Redis Cluster there is nothing to migrate (document swarms there are refused)")
	}
	slugs := []string{c.Slug}
	if c.All {
		if slugs, err = st.DocumentSlugs(e.ctx); err != nil {
			return err
		}
	}
	var failed []string
	written, moved := 0, 0
	for _, slug := range slugs {
		line, n, err := c.one(e, st, slug)
		if err != nil {
			failed = append(failed, slug)
			fmt.Fprintf(e.stdout, "%s: failed: %v\n", slug, err)
			continue
		}
		if n > 0 {
			moved++
		}
		written += n
		fmt.Fprintln(e.stdout, line)
	}
	if c.All {
		verb := "moved"
		if c.DryRun {
			verb = "would move"
		}
		fmt.Fprintf(e.stdout, "%d swarms: %s %d, %d records, %d failed\n", len(slugs), verb, moved, written, len(failed))
	}
	if len(failed) > 0 {
		return fmt.Errorf("migrate: %d swarm(s) failed: %s", len(failed), strings.Join(failed, ", "))
	}
	return nil
}

// one migrates a swarm and answers its line and the records written.
func (c *migrateCmd) one(e *env, st *store.Store, slug string) (string, int, error) {
	ctx, cancel := context.WithTimeout(e.ctx, c.Timeout)
	defer cancel()
	m, err := st.Migrate(ctx, slug, c.DryRun)
	if err != nil {
		return "", 0, err
	}
	switch {
	case m.NoState:
		return slug + ": no fencing state; 0 records written", 0, nil
	case m.AlreadyMoved:
		return slug + ": already on per record keys; 0 records written", 0, nil
	}
	var b strings.Builder
	if c.DryRun {
		fmt.Fprintf(&b, "%s: would write %d records (dry run: nothing written)", slug, m.Records)
	} else {
		fmt.Fprintf(&b, "%s: %d records written at revision %d", slug, m.Records, m.Revision)
	}
	for _, s := range m.Sections {
		if !c.DryRun {
			break
		}
		fmt.Fprintf(&b, "\n  %-14s %7d records %10d bytes", s.Name, s.Records, s.Bytes)
	}
	return b.String(), m.Records, nil
}
