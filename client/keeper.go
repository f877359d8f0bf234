package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Keeper holds a swarm's lease for one owner: it acquires it, renews it in
// the background every third of its TTL (well before expiry), and gives the
// fence to pass to batches. Once the lease is lost (a renewal refused, none
// succeeding before the lease would expire, or a take-over heard on the
// swarm's Watch stream: a grant to another owner or at a later epoch) it
// stops renewing and closes Lost. Held is cheap and never calls the
// network. Whatever the Keeper believes, the server is the authority: a
// batch fenced with a lost lease is refused with ErrLeaseStale.
type Keeper struct {
	c     *Client
	slug  string
	name  string // the claim's (ClaimKeeper); "" for the swarm's lease
	owner string
	ttl   time.Duration
	epoch int64

	mu       sync.Mutex
	deadline time.Time // local: when the lease surely ends (monotonic clock)
	lostErr  error

	lost chan struct{}
	stop chan struct{}
	done chan struct{}
	// following ends when the take-over watch has stopped (follow).
	following chan struct{}
}

// Keep acquires the swarm's lease for owner with ttl, waiting while another
// owner holds it (as long as the server's RetryInfo says, until ctx is
// done), and asking again while too few replicas acknowledge the grant
// (ErrReplicationTimeout), then keeps it until Close or until it is lost.
// A renewal too few replicas acknowledged is not a renewal: the lease is
// counted from the last acknowledged one. Errors: ctx's, and any error of
// Acquire other than ErrLeaseHeld and ErrReplicationTimeout.
func (c *Client) Keep(ctx context.Context, slug, owner string, ttl time.Duration) (*Keeper, error) {
	return c.keep(ctx, slug, "", owner, ttl)
}

// KeepClaim is Keep for the swarm's claim name (a named lease,
// AcquireClaim): a worker keeping its claim on a task while it works on
// it. Errors: as Keep's.
func (c *Client) KeepClaim(ctx context.Context, slug, name, owner string, ttl time.Duration) (*ClaimKeeper, error) {
	k, err := c.keep(ctx, slug, name, owner, ttl)
	if err != nil {
		return nil, err
	}
	return &ClaimKeeper{k: k}, nil
}

// ClaimKeeper holds one claim of a swarm for one owner, as Keeper holds
// the swarm's lease: it renews it every third of its TTL, Held is cheap,
// Lost closes when the claim is lost, Close releases it. Its fence is
// Claim (for WithClaim); it has no Fence, since a claim is not the
// controller lease.
type ClaimKeeper struct{ k *Keeper }

// Claim is the fence for batches under this claim: pass it to
// WithClaim.
func (c *ClaimKeeper) Claim() *ClaimFence {
	return &ClaimFence{Name: c.k.name, Owner: c.k.owner, Epoch: c.k.epoch}
}

// Name is the claim's name.
func (c *ClaimKeeper) Name() string { return c.k.name }

// Owner is the claim's owner.
func (c *ClaimKeeper) Owner() string { return c.k.owner }

// Epoch is the claim's epoch: its fencing token.
func (c *ClaimKeeper) Epoch() int64 { return c.k.epoch }

// Held is Keeper.Held for the claim.
func (c *ClaimKeeper) Held() bool { return c.k.Held() }

// Lost is closed when the claim is lost; Err then says why.
func (c *ClaimKeeper) Lost() <-chan struct{} { return c.k.lost }

// Err is why the claim was lost (ErrLeaseStale, or the last renewal error
// when none succeeded in time); nil while held.
func (c *ClaimKeeper) Err() error { return c.k.Err() }

// Close stops renewing and releases the claim if it is still held; as
// Keeper.Close.
func (c *ClaimKeeper) Close(ctx context.Context) error { return c.k.Close(ctx) }

func (c *Client) keep(ctx context.Context, slug, name, owner string, ttl time.Duration) (*Keeper, error) {
	var sent time.Time
	var granted int64
	lease, err := backoff.Retry(ctx, func() (Lease, error) {
		sent = time.Now()
		l, rev, err := c.acquire(ctx, slug, name, owner, ttl)
		granted = rev
		var le *LeaseError
		switch {
		case err == nil:
			return l, nil
		case errors.As(err, &le) && errors.Is(err, ErrLeaseHeld):
			// Wait out the holder's lease; never longer than one TTL, so a
			// released lease is noticed soon.
			return l, &backoff.RetryAfterError{Duration: min(max(le.RetryAfter, time.Millisecond), ttl)}
		case errors.Is(err, ErrReplicationTimeout):
			// Too few replicas acknowledged the grant: it is not ours to
			// use. Asking again keeps the epoch the primary recorded and
			// waits for the replicas again.
			return l, err
		default:
			return l, backoff.Permanent(err)
		}
	}, backoff.WithMaxElapsedTime(0))
	if err != nil {
		return nil, errorf("keep %s: %w", leaseOf(slug, name), err)
	}
	k := &Keeper{
		c: c, slug: slug, name: name, owner: owner, ttl: ttl, epoch: lease.Epoch,
		deadline:  sent.Add(ttl),
		lost:      make(chan struct{}),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		following: make(chan struct{}),
	}
	go k.renew()
	go k.follow(granted)
	return k, nil
}

