package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// The reaper (docs/design/12-claims.md §12.5): every fenced replica ends
// the claims whose grant lapsed and deletes the records bound to claims
// that ended (released, lapsed, or taken over by a new grant), in steps of
// one reap.lua run each, without any caller asking. Replicas racing on one
// swarm are harmless: every step re-checks the grant and the queue in the
// script.

// DefaultClaimReapInterval is --claim-reap-interval's default: how long
// the reaper waits between two passes over the swarms that hold claims.
const DefaultClaimReapInterval = time.Second

// reapPlanNames is how many lapsed and how many queued claims one look at
// a swarm (reap_plan.lua) answers; reapRounds bounds the looks at one swarm
// in one pass, so that a pass ends even when claims lapse as fast as it
// reaps (the next pass goes on).
const (
	reapPlanNames = 64
	reapRounds    = 1000
)

// ReapObserver is implemented by an Observer that counts what the reaper
// did (fenced_claims_reaped_total, fenced_claim_records_reaped_total):
// ClaimsReaped after each reaper step that ended claims or deleted
// records, with how many of each.
type ReapObserver interface {
	ClaimsReaped(claims, records int)
}

// ReapResult is what one reaper pass (ReapOnce) or one swarm's part of it
// (ReapSwarm) did.
type ReapResult struct {
	// Swarms is how many swarms were looked at.
	Swarms int
	// Lapsed is how many claims' lapses were committed (one log entry
	// with claim kind "lapsed" each).
	Lapsed int
	// Records is how many bound records were deleted.
	Records int
	// Steps is how many reap.lua runs there were.
	Steps int
	// Pruned is how many slugs left the claim-swarms set (no grant and no
	// queued reclaim left).
	Pruned int
}

func (r *ReapResult) add(o ReapResult) {
	r.Swarms += o.Swarms
	r.Lapsed += o.Lapsed
	r.Records += o.Records
	r.Steps += o.Steps
	r.Pruned += o.Pruned
}

// RunReaper runs ReapOnce every interval until ctx ends (interval <= 0:
// it returns at once), on the ticks where it takes the reaper's turn
// (takeReaperTurn): of several replicas, one walks the swarms per
// interval. A pass that fails is logged (slog, Warn) and the next one runs
// at the next tick: nothing is retried sooner.
func (ls *Leases) RunReaper(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	token := reaperToken()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !ls.takeReaperTurn(ctx, token, interval) {
			continue
		}
		r, err := ls.ReapOnce(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			ls.e.Log().Warn("claim reaper pass failed; the next runs at the next tick", "err", err,
				"lapsed", r.Lapsed, "records", r.Records)
		case r.Lapsed > 0 || r.Records > 0:
			ls.e.Log().Debug("claim reaper pass", "swarms", r.Swarms, "lapsed", r.Lapsed, "records", r.Records,
				"steps", r.Steps, "pruned", r.Pruned)
		}
	}
}

// reaperTurn is the key of the reaper's turn (protocol.ReaperTurnKey).
func (ls *Leases) reaperTurn() string { return ls.e.Key(protocol.ReaperTurnKey) }

// reaperToken names this process's reaper in the turn key: host, pid and
// a random part (two Stores of one process have two tokens).
func reaperToken() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// takeReaperTurn answers whether this reaper has the pass: SET
// P:fence:reaper-turn token NX PX interval, which one reaper of any number
// wins until the key expires one interval later, whoever wins next (the
// turn lasts the shortest interval of the replicas ticking meanwhile). Passes of two
// reapers may still overlap (a pass longer than the interval, a key lost
// with Redis), which the steps are safe against (each re-reads the grant
// and the queue in its script). A turn that cannot be asked (Redis down,
// an ACL without the key) takes the pass anyway: a redundant pass costs
// Redis time, a skipped one leaves lapsed claims unreaped. Nor does a
// key that would hold the turn past this reaper's interval: its expiry,
// none (set by hand, another type) or a later one (a replica with a longer
// interval, a hand-set TTL), is cut to one interval from now (PEXPIRE LT),
// so the turn passes on within this reaper's interval; when that cannot
// be done (PEXPIRE refused: an ACL, Redis before 7.0) the pass runs.
func (ls *Leases) takeReaperTurn(ctx context.Context, token string, interval time.Duration) bool {
	c := ls.e.Client()
	bctx, cancel := ls.e.Bound(ctx, 0)
	defer cancel()
	ms := max(1, interval.Milliseconds())
	err := c.Do(bctx, c.B().Set().Key(ls.reaperTurn()).Value(token).Nx().PxMilliseconds(ms).Build()).Error()
	if rueidis.IsRedisNil(err) {
		// Held. An expiry later than one interval from now (none: set by
		// hand, another type; a long one) is brought down to it.
		var cut int64
		cut, err = c.Do(bctx, c.B().Pexpire().Key(ls.reaperTurn()).Milliseconds(ms).Lt().Build()).AsInt64()
		if err == nil {
			if cut == 1 {
				ls.e.Log().Debug("claim reaper: the turn's expiry was later than this interval; cut to it", "key", ls.reaperTurn())
			}
			return false
		}
	}
	if err != nil && ctx.Err() == nil {
		ls.e.Log().Debug("claim reaper: the turn could not be asked; this pass runs anyway", "err", err)
	}
	return true
}

