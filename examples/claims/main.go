// Command claims is a worker that takes one wake (a task) of a swarm by
// claiming the name wake/<id> (a claim: a named lease within the swarm,
// docs/design/12-claims.md) and keeping it with a ClaimKeeper while it
// works. Every --interval it commits one step of progress to the record
// operations/wake-<id> ({"step":N,"by":owner,"epoch":E}) through
// client.Update, every write fenced by the claim (client.WithClaim). It
// prints one line per commit:
//
//	committed wake=1 step=4 revision=17960791808610 epoch=1796079187256 owner=a
//
// Beside it, each step puts operations/wake-<id>-scratch (the same
// value), bound to the claim (Txn.PutBound, §12.4): a record that ends
// with the claim. A worker that has just taken the claim reads it and
// prints
//
//	scratch: operations/wake-1-scratch absent (none written, or bound to a claim that ended)
//
// or, when the worker before it is still in its claim's grant (a worker
// acquiring its own live claim again), the record's value.
//
// It does not ask its ClaimKeeper whether it still holds the claim before
// writing: the server's fence is the authority. A worker paused past its
// TTL still believes it owns the wake when it resumes; its next write is
// refused, and it prints
//
//	refused: claim wake/1 stale (holder b epoch 1796079190002)
//
// and exits with status 3. SIGINT or SIGTERM releases the claim and exits
// with status 0.
//
// A wake delivered again while another worker holds its claim is refused:
// with --wait 0 the worker asks once and, if the claim is held, prints
//
//	held: claim wake/1 held by a epoch 1796079187256 until 1796079189256 ms
//
// and exits with status 4. With --wait d it waits up to d for the claim
// (as long as the server's RetryInfo says, asking again), then prints the
// same line and exits 4 if it is still held.
//
// The demo, against a running fenced (fenced serve --redis-url ...). Build
// the binary first, so that the pid printed at start is the worker's own:
//
//	go build -o claims ./examples/claims
//	./claims --owner a --wake 1            # terminal 1: claims wake/1, prints its pid, commits
//	./claims --owner b --wake 1 --wait 0   # terminal 2: refused at once, exits 4
//	./claims --owner b --wake 1 --wait 1m  # terminal 2: waits for the claim
//	kill -STOP <pid of a>                  # terminal 3: after 2 s, b takes over at a higher epoch
//	kill -CONT <pid of a>                  # a writes once more, is refused, exits 3
//
// Flags: --addr (fenced's gRPC address, default localhost:7420), --slug
// (default demo-swarm), --wake (the wake's id, default 1), --owner (default
// <hostname>-<pid>), --ttl (the claim's TTL, default 2s), --wait (how long
// to wait for a held claim, default 0: refuse at once), --interval (between
// steps, default 200ms), --count (steps before releasing and exiting; 0,
// the default, runs until a signal).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/agentihooks/fenced/client"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	exitStale = 3 // a write was refused: the claim is gone
	exitHeld  = 4 // the wake's claim is held by another worker
)

// section holds the progress records.
const section = "operations"

// config is the worker's configuration, from flags.
type config struct {
	// addr is fenced's gRPC address.
	addr string
	// slug names the swarm.
	slug string
	// wake is the wake's id: the claim is wake/<wake>, the record
	// operations/wake-<wake>.
	wake string
	// owner names this worker in the claim and the log.
	owner string
	// ttl is the claim's TTL; the ClaimKeeper renews every third of it.
	ttl time.Duration
	// wait bounds the wait for a claim another worker holds; 0 refuses at
	// once.
	wait time.Duration
	// interval is the pause between steps.
	interval time.Duration
	// count is how many steps to commit before releasing and exiting; 0
	// runs until a signal.
	count int
}

func (c config) claimName() string { return "wake/" + c.wake }
func (c config) key() string       { return "wake-" + c.wake }
func (c config) scratch() string   { return "wake-" + c.wake + "-scratch" }