// follow watches the swarm from the grant's revision (from) and marks the
// lease lost as soon as the stream carries a take-over of it: for the
// swarm's lease a batch putting meta/lease fenced by another owner, or by
// this owner at a later epoch (the lease lapsed, a stalled process, and
// was granted again); for a claim its grant to another owner or at
// another epoch, or the end (release, lapse) of this grant. So Lost closes
// at once, not at the next renewal a third of the TTL later. A stream that
// ends (compacted, refused, the server away) is opened again from the last
// revision it yielded, with backoff, until the keeper stops or is lost; the
// renewals stay the keeper's own account of its lease meanwhile.
func (k *Keeper) follow(from int64) {
	defer close(k.following)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-k.stop:
		case <-k.lost:
		}
		cancel()
	}()
	wait := backoff.NewExponentialBackOff()
	wait.InitialInterval, wait.MaxInterval = 50*time.Millisecond, 5*time.Second
	for ctx.Err() == nil {
		for ev, err := range k.c.Watch(ctx, k.slug, from, WatchSections(batchMetaSection)) {
			if err != nil {
				if errors.Is(err, ErrRevisionCompacted) {
					from = 0 // what was missed cannot be read: from now on
				}
				break
			}
			wait.Reset()
			from = ev.Revision
			if why, holder := k.takenOver(ev); why != "" {
				k.markLost(&LeaseError{Kind: ErrLeaseStale, Holder: holder, Claim: k.name,
					Err: errorf("%s taken over (heard on its Watch stream at revision %d): %s", leaseOf(k.slug, k.name), ev.Revision, why)})
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait.NextBackOff()):
		}
	}
}

// batchMetaSection is the section of the swarm's own records, meta/lease
// among them.
const batchMetaSection = "meta"

// takenOver says how ev takes this keeper's lease over ("" when it does
// not), with the lease that took it over when ev tells it.
func (k *Keeper) takenOver(ev Event) (string, *Lease) {
	if k.name != "" {
		c := ev.Claim
		switch {
		case c == nil || c.Name != k.name:
			return "", nil
		case c.Kind == ClaimGranted && (c.Owner != k.owner || c.Epoch != k.epoch):
			return fmt.Sprintf("granted to %q at epoch %d", c.Owner, c.Epoch), &Lease{Owner: c.Owner, Epoch: c.Epoch, ExpiresAtMs: c.ExpiresAtMs}
		case (c.Kind == ClaimLapsed || c.Kind == ClaimReleased) && c.Epoch == k.epoch:
			return string(c.Kind), nil
		}
		return "", nil
	}
	for _, ch := range ev.Changes {
		if ch.Section != batchMetaSection || ch.Key != "lease" || ch.Delete {
			continue
		}
		// The record read with the event is the one it wrote when it is at
		// the event's revision (else a later event follows).
		var l struct {
			Owner     string `json:"owner"`
			Epoch     int64  `json:"epoch"`
			ExpiresAt int64  `json:"expires_at"`
		}
		var holder *Lease
		if r := ch.Record; r != nil && r.Revision == ev.Revision && json.Unmarshal(r.Value, &l) == nil {
			holder = &Lease{Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAt}
		}
		switch {
		case ev.Owner != k.owner:
			return fmt.Sprintf("granted to %q", ev.Owner), holder
		case holder != nil && holder.Epoch > k.epoch:
			// This owner's own name, a later epoch: another process of the
			// same owner took the lease after this one lapsed.
			return fmt.Sprintf("granted again to %q at epoch %d", ev.Owner, holder.Epoch), holder
		}
	}
	return "", nil
}

// Fence is the fence for batches under this lease.
func (k *Keeper) Fence() *Fence { return &Fence{Owner: k.owner, Epoch: k.epoch} }

// Epoch is the lease's epoch: the fencing token.
func (k *Keeper) Epoch() int64 { return k.epoch }

// Held reports whether the lease is still held as far as this process can
// tell: not lost, and its local deadline (measured from when the last
// successful renewal was sent) not passed. It never calls the network.
func (k *Keeper) Held() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lostErr == nil && time.Now().Before(k.deadline)
}

// Lost is closed when the lease is lost; Err then says why.
func (k *Keeper) Lost() <-chan struct{} { return k.lost }

// Err is why the lease was lost (ErrLeaseStale, or the last renewal error
// when none succeeded in time); nil while held.
func (k *Keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lostErr
}

func (k *Keeper) markLost(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lostErr == nil {
		k.lostErr = err
		close(k.lost)
	}
}

// renew extends the lease every ttl/3 until stopped or lost. A renewal
// that fails for any reason but ErrLeaseStale is retried at the next tick
// until the local deadline passes.
func (k *Keeper) renew() {
	defer close(k.done)
	ticker := time.NewTicker(k.ttl / 3)
	defer ticker.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-ticker.C:
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), k.ttl/3)
		_, _, err := k.c.renew(ctx, k.slug, k.name, k.owner, k.epoch, k.ttl)
		cancel()
		switch {
		case err == nil:
			k.mu.Lock()
			k.deadline = sent.Add(k.ttl)
			k.mu.Unlock()
		case errors.Is(err, ErrLeaseStale):
			k.markLost(err)
			return
		case !k.Held():
			k.markLost(errorf("%s not renewed before it expired: %w", leaseOf(k.slug, k.name), err))
			return
		}
	}
}

// Close stops renewing and releases the lease if it is still held. It
// answers the release's error (ErrLeaseStale when the lease was already
// lost).
func (k *Keeper) Close(ctx context.Context) error {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
	<-k.following
	if err := k.Err(); err != nil {
		return err
	}
	_, err := k.c.release(ctx, k.slug, k.name, k.owner, k.epoch)
	k.markLost(errorf("%s released", leaseOf(k.slug, k.name)))
	return err
}

// leaseOf names the swarm's lease or its claim name in messages.
func leaseOf(slug, name string) string {
	if name == "" {
		return "lease of " + slug
	}
	return "claim " + name + " of " + slug
}
