package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/agentihooks/fenced/internal/protocol"
)

// by-name and its index (byname.lua holds the rule and the index layout).
// A batch that puts or deletes in executions keeps both in step, finding a
// name's next holder in O(log n); when it finds that the index does not
// reflect executions (writers that bypass fenced), it flags the index and
// the Store rebuilds it here, outside the batch path, one bounded script at
// a time.

var (
	byNameRebuildScript = newScript(ScriptByNameRebuild, luaByNameRebuild)
	byNameCheckScript   = newScript(ScriptByNameCheck, luaByNameCheck)
)

// DefaultByNamePage is the records (or index members, or names) one
// rebuild step reads by default. Measured (BenchmarkByNameScriptTime,
// 200,000 executions of ~140 bytes, rebuilt from nothing): 200 a step ran
// 1.2 ms of Redis time at the median, 1.8 ms at the longest (2,004 steps,
// 2.9 s in all); 500 a step ran 4.5 ms median and 12 ms longest on a busier
// machine. A batch waits at most one step.
const DefaultByNamePage = 200

// errBusy stops a rebuild whose claim another rebuild took.
var errBusy = errors.New("another rebuild holds the claim")

// maxRebuildRounds bounds the passes of one RebuildByName: a batch that
// finds the index stale while it is rebuilt makes the next pass needed.
const maxRebuildRounds = 3

// ByNameRebuild reports a RebuildByName.
type ByNameRebuild struct {
	// Clean: the index holds one member per executions field, backed by
	// its record, by-name names each range's top, and no batch flagged the
	// index during the last pass; the flag is cleared.
	Clean bool
	// Rounds is the number of passes run (at most 3).
	Rounds int
	// Steps is the number of scripts run; Scanned the executions fields
	// read (HSCAN may return a field twice).
	Steps, Scanned int64
	// Removed is the index members removed (not backed by their record),
	// Fixed the by-name entries set and Extra those removed (a name with
	// no record).
	Removed, Fixed, Extra int64
	// Busy: another rebuild of the swarm holds the claim (another fenced
	// replica, or inspect --repair); this one stopped (or never began)
	// and left the work to it.
	Busy bool
}

// A rebuild claims its swarm's index for rebuildClaimTTL, renewed every
// rebuildClaimRenew, so that fenced replicas that all see a stale index do
// not all rebuild it; a rebuild that dies leaves a claim that expires.
const (
	rebuildClaimTTL   = 30 * time.Second
	rebuildClaimRenew = 5 * time.Second
)

// RebuildByName rebuilds a swarm's by-name index from its executions and
// sets by-name from it, in place, pageSize records a script (at least 1;
// 0: DefaultByNamePage), so that no step is a long script; batches keep
// committing meanwhile. Passes: add every record's member, remove members
// no record backs, set each name's entry to its top, remove entries of
// names with no record, then clear the stale flag unless a batch raised it
// since the pass began (then another pass, at most 3 in all). The result
// says whether it ended clean. One rebuild runs per swarm at a time, across
// fenced replicas: while another holds the swarm's claim, it answers Busy
// without rebuilding. Every step is bounded by the Redis timeout; the
// whole rebuild by ctx alone. Errors: ErrUnavailable, context errors,
// *RedisError, ErrMalformedReply.
func (s *Store) RebuildByName(ctx context.Context, slug string, pageSize int) (r *ByNameRebuild, err error) {
	if pageSize <= 0 {
		pageSize = DefaultByNamePage
	}
	k := s.keys(slug)
	keys := []string{k.section(executions), k.byName(), k.byNameIndex(), k.revision()}
	page := strconv.Itoa(pageSize)
	r = &ByNameRebuild{}
	call := func(ctx context.Context, name, cursor, n string) ([]string, error) {
		r.Steps++
		// Each step is bounded by the Redis timeout on its own: a whole
		// rebuild may take longer than one call may wait.
		ctx, cancel := s.bound(ctx, 0)
		defer cancel()
		return replyStrings(s.exec(ctx, byNameRebuildScript, keys, []string{name, cursor, n}))
	}
	var token [8]byte
	_, _ = rand.Read(token[:])
	claim := hex.EncodeToString(token[:])
	ttl := strconv.FormatInt(rebuildClaimTTL.Milliseconds(), 10)
	claimed := time.Time{}
	renew := func() error {
		if time.Since(claimed) < rebuildClaimRenew {
			return nil
		}
		reply, err := call(ctx, protocol.RebuildClaim, claim, ttl)
		if err != nil {
			return fmt.Errorf("store: rebuild by-name of %s: claim: %w", slug, s.classify(ctx, err))
		}
		if len(reply) != 1 || reply[0] != protocol.ReplyOK && reply[0] != protocol.ReplyBusy {
			return fmt.Errorf("store: rebuild by-name of %s: claim: %w: %q", slug, ErrMalformedReply, reply)
		}
		if reply[0] == protocol.ReplyBusy {
			r.Busy = true
			return errBusy
		}
		claimed = time.Now()
		return nil
	}
	if err := renew(); err != nil {
		if r.Busy {
			return r, nil
		}
		return r, err
	}
	defer func() {
		// Released even when ctx ended: a claim left behind would hold
		// other rebuilds off until it expires.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if _, rerr := call(rctx, protocol.RebuildRelease, claim, "0"); rerr != nil && err == nil {
			err = fmt.Errorf("store: rebuild by-name of %s: release: %w", slug, classify(rctx, rerr))
		}
		if errors.Is(err, errBusy) {
			err = nil
		}
	}()
	step := func(name, cursor string) (string, int64, error) {
		if err := renew(); err != nil {
			return "", 0, err
		}
		reply, err := call(ctx, name, cursor, page)
		if err != nil {
			return "", 0, fmt.Errorf("store: rebuild by-name of %s: %s: %w", slug, name, s.classify(ctx, err))
		}
		if len(reply) == 1 {
			return reply[0], 0, nil
		}
		if len(reply) != 2 {
			return "", 0, fmt.Errorf("store: rebuild by-name of %s: %s: %w: %q", slug, name, ErrMalformedReply, reply)
		}
		n, err := strconv.ParseInt(reply[1], 10, 64)
		if err != nil {
			return "", 0, fmt.Errorf("store: rebuild by-name of %s: %s: %w: %q", slug, name, ErrMalformedReply, reply)
		}
		return reply[0], n, nil
	}
	// pages runs a step from its first cursor until it answers the last.
	pages := func(name, first, last string, total *int64) error {
		cursor := first
		for {
			next, n, err := step(name, cursor)
			if err != nil {
				return err
			}
			*total += n
			if next == last {
				return nil
			}
			cursor = next
		}
	}
	for r.Rounds < maxRebuildRounds {
		r.Rounds++
		flag, _, err := step(protocol.RebuildStart, "")
		if err != nil {
			return r, err
		}
		if err := pages(protocol.RebuildAdd, "0", "0", &r.Scanned); err != nil {
			return r, err
		}
		if err := pages(protocol.RebuildVerify, "", "", &r.Removed); err != nil {
			return r, err
		}
		if err := pages(protocol.RebuildNames, "", "", &r.Fixed); err != nil {
			return r, err
		}
		if err := pages(protocol.RebuildExtras, "0", "0", &r.Extra); err != nil {
			return r, err
		}
		done, _, err := step(protocol.RebuildFinish, flag)
		if err != nil {
			return r, err
		}
		if done == protocol.ReplyClean {
			r.Clean = true
			return r, nil
		}
	}
	return r, nil
}