// ReapOnce is one reaper pass: every slug of the claim-swarms set (SSCAN,
// 100 a page) is reaped by ReapSwarm. It goes on past a swarm that fails
// and answers what it did and the first error (ErrUnavailable, context
// errors, *RedisError, or a swarm's refusal as ReapSwarm's).
func (ls *Leases) ReapOnce(ctx context.Context) (ReapResult, error) {
	var total ReapResult
	var first error
	c := ls.e.Client()
	cursor := uint64(0)
	for {
		bctx, cancel := ls.e.Bound(ctx, 0)
		e, err := c.Do(bctx, c.B().Sscan().Key(ls.claimSwarms()).Cursor(cursor).Count(100).Build()).AsScanEntry()
		cancel()
		if err != nil {
			err = ls.e.Classify(ctx, err)
			ls.e.Observer().RedisFailed("claim_swarms", err)
			return total, fmt.Errorf("store: reap: %w", err)
		}
		for _, slug := range e.Elements {
			r, err := ls.ReapSwarm(ctx, slug)
			total.add(r)
			if err != nil && first == nil {
				first = err
			}
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
		}
		if e.Cursor == 0 {
			return total, first
		}
		cursor = e.Cursor
	}
}

// ReapSwarm reaps one swarm: it looks at the swarm (reap_plan.lua: the
// claims whose grant lapsed by Redis's clock, the reclaims queued) and runs
// one reap.lua step per claim named, again until nothing is left (at most
// reapRounds looks). A swarm with no grant and no queued reclaim leaves
// the claim-swarms set: SREM, then a second look, and SADD again when a
// grant or a reclaim appeared meanwhile (an Acquire registers its swarm
// before and after its grant, so the two cannot both miss it). A step that
// fails is logged (slog, Warn) and the others go on; when every step of a
// look fails, ReapSwarm answers the first error: a step's refusal
// (*CorruptError, *LimitError), ErrUnavailable, context
// errors, *RedisError.
func (ls *Leases) ReapSwarm(ctx context.Context, slug string) (ReapResult, error) {
	r := ReapResult{Swarms: 1}
	k := ls.e.Keys(slug)
	for range reapRounds {
		grants, queued, names, err := ls.reapPlan(ctx, k)
		if err != nil {
			return r, err
		}
		if len(names) == 0 {
			if grants == 0 && queued == 0 {
				pruned, err := ls.pruneClaimSwarm(ctx, k)
				if pruned {
					r.Pruned++
				}
				return r, err
			}
			return r, nil
		}
		var first error
		failed := 0
		for _, name := range names {
			lapsed, deleted, err := ls.reapStep(ctx, k, name)
			r.Steps++
			if lapsed {
				r.Lapsed++
			}
			r.Records += deleted
			if err != nil {
				// One claim's refusal (a grant another writer corrupted)
				// does not hold up the others.
				failed++
				if first == nil {
					first = err
				}
				if ctx.Err() != nil {
					return r, first
				}
			}
		}
		if failed == len(names) {
			// No step went through: the rest waits for the next pass.
			return r, first
		}
		if first != nil {
			ls.e.Log().Warn("claim reaper step failed", "slug", k.Slug, "err", first)
		}
	}
	return r, nil
}

