package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/redis/rueidis"
)

// grant is a lease granted in a race: the revision it committed at.
type grant struct {
	rev, epoch int64
	owner      string
	// expiresAt is the lease's end by Redis's clock (ms), unless forced:
	// the test rewrote the lease as expired at a moment it does not know.
	expiresAt int64
	forced    bool
}

// raceWrite is a fenced batch of a race and what its caller was told.
type raceWrite struct {
	key   string // its unique record
	owner string
	epoch int64
	rev   int64 // 0 unless committed
	res   string
	// expired: sent well after the lease ran out, with nobody taking over.
	expired bool
	// order is who went first when the race was sequenced: "h", the
	// holder's write answered before the takeover began; "t", the taker
	// granted before the holder's write was sent; "" when they raced.
	order string
	// expiresAt is the lease's end by Redis's clock (ms) as granted; the
	// test may end it earlier (grant.forced), never later. sentMs and
	// recvMs are this process's clock (the same as Redis's: one host)
	// just before the batch was sent and just after its answer, so the
	// script's fence check ran at a time in [sentMs, recvMs].
	expiresAt, sentMs, recvMs int64
}

// writtenValue is what every race write puts: who wrote it at which epoch.
type writtenValue struct {
	Owner string `json:"owner"`
	Epoch int64  `json:"epoch"`
	Race  int    `json:"race"`
}

// leaseRacer runs races on one swarm and keeps what happened.
type leaseRacer struct {
	slug       string
	holder     *client.Client // through replica 1
	taker      *client.Client // through replica 2
	rng        *rand.Rand
	mu         sync.Mutex
	grants     []grant
	writes     []raceWrite
	unexpected []string
	// late counts committed writes whose log entry's time is at or after
	// their lease's end; lateMax is the largest gap, in ms.
	late, lateMax int64
}

// failed reports whether a race went wrong.
func (lr *leaseRacer) failed() bool {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return len(lr.unexpected) > 0
}

func (lr *leaseRacer) fail(format string, args ...any) {
	lr.mu.Lock()
	lr.unexpected = append(lr.unexpected, fmt.Sprintf(format, args...))
	lr.mu.Unlock()
}

// acquire asks for the lease until it is granted (the previous holder's
// short lease runs out within ms), and records the grant.
func (lr *leaseRacer) acquire(c *client.Client, owner string, ttl time.Duration) (client.Lease, time.Time, bool) {
	for attempt := 0; attempt < 2000; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		l, rev, err := c.Acquire(ctx, lr.slug, owner, ttl)
		cancel()
		var le *client.LeaseError
		switch {
		case err == nil:
			lr.mu.Lock()
			lr.grants = append(lr.grants, grant{rev: rev, epoch: l.Epoch, owner: owner, expiresAt: l.ExpiresAtMs})
			lr.mu.Unlock()
			return l, time.Now(), true
		case errors.As(err, &le) && errors.Is(err, client.ErrLeaseHeld):
			time.Sleep(min(max(le.RetryAfter, 200*time.Microsecond), 5*time.Millisecond))
		default:
			lr.fail("Acquire(%s): %v", owner, err)
			return client.Lease{}, time.Time{}, false
		}
	}
	lr.fail("Acquire(%s): still held after 2000 attempts", owner)
	return client.Lease{}, time.Time{}, false
}