// WithByNameRebuild makes the Store rebuild a swarm's by-name index in the
// background (RebuildByName, pageSize records a step; 0:
// DefaultByNamePage) as soon as a commit reports it stale, one rebuild per
// swarm at a time, and tells done of each (done may be nil). Close stops
// them.
func WithByNameRebuild(pageSize int, done func(slug string, r *ByNameRebuild, err error)) Option {
	return func(s *Store) {
		ctx, cancel := context.WithCancel(context.Background())
		s.rebuilds = &rebuilds{ctx: ctx, cancel: cancel, page: pageSize, done: done, running: map[string]bool{}, ended: map[string]time.Time{}}
	}
}

// rebuildTimeout bounds one background rebuild; rebuildCooldown is how
// long after one ends no other starts for the same swarm (a writer that
// keeps bypassing fenced would otherwise keep one running).
const (
	rebuildTimeout  = 10 * time.Minute
	rebuildCooldown = 10 * time.Second
)

// rebuilds are the background by-name rebuilds of a Store.
type rebuilds struct {
	ctx    context.Context
	cancel context.CancelFunc
	page   int
	done   func(string, *ByNameRebuild, error)
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]bool
	ended   map[string]time.Time
	closed  bool
}

// rebuildInBackground starts a rebuild of slug's by-name index unless one
// runs, one ended less than rebuildCooldown ago, or the Store has no
// WithByNameRebuild.
func (s *Store) rebuildInBackground(slug string) {
	rb := s.rebuilds
	if rb == nil {
		return
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.closed || rb.running[slug] || time.Since(rb.ended[slug]) < rebuildCooldown {
		return
	}
	for s, t := range rb.ended { // forget old ends: the map stays small
		if time.Since(t) >= rebuildCooldown {
			delete(rb.ended, s)
		}
	}
	rb.running[slug] = true
	rb.wg.Add(1)
	go func() {
		defer rb.wg.Done()
		ctx, cancel := context.WithTimeout(rb.ctx, rebuildTimeout)
		r, err := s.RebuildByName(ctx, slug, rb.page)
		cancel()
		rb.mu.Lock()
		delete(rb.running, slug)
		rb.ended[slug] = time.Now()
		rb.mu.Unlock()
		if rb.done != nil && !errors.Is(err, context.Canceled) {
			rb.done(slug, r, err)
		}
	}()
}

// stop cancels the background rebuilds and waits for them.
func (rb *rebuilds) stop() {
	if rb == nil {
		return
	}
	rb.mu.Lock()
	rb.closed = true
	rb.mu.Unlock()
	rb.cancel()
	rb.wg.Wait()
}
