package store

import (
	"context"
	"fmt"

	"github.com/agentihooks/fenced/internal/batch"
)

// CommitScriptArgs returns the KEYS and ARGV that Commit sends to the commit
// script for b, for benchmarks and tools that call the script directly
// (internal/bench). b must have passed batch.Limits.CheckBatch.
func (s *Store) CommitScriptArgs(b *batch.Batch) (keys, args []string) {
	return s.commitArgs(s.keys(b.Slug), b)
}

// ExecCommitScript runs the commit script once with keys and args as built by
// CommitScriptArgs, through this Store's client (by SHA, EVAL on NOSCRIPT),
// and returns the committed revision. It is the bare script call for
// benchmarks and tools: any answer but OK is an error quoting the reply,
// without Commit's mapping to domain errors and without its Cluster layout
// retry.
func (s *Store) ExecCommitScript(ctx context.Context, keys, args []string) (int64, error) {
	reply, err := replyStrings(s.exec(ctx, commitScript, keys, args))
	if err != nil {
		return 0, fmt.Errorf("store: commit script: %w", classify(ctx, err))
	}
	if len(reply) < 2 || reply[0] != "OK" {
		return 0, fmt.Errorf("store: commit script answered %q", reply)
	}
	return parseInt(reply[1])
}