// reapPlan is one look at a swarm: its number of grants and of queued
// reclaims, and the names to step on (lapsed first, then queued; a name may
// appear twice).
func (ls *Leases) reapPlan(ctx context.Context, k engine.Keys) (grants, queued int64, names []string, err error) {
	bctx, cancel := ls.e.Bound(ctx, 0)
	defer cancel()
	reply, err := ls.e.Exec(bctx, reapPlanScript, []string{k.Claims(), k.ClaimExpiry(), k.ClaimSweep()},
		[]string{strconv.Itoa(reapPlanNames)}).AsStrSlice()
	if err != nil {
		return 0, 0, nil, fmt.Errorf("store: reap %s: %w", k.Slug, ls.e.Classify(ctx, err))
	}
	if len(reply) < 3 {
		return 0, 0, nil, fmt.Errorf("store: reap %s: %w: %q", k.Slug, engine.ErrMalformedReply, reply)
	}
	nums, err := engine.ParseInts(reply[0], reply[1], reply[2])
	if err != nil || nums[2] > int64(len(reply)-3) {
		return 0, 0, nil, fmt.Errorf("store: reap %s: %w: %q", k.Slug, engine.ErrMalformedReply, reply)
	}
	return nums[0], nums[1], reply[3:], nil
}

// reapStep runs reap.lua once on the claim name: it answers whether the
// step committed the claim's lapse and how many records it deleted.
func (ls *Leases) reapStep(ctx context.Context, k engine.Keys, name string) (lapsed bool, deleted int, err error) {
	bctx, cancel := ls.e.Bound(ctx, ls.e.Wait().Duration())
	defer cancel()
	mode := protocol.ModeNone
	if !ls.e.Cluster() {
		mode = protocol.ModeStamp
	}
	reply, _, err := ls.e.ExecCommitting(bctx, k, reapScript, ls.claimKeys(k, name),
		[]string{mode, name, strconv.Itoa(ls.opts.ClaimReapBudget)}, ls.e.Wait())
	if err != nil {
		return false, 0, fmt.Errorf("store: reap %s claim %s: %w", k.Slug, name, err)
	}
	if reply[0] != protocol.ReplyOK || len(reply) != 6 {
		if e := engine.SwarmRefusal(reply); e != nil {
			return false, 0, fmt.Errorf("store: reap %s claim %s: %w", k.Slug, name, e)
		}
		return false, 0, fmt.Errorf("store: reap %s claim %s: %w: %q", k.Slug, name, engine.ErrMalformedReply, reply)
	}
	n, err := strconv.Atoi(reply[3])
	if err != nil {
		return false, 0, fmt.Errorf("store: reap %s claim %s: %w: %q", k.Slug, name, engine.ErrMalformedReply, reply)
	}
	lapsed = reply[2] == "1"
	if reply[5] == "1" {
		ls.byNameStale(k.Slug)
	}
	if o, ok := ls.e.Observer().(ReapObserver); ok && (lapsed || n > 0) {
		claims := 0
		if lapsed {
			claims = 1
		}
		o.ClaimsReaped(claims, n)
	}
	return lapsed, n, nil
}

// pruneClaimSwarm removes the swarm from the claim-swarms set, then looks
// again and adds it back when it holds a grant or a queued reclaim by then.
// It answers whether the swarm stayed out.
func (ls *Leases) pruneClaimSwarm(ctx context.Context, k engine.Keys) (bool, error) {
	c := ls.e.Client()
	bctx, cancel := ls.e.Bound(ctx, 0)
	err := c.Do(bctx, c.B().Srem().Key(ls.claimSwarms()).Member(k.Slug).Build()).Error()
	cancel()
	if err != nil {
		err = ls.e.Classify(ctx, err)
		ls.e.Observer().RedisFailed("claim_swarms", err)
		return false, fmt.Errorf("store: reap %s: %w", k.Slug, err)
	}
	grants, queued, _, err := ls.reapPlan(ctx, k)
	if err == nil && grants == 0 && queued == 0 {
		return true, nil
	}
	// Back in the set: a grant or a reclaim appeared, or the look failed
	// (the swarm stays registered rather than risk leaving a grant unseen).
	if rerr := ls.registerClaims(ctx, k.Slug); rerr != nil {
		return false, errors.Join(err, fmt.Errorf("store: reap %s: %w", k.Slug, rerr))
	}
	return false, err
}
