package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

// CommitScriptArgs returns the KEYS and ARGV that Commit sends to the commit
// script for b, for benchmarks and tools that call the script directly
// (internal/bench). b must have passed batch.Limits.CheckBatch.
func (s *Store) CommitScriptArgs(b *batch.Batch) (keys, args []string) {
	_, keys, args = s.commitArgs(s.keys(b.Slug), b)
	return keys, args
}

// ExecCommitScript runs the commit script (the by-name variant when keys
// carry by-name) once with keys and args as built by
// CommitScriptArgs, through this Store's client (by SHA, EVAL on NOSCRIPT),
// and returns the committed revision. It is the bare script call for
// benchmarks and tools: any answer but OK is an error quoting the reply,
// without Commit's mapping to domain errors and without its Cluster layout
// retry.
func (s *Store) ExecCommitScript(ctx context.Context, keys, args []string) (int64, error) {
	sc := s.commitScriptOf(keys)
	reply, err := replyStrings(s.exec(ctx, sc, keys, args))
	if err != nil {
		return 0, fmt.Errorf("store: commit script: %w", classify(ctx, err))
	}
	if len(reply) < 2 || reply[0] != protocol.ReplyOK {
		return 0, fmt.Errorf("store: commit script answered %q", reply)
	}
	return parseInt(reply[1])
}

// slugOf is the hash tag of a swarm key.
func slugOf(key string) string {
	_, rest, _ := strings.Cut(key, "{")
	slug, _, _ := strings.Cut(rest, "}")
	return slug
}

// commitScriptOf is the commit script that keys (as CommitScriptArgs built
// them) are for: the by-name variant when they carry by-name.
func (s *Store) commitScriptOf(keys []string) *script {
	if len(keys) > 4 && keys[4] == s.keys(slugOf(keys[0])).byName() {
		return commitByNameScript
	}
	return commitScript
}

// CommitCommand is the command Commit sends to Redis for keys and args (as
// CommitScriptArgs built them): FCALL of the commit function when this
// Store calls the function library, else EVALSHA of the script; for
// benchmarks that account for the bytes sent.
func (s *Store) CommitCommand(ctx context.Context, keys, args []string) []string {
	sc := s.commitScriptOf(keys)
	head := []string{"EVALSHA", sc.sha}
	if s.useFunctions(ctx, sc) {
		head = []string{"FCALL", sc.fn}
	}
	return append(append(append(head, strconv.Itoa(len(keys))), keys...), args...)
}