// write reads x, pauses, waits for after (when not nil: closed), then sends
// a fenced batch putting x and the writer's own record, and records the
// outcome.
func (lr *leaseRacer) write(c *client.Client, race int, who string, l client.Lease, ttl time.Duration, granted time.Time, pause time.Duration, useNow, nameOwner, expired bool, order string, after <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	x, _, err := c.Get(ctx, lr.slug, "claims", "x")
	if err != nil {
		lr.fail("race %d %s: Get(x): %v", race, who, err)
		return
	}
	var expected int64
	if x != nil {
		expected = x.Revision
	}
	time.Sleep(pause) // the holder stalls between its read and its write
	if after != nil {
		<-after
	}
	f := &client.Fence{Epoch: l.Epoch}
	if nameOwner {
		f.Owner = l.Owner
	}
	if useNow {
		// Redis's now, estimated from the grant: it can only make the
		// check stricter.
		f.NowMs = l.ExpiresAtMs - ttl.Milliseconds() + time.Since(granted).Milliseconds()
	}
	value, _ := json.Marshal(writtenValue{Owner: l.Owner, Epoch: l.Epoch, Race: race})
	w := raceWrite{key: fmt.Sprintf("w-%d-%s", race, who), owner: l.Owner, epoch: l.Epoch, expired: expired,
		order: order, expiresAt: l.ExpiresAtMs, sentMs: time.Now().UnixMilli()}
	rev, err := c.Batch(ctx, lr.slug, f, []client.Write{
		putW("claims", "x", expected, string(value)),
		putW("claims", w.key, 0, string(value)),
	})
	w.recvMs = time.Now().UnixMilli()
	switch {
	case err == nil:
		w.rev, w.res = rev, "ok"
	case errors.Is(err, client.ErrLeaseStale):
		w.res = "stale"
	case errors.Is(err, client.ErrConflict):
		w.res = "conflict"
	default:
		lr.fail("race %d %s: Batch: %v", race, who, err)
		return
	}
	lr.mu.Lock()
	lr.writes = append(lr.writes, w)
	lr.mu.Unlock()
}

// race is one holder against one taker. The holder takes the lease, reads,
// stalls and writes. The taker, after a random delay, takes the lease over
// and writes: in most races (60%) the holder's lease is made to run out at
// that moment (its record rewritten with expires_at in the past, as its TTL
// running out would leave it), so no race waits; in others (25%) the lease
// (15-40 ms) runs out by Redis's clock while the taker asks again and again.
// In the rest (15%) nobody takes over, and the holder stalls 60-90 ms past
// its 5 ms lease: its write must be refused by expiry alone. The taker
// sometimes releases at the end. A third of the forced races are sequenced
// (the holder's write answered before the takeover begins: it must commit)
// and a third the other way (the holder's write sent only once the taker
// holds the lease: it must be refused as stale), so both outcomes are
// checked in every run whatever the box's speed; the rest race freely.
func (lr *leaseRacer) race(i int, rc rueidis.Client) {
	mode := lr.rng.IntN(100)
	forced, expired := mode < 60, mode >= 85
	order := ""
	switch {
	case mode < 20:
		order = "h"
	case mode < 40:
		order = "t"
	}
	ttlH := time.Duration(15+lr.rng.IntN(26)) * time.Millisecond
	pause := time.Duration(lr.rng.IntN(int(ttlH/time.Microsecond)*3/2)) * time.Microsecond
	delay := time.Duration(lr.rng.IntN(int(ttlH/time.Microsecond))) * time.Microsecond
	switch {
	case forced:
		ttlH = 10 * time.Second
		pause = time.Duration(lr.rng.IntN(15000)) * time.Microsecond
		delay = time.Duration(lr.rng.IntN(15000)) * time.Microsecond
	case expired:
		ttlH = 5 * time.Millisecond
		pause = ttlH + time.Duration(60_000+lr.rng.IntN(30_000))*time.Microsecond
	}
	useNowH, ownerH := lr.rng.IntN(2) == 0, lr.rng.IntN(3) != 0
	release := lr.rng.IntN(2) == 0

	h := fmt.Sprintf("holder-%d", i)
	lh, at, ok := lr.acquire(lr.holder, h, ttlH)
	if !ok {
		return
	}
	var takerGranted chan struct{}
	if order == "t" {
		takerGranted = make(chan struct{})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lr.write(lr.holder, i, "h", lh, ttlH, at, pause, useNowH, ownerH, expired, order, takerGranted)
	}()
	if expired || order == "h" {
		wg.Wait()
	}
	if expired {
		return
	}
	time.Sleep(delay)
	if forced {
		lr.mu.Lock()
		rev := lr.grants[len(lr.grants)-1].rev
		lr.grants[len(lr.grants)-1].forced = true
		lr.mu.Unlock()
		expired := fmt.Sprintf(`{"r":%d,"v":{"owner":%q,"epoch":%d,"expires_at":1}}`, rev, h, lh.Epoch)
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := rc.Do(ctx, rc.B().Hset().Key(key(lr.slug, "meta")).FieldValue().FieldValue("lease", expired).Build()).Error()
		cancel()
		if err != nil {
			lr.fail("race %d: expire the holder's lease: %v", i, err)
		}
	}
	tk := fmt.Sprintf("taker-%d", i)
	lt, at2, ok := lr.acquire(lr.taker, tk, time.Second)
	if takerGranted != nil {
		close(takerGranted)
	}
	if ok {
		lr.write(lr.taker, i, "t", lt, time.Second, at2, 0, false, true, false, order, nil)
		if release {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			_, err := lr.taker.Release(ctx, lr.slug, tk, lt.Epoch)
			cancel()
			if err != nil && !errors.Is(err, client.ErrLeaseStale) {
				lr.fail("race %d: Release: %v", i, err)
			}
		} else {
			// Let the next holder in at once, as if this lease ran out.
			expired := fmt.Sprintf(`{"r":%d,"v":{"owner":%q,"epoch":%d,"expires_at":1}}`, lr.lastGrantRev(), tk, lt.Epoch)
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			if err := rc.Do(ctx, rc.B().Hset().Key(key(lr.slug, "meta")).FieldValue().FieldValue("lease", expired).Build()).Error(); err != nil {
				lr.fail("race %d: expire the taker's lease: %v", i, err)
			}
			cancel()
		}
	}
	wg.Wait()
}