// progress is the value of operations/wake-<id>.
type progress struct {
	Step  int64  `json:"step"`
	By    string `json:"by"`
	Epoch int64  `json:"epoch"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	host, err := os.Hostname()
	if err != nil {
		host = "worker"
	}
	var cfg config
	fs := flag.NewFlagSet("claims", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.addr, "addr", "localhost:7420", "fenced gRPC address")
	fs.StringVar(&cfg.slug, "slug", "demo-swarm", "swarm slug")
	fs.StringVar(&cfg.wake, "wake", "1", "wake id (claim wake/<id>)")
	fs.StringVar(&cfg.owner, "owner", host+"-"+strconv.Itoa(os.Getpid()), "claim owner")
	fs.DurationVar(&cfg.ttl, "ttl", 2*time.Second, "claim TTL")
	fs.DurationVar(&cfg.wait, "wait", 0, "how long to wait for a held claim (0: refuse at once)")
	fs.DurationVar(&cfg.interval, "interval", 200*time.Millisecond, "pause between steps")
	fs.IntVar(&cfg.count, "count", 0, "steps to commit before exiting (0: until SIGINT/SIGTERM)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments %q", fs.Args())
		fmt.Fprintln(stderr, err)
		return config{}, err
	}
	if cfg.wait < 0 {
		err := fmt.Errorf("--wait %v: must be 0 or more", cfg.wait)
		fmt.Fprintln(stderr, err)
		return config{}, err
	}
	return cfg, nil
}

// lockedWriter serialises the lines of the main loop and of the goroutine
// that reports a lost claim.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
}

// run is the worker; it answers the exit status. Signals end ctx.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	out, errOut := &lockedWriter{w: stdout}, &lockedWriter{w: stderr}

	c, err := client.Dial(cfg.addr)
	if err != nil {
		errOut.printf("%v", err)
		return exitError
	}
	defer c.Close()

	out.printf("claiming %s of %s as %s (pid %d, wait %v)", cfg.claimName(), cfg.slug, cfg.owner, os.Getpid(), cfg.wait)
	k, code := claim(ctx, c, cfg, out, errOut)
	if k == nil {
		return code
	}
	out.printf("claim acquired: %s epoch=%d owner=%s", k.Name(), k.Epoch(), k.Owner())
	reportScratch(c, cfg, out, errOut)

	// Only a report: the loop below writes regardless, and the server
	// refuses what the lost claim fences.
	loopDone := make(chan struct{})
	var reporter sync.WaitGroup
	reporter.Go(func() {
		select {
		case <-k.Lost():
			out.printf("keeper: claim lost (%v); not checked before writing: the server's fence decides", k.Err())
		case <-loopDone:
		}
	})
	stopReporter := sync.OnceFunc(func() {
		close(loopDone)
		reporter.Wait()
	})
	defer stopReporter()

	release := func() {
		stopReporter() // a release is no loss to report
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := k.Close(rctx); err != nil {
			errOut.printf("release: %v", err)
			return
		}
		out.printf("released %s epoch=%d owner=%s", k.Name(), k.Epoch(), k.Owner())
	}

	ticker := time.NewTicker(cfg.interval)
	defer ticker.Stop()
	for steps := 0; ; {
		// Not ctx: a signal ends the loop between steps, never in the
		// middle of one, so every commit is printed.
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, rev, err := step(uctx, c, cfg, k)
		cancel()
		var le *client.LeaseError
		switch {
		case err == nil:
			steps++
			out.printf("committed wake=%s step=%d revision=%d epoch=%d owner=%s", cfg.wake, v.Step, rev, v.Epoch, v.By)
		case errors.As(err, &le) && errors.Is(err, client.ErrLeaseStale):
			holder, epoch := "none", "none"
			if le.Holder != nil {
				holder, epoch = le.Holder.Owner, strconv.FormatInt(le.Holder.Epoch, 10)
			}
			out.printf("refused: claim %s stale (holder %s epoch %s)", cfg.claimName(), holder, epoch)
			return exitStale
		default:
			// Unavailable, kept changing, a deadline: try again next tick;
			// if the claim is lost meanwhile, that write is refused.
			errOut.printf("update: %v", err)
		}
		if cfg.count > 0 && steps >= cfg.count {
			release()
			return exitOK
		}
		select {
		case <-ctx.Done():
			release()
			return exitOK
		case <-ticker.C:
		}
	}
}

// claim takes the wake's claim and keeps it. With --wait 0 it asks once
// (AcquireClaim) and refuses a held claim; otherwise KeepClaim waits up to
// --wait. On nil it answers the exit status, the reason printed.
func claim(ctx context.Context, c *client.Client, cfg config, out, errOut *lockedWriter) (*client.ClaimKeeper, int) {
	name := cfg.claimName()
	if cfg.wait == 0 {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _, err := c.AcquireClaim(actx, cfg.slug, name, cfg.owner, cfg.ttl)
		cancel()
		var le *client.LeaseError
		switch {
		case errors.As(err, &le) && errors.Is(err, client.ErrLeaseHeld) && le.Holder != nil:
			printHeld(out, name, *le.Holder)
			return nil, exitHeld
		case ctx.Err() != nil:
			return nil, exitOK // signalled while asking
		case err != nil:
			errOut.printf("acquire claim: %v", err)
			return nil, exitError
		}
		// Granted: KeepClaim below asks again as the holder, which keeps
		// the epoch, and starts renewing.
	}
	limit := cfg.wait
	if limit == 0 {
		limit = 10 * time.Second // the grant is ours: a bound on the calls alone
	}
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	k, err := c.KeepClaim(wctx, cfg.slug, name, cfg.owner, cfg.ttl)
	switch {
	case err == nil:
		return k, exitOK
	case ctx.Err() != nil:
		return nil, exitOK // signalled while waiting
	case wctx.Err() != nil && cfg.wait > 0:
		// Waited --wait: say who holds it now.
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		l, live, _, _, qerr := c.CurrentClaim(qctx, cfg.slug, name)
		qcancel()
		if qerr == nil && live && l != nil {
			printHeld(out, name, *l)
			return nil, exitHeld
		}
	}
	errOut.printf("keep claim: %v", err)
	return nil, exitError
}

// reportScratch prints what the wake's bound scratch record holds: gone
// (absent) once the claim it was bound to ended, whoever held it.
func reportScratch(c *client.Client, cfg config, out, errOut *lockedWriter) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, _, err := c.Get(ctx, cfg.slug, section, cfg.scratch())
	switch {
	case err != nil:
		errOut.printf("read scratch: %v", err)
	case rec == nil:
		out.printf("scratch: %s/%s absent (none written, or bound to a claim that ended)", section, cfg.scratch())
	default:
		out.printf("scratch: %s/%s = %s (claim %s epoch %d)", section, cfg.scratch(), rec.Value, rec.Claim, rec.ClaimEpoch)
	}
}

func printHeld(out *lockedWriter, name string, l client.Lease) {
	out.printf("held: claim %s held by %s epoch %d until %d ms", name, l.Owner, l.Epoch, l.ExpiresAtMs)
}

// step reads operations/wake-<id>, advances its step and writes it back
// with the scratch record bound to the claim, fenced by the claim, as one
// Update.
func step(ctx context.Context, c *client.Client, cfg config, k *client.ClaimKeeper) (progress, int64, error) {
	var v progress
	rev, err := c.Update(ctx, cfg.slug, client.Unfenced, func(tx *client.Txn) error {
		v = progress{}
		if _, err := tx.GetJSON(section, cfg.key(), &v); err != nil {
			return err
		}
		v = progress{Step: v.Step + 1, By: cfg.owner, Epoch: k.Epoch()}
		raw, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if err := tx.Put(section, cfg.key(), raw); err != nil {
			return err
		}
		return tx.PutBound(section, cfg.scratch(), raw)
	}, client.WithClaim(k.Claim()))
	return v, rev, err
}
