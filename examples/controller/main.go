// Command controller is a small fenced controller: it keeps a swarm's lease
// and, in a loop, increments the counter record operations/counter
// ({"n":N,"by":owner,"epoch":E}) through client.Update, every write fenced
// with the lease's epoch. It prints one line per commit:
//
//	committed n=12 revision=17960791808610 epoch=1796079187256 owner=host-4242
//
// It deliberately does not ask its Keeper whether it still holds the lease
// before writing: the server's fence is the authority. A controller that was
// paused past its TTL still believes it is the leader when it resumes, and
// its next write is refused. It then prints
//
//	refused: lease stale (holder host-4343 epoch 1796079190002)
//
// and exits with status 3. SIGINT or SIGTERM releases the lease and exits
// with status 0.
//
// The demo, against a running fenced (fenced serve --redis-url ...): run two
// instances, pause the first (SIGSTOP) for longer than its TTL, watch the
// second take the lease over at a higher epoch, then resume the first
// (SIGCONT): its next write is refused. Build the binary first, so that the
// pid printed at start is the controller's own:
//
//	go build -o controller ./examples/controller
//	./controller --owner a    # terminal 1: takes the lease, prints its pid
//	./controller --owner b    # terminal 2: waits for the lease
//	kill -STOP <pid of a>     # terminal 3: after 2 s, b takes over at a higher epoch
//	kill -CONT <pid of a>     # a writes once more, is refused, exits 3
//
// Flags: --addr (fenced's gRPC address, default localhost:7420), --slug
// (default demo-swarm), --owner (default <hostname>-<pid>), --ttl (the
// lease's TTL, default 2s), --interval (between increments, default 200ms),
// --count (increments before releasing and exiting; 0, the default, runs
// until a signal).
package main

import (
	"context"
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
	exitStale = 3 // a write was refused: the lease is gone
)

// The record the controller increments.
const (
	section = "operations"
	key     = "counter"
)

// config is the controller's configuration, from flags.
type config struct {
	// addr is fenced's gRPC address.
	addr string
	// slug names the swarm.
	slug string
	// owner names this controller in the lease and the log.
	owner string
	// ttl is the lease's TTL; the Keeper renews every third of it.
	ttl time.Duration
	// interval is the pause between increments.
	interval time.Duration
	// count is how many increments to commit before releasing and exiting;
	// 0 runs until a signal.
	count int
}

// counter is the value of operations/counter.
type counter struct {
	N     int64  `json:"n"`
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
		host = "controller"
	}
	var cfg config
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.addr, "addr", "localhost:7420", "fenced gRPC address")
	fs.StringVar(&cfg.slug, "slug", "demo-swarm", "swarm slug")
	fs.StringVar(&cfg.owner, "owner", host+"-"+strconv.Itoa(os.Getpid()), "lease owner")
	fs.DurationVar(&cfg.ttl, "ttl", 2*time.Second, "lease TTL")
	fs.DurationVar(&cfg.interval, "interval", 200*time.Millisecond, "pause between increments")
	fs.IntVar(&cfg.count, "count", 0, "increments to commit before exiting (0: until SIGINT/SIGTERM)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments %q", fs.Args())
		fmt.Fprintln(stderr, err)
		return config{}, err
	}
	return cfg, nil
}

// lockedWriter serialises the lines of the main loop and of the goroutine
// that reports a lost lease.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
}

// run is the controller; it answers the exit status. Signals end ctx.
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

	out.printf("waiting for the lease of %s as %s (pid %d)", cfg.slug, cfg.owner, os.Getpid())
	k, err := c.Keep(ctx, cfg.slug, cfg.owner, cfg.ttl)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK // signalled while waiting
		}
		errOut.printf("keep lease: %v", err)
		return exitError
	}
	out.printf("lease acquired: epoch=%d owner=%s", k.Epoch(), cfg.owner)

	// Only a report: the loop below writes regardless, and the server
	// refuses what the lost lease fences.
	loopDone := make(chan struct{})
	var reporter sync.WaitGroup
	reporter.Go(func() {
		select {
		case <-k.Lost():
			out.printf("keeper: lease lost (%v); not checked before writing: the server's fence decides", k.Err())
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
		out.printf("released epoch=%d owner=%s", k.Epoch(), cfg.owner)
	}

	ticker := time.NewTicker(cfg.interval)
	defer ticker.Stop()
	for commits := 0; ; {
		// Not ctx: a signal ends the loop between increments, never in the
		// middle of one, so every commit is printed.
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, rev, err := increment(uctx, c, cfg, k)
		cancel()
		var le *client.LeaseError
		switch {
		case err == nil:
			commits++
			out.printf("committed n=%d revision=%d epoch=%d owner=%s", v.N, rev, v.Epoch, v.By)
		case errors.As(err, &le) && errors.Is(err, client.ErrLeaseStale):
			holder, epoch := "none", "none"
			if le.Holder != nil {
				holder, epoch = le.Holder.Owner, strconv.FormatInt(le.Holder.Epoch, 10)
			}
			out.printf("refused: lease stale (holder %s epoch %s)", holder, epoch)
			return exitStale
		default:
			// Unavailable, kept changing, a deadline: try again next tick;
			// if the lease is lost meanwhile, that write is refused.
			errOut.printf("update: %v", err)
		}
		if cfg.count > 0 && commits >= cfg.count {
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

// increment reads operations/counter, adds one and writes it back, fenced
// by the Keeper's lease, as one Update.
func increment(ctx context.Context, c *client.Client, cfg config, k *client.Keeper) (counter, int64, error) {
	var v counter
	rev, err := c.Update(ctx, cfg.slug, k.Fence(), func(tx *client.Txn) error {
		v = counter{}
		if _, err := tx.GetJSON(section, key, &v); err != nil {
			return err
		}
		v = counter{N: v.N + 1, By: cfg.owner, Epoch: k.Epoch()}
		return tx.PutJSON(section, key, v)
	})
	return v, rev, err
}