func (lr *leaseRacer) lastGrantRev() int64 {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.grants[len(lr.grants)-1].rev
}

// TestLeaseRaces runs 1,000 races (FAULTS_LEASE_RACES) of a holder that
// stalls between its read and its write against a takeover (see race), 8
// swarms at a time, holders half the time sending an estimate of Redis's
// clock as now_ms. Every answer is a legal one (committed or refused as
// stale: nobody else writes x between a racer's read and its write unless
// it holds the lease), and the sequenced races answer as their order
// dictates. Afterwards, from what Redis holds: epochs rise strictly from
// grant to grant; every committed write's owner held the lease, at the
// epoch it wrote, at the revision it committed (no grant in between: zero
// writes of a stale holder visible), so written epochs never go down; no
// write sent at or after its lease's end committed; every write refused
// as stale left nothing, every acknowledged one is there. How often the
// free races go either way depends on the box's speed: it is logged, not
// asserted.
func TestLeaseRaces(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: 1,000 lease races; run without -short")
	}
	seed := seedFor(t, 9001)
	races := envInt(t, "FAULTS_LEASE_RACES", 1000)
	const swarms = 8
	redis := redistest.Start(t)
	opts := server.Options{LeaseBounds: batch.LeaseBounds{MinTTLMs: 1, MaxTTLMs: 60_000}}
	r1 := startReplica(t, redis.URL(), opts)
	r2 := startReplica(t, redis.URL(), opts)
	holder, _ := dial(t, r1.addr)
	taker, _ := dial(t, r2.addr)
	rc := redis.Client(t)

	start := time.Now()
	racers := make([]*leaseRacer, swarms)
	var ran atomic.Int64
	var wg sync.WaitGroup
	for s := range racers {
		lr := &leaseRacer{slug: fmt.Sprintf("lease-race-%d", s), holder: holder, taker: taker,
			rng: rand.New(rand.NewPCG(uint64(seed), uint64(s)))}
		racers[s] = lr
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := s; i < races; i += swarms {
				lr.race(i, rc)
				ran.Add(1)
				if lr.failed() {
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d races on %d swarms in %v", ran.Load(), races, swarms, time.Since(start).Round(time.Millisecond))

	outcomes := map[string]int{}
	stale := 0
	for _, lr := range racers {
		for _, msg := range lr.unexpected {
			t.Error(msg)
		}
		for _, w := range lr.writes {
			outcomes[w.order+strings.SplitN(w.key, "-", 3)[2]+":"+w.res]++
		}
		stale += checkRaces(t, redis, lr)
	}
	t.Logf("outcomes (h: stalled holder, t: taker; prefixed h or t when the holder or the taker was made to go first): %v", outcomes)
	var late, lateMax int64
	for _, lr := range racers {
		late, lateMax = late+lr.late, max(lateMax, lr.lateMax)
	}
	t.Logf("%d committed writes carry a log time at or after their lease's end (the script checks the fence before it appends), by at most %d ms", late, lateMax)
	if stale > 0 {
		t.Errorf("%d writes of a stale holder are visible", stale)
	}
	// Both outcomes were checked: the sequenced races make them, whatever
	// the box's speed (a holder sequenced first is refused only when its
	// whole 10 s lease ran out before it was sent).
	if races >= 100 && (outcomes["hh:ok"] == 0 || outcomes["th:stale"] == 0) {
		t.Errorf("sequenced holders: %d committed when first, %d refused as stale when the taker went first; want both", outcomes["hh:ok"], outcomes["th:stale"])
	}
}

// checkRaces checks one swarm after its races (see TestLeaseRaces) and
// answers the number of visible writes of a stale holder.
func checkRaces(t *testing.T, redis *redistest.Server, lr *leaseRacer) int {
	t.Helper()
	log := readLog(t, redis.Client(t), lr.slug)
	if len(log) >= 1000 {
		t.Fatalf("%s: the log holds %d entries, capped: run fewer races per swarm", lr.slug, len(log))
	}
	byRev := map[int64]logEntry{}
	for _, e := range log {
		byRev[e.Revision] = e
	}
	grants := append([]grant(nil), lr.grants...)
	sort.Slice(grants, func(i, j int) bool { return grants[i].rev < grants[j].rev })
	for i, g := range grants {
		if i > 0 && g.epoch <= grants[i-1].epoch {
			t.Errorf("%s: grant at r%d has epoch %d after epoch %d at r%d", lr.slug, g.rev, g.epoch, grants[i-1].epoch, grants[i-1].rev)
		}
		if e, ok := byRev[g.rev]; !ok || e.Owner != g.owner || e.Records != 3 {
			t.Errorf("%s: grant to %s at r%d: log entry %+v, want owner %s and 3 records", lr.slug, g.owner, g.rev, e, g.owner)
		}
	}
	if n := len(grants); n > 0 {
		want := fmt.Sprintf(`{"r":%d,"v":%d}`, grants[n-1].rev, grants[n-1].epoch)
		if got := redis.Do(t, "HGET", key(lr.slug, "meta"), "epoch"); got != want {
			t.Errorf("%s: meta/epoch = %s, want %s", lr.slug, got, want)
		}
	}
	// holderAt answers the grant in force at revision rev.
	holderAt := func(rev int64) (grant, bool) {
		i := sort.Search(len(grants), func(i int) bool { return grants[i].rev >= rev })
		if i == 0 {
			return grant{}, false
		}
		return grants[i-1], true
	}

	// What Redis holds: every record of the claims section.
	fields := redis.DoArray(t, "HGETALL", key(lr.slug, "claims"))
	stored := map[string]struct {
		rev int64
		v   writtenValue
	}{}
	for i := 0; i+1 < len(fields); i += 2 {
		var rec struct {
			R int64        `json:"r"`
			V writtenValue `json:"v"`
		}
		if err := json.Unmarshal([]byte(fields[i+1]), &rec); err != nil {
			t.Fatalf("%s: claims/%s = %q: %v", lr.slug, fields[i], fields[i+1], err)
		}
		stored[fields[i]] = struct {
			rev int64
			v   writtenValue
		}{rec.R, rec.V}
	}
	staleVisible := 0
	type visible struct {
		rev   int64
		epoch int64
	}
	var order []visible
	for k, s := range stored {
		g, ok := holderAt(s.rev)
		if !ok || g.owner != s.v.Owner || g.epoch != s.v.Epoch {
			staleVisible++
			t.Errorf("%s: claims/%s written at r%d by %s at epoch %d, but the lease then was %+v", lr.slug, k, s.rev, s.v.Owner, s.v.Epoch, g)
		}
		e, ok := byRev[s.rev]
		if !ok || e.Owner != s.v.Owner {
			t.Errorf("%s: claims/%s at r%d: log entry %+v, want owner %s", lr.slug, k, s.rev, e, s.v.Owner)
		}
		// The log entry's id is Redis's clock when XADD ran, at the end of
		// the script; the fence was checked by TIME at its start. A process
		// descheduled mid-script shows some ms between the two, however
		// many the box's load makes: counted, not asserted (each write's
		// send time is checked against its lease's end below).
		if ms := entryMs(t, e); ok && !g.forced && ms >= g.expiresAt {
			lr.late++
			lr.lateMax = max(lr.lateMax, ms-g.expiresAt)
		}
		if k != "x" {
			order = append(order, visible{s.rev, s.v.Epoch})
		}
	}
	sort.Slice(order, func(i, j int) bool { return order[i].rev < order[j].rev })
	for i := 1; i < len(order); i++ {
		if order[i].epoch < order[i-1].epoch {
			t.Errorf("%s: the write at r%d has epoch %d, below epoch %d written at r%d", lr.slug, order[i].rev, order[i].epoch, order[i-1].epoch, order[i-1].rev)
		}
	}
	for _, w := range lr.writes {
		holder := strings.HasSuffix(w.key, "-h")
		switch {
		case w.res != "ok" && w.res != "stale":
			t.Errorf("%s: %s answered %s, want committed or refused as stale (nobody else writes x without the lease)", lr.slug, w.key, w.res)
		case w.expired && w.res != "stale":
			t.Errorf("%s: %s was sent 60-90 ms after its lease ran out and answered %s, want stale", lr.slug, w.key, w.res)
		case w.res == "ok" && w.sentMs >= w.expiresAt:
			// The fence is checked after the send: by then the lease
			// had ended (or been ended earlier still by the test).
			staleVisible++
			t.Errorf("%s: %s sent at %d ms committed, but its lease ended at %d ms", lr.slug, w.key, w.sentMs, w.expiresAt)
		case holder && w.order == "t" && w.res != "stale":
			t.Errorf("%s: %s was sent after the taker was granted the lease and answered %s, want stale", lr.slug, w.key, w.res)
		case (!holder || w.order == "h") && w.res == "stale" && w.recvMs < w.expiresAt:
			// Nobody takes a taker's lease, nor a holder's sequenced
			// first, while it writes: only its end refuses it.
			t.Errorf("%s: %s answered stale at %d ms, before its lease's end at %d ms, with nobody taking over", lr.slug, w.key, w.recvMs, w.expiresAt)
		}
		s, ok := stored[w.key]
		switch {
		case w.res == "ok" && (!ok || s.rev != w.rev):
			t.Errorf("%s: %s acknowledged at r%d, stored %+v (present %v)", lr.slug, w.key, w.rev, s, ok)
		case w.res != "ok" && ok:
			staleVisible++
			t.Errorf("%s: %s was refused (%s) but is stored at r%d", lr.slug, w.key, w.res, s.rev)
		}
	}
	return staleVisible
}

// entryMs answers the ms part of a log entry's stream id: Redis's clock
// when the entry was added.
func entryMs(t *testing.T, e logEntry) int64 {
	t.Helper()
	ms, _, _ := strings.Cut(e.ID, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil && e.ID != "" {
		t.Fatalf("log entry id %q: %v", e.ID, err)
	}
	return n
}
