package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// scriptRecorder is a rueidis client for a Store whose commits only say
// what they would send: every command passes through to Redis but the
// committing scripts' calls (FCALL, EVALSHA, EVAL), which it keeps,
// unsent. So (a) calls the commit script with exactly the bytes Commit
// sends (docs/design/03-fenced-batch.md §3: KEYS and ARGV are the store's to lay out)
// without the store exporting how it lays them out.
type scriptRecorder struct {
	rueidis.Client
	mu   sync.Mutex
	last []string
}

// Do keeps a script call and answers it with no reply (the Store's Commit
// then fails, which commitCommand ignores); any other command goes to
// Redis.
func (r *scriptRecorder) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	parts := cmd.Commands()
	switch parts[0] {
	case "FCALL", "EVALSHA", "EVAL":
		r.mu.Lock()
		r.last = slices.Clone(parts)
		r.mu.Unlock()
		return rueidis.RedisResult{}
	}
	return r.Client.Do(ctx, cmd)
}

// recorder is a Store over a scriptRecorder, with the same key prefix and
// function library as env's store, and the client it records over.
type recorder struct {
	rec    *scriptRecorder
	st     *store.Store
	client rueidis.Client
	// mu serializes commitCommand: one recorded call at a time.
	mu sync.Mutex
}

// newRecorder connects a recorder to url as store.Open would.
func newRecorder(url string) (*recorder, error) {
	opt, err := store.ClientOptions(url)
	if err != nil {
		return nil, err
	}
	client, err := store.NewClient(&opt)
	if err != nil {
		return nil, err
	}
	rec := &scriptRecorder{Client: client}
	st, err := store.New(rec, store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		client.Close()
		return nil, err
	}
	if err := st.LoadScripts(context.Background()); err != nil {
		st.Close()
		return nil, err
	}
	return &recorder{rec: rec, st: st, client: client}, nil
}

// commitCommand is the command Commit sends to Redis for bt: FCALL
// function (or EVALSHA sha) numkeys KEYS... ARGV... bt must have passed
// batch.Limits.CheckBatch.
func (e *env) commitCommand(b *testing.B, bt *batch.Batch) []string {
	b.Helper()
	r := e.rec
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec.mu.Lock()
	r.rec.last = nil
	r.rec.mu.Unlock()
	_, _ = r.st.Commit(context.Background(), bt) // fails: the recorder answers no reply
	r.rec.mu.Lock()
	cmd := r.rec.last
	r.rec.mu.Unlock()
	if len(cmd) < 3 {
		b.Fatalf("commitCommand: the store sent no script call for the batch (recorded %q)", cmd)
	}
	return cmd
}

// splitCommand cuts a script call (commitCommand's) into its head
// (command, function or SHA, numkeys), KEYS and ARGV.
func splitCommand(b *testing.B, cmd []string) (head, keys, args []string) {
	b.Helper()
	n, err := strconv.Atoi(cmd[2])
	if err != nil || n < 0 || 3+n > len(cmd) {
		b.Fatalf("script call %q: numkeys %q", cmd, cmd[2])
	}
	return cmd[:3], cmd[3 : 3+n], cmd[3+n:]
}

// callScript sends a script call as commitCommand recorded it, by the
// recorder's client (not recorded), and returns the committed revision:
// the bare call of (a), any answer but OK an error quoting the reply.
func (e *env) callScript(ctx context.Context, head, keys, args []string) (int64, error) {
	c := e.rec.client
	reply, err := c.Do(ctx, c.B().Arbitrary(head...).Keys(keys...).Args(args...).Build()).AsStrSlice()
	if err != nil {
		return 0, fmt.Errorf("commit script: %w", err)
	}
	if len(reply) < 2 || reply[0] != protocol.ReplyOK {
		return 0, fmt.Errorf("commit script answered %q", reply)
	}
	return strconv.ParseInt(reply[1], 10, 64)
}
