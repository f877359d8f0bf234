// Command fenced serves fenced, per-record writes to swarms' fencing state
// in Redis over gRPC. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/lograte"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/byname"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/alecthomas/kong"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	go stopOnSignals(cancel)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fenced:", err)
		os.Exit(exitCode(err))
	}
}

// stopOnSignals calls first on the first SIGINT or SIGTERM (serve then
// drains and stops gracefully); a second one stops fenced at once, cutting
// the drain delay and the graceful stop, by the signal's default action.
// Restoring the default is not enough where the signal was ignored when
// fenced started (SIGINT in a job a script starts in the background):
// Notify took it anyway, and Reset restores the ignoring, so fenced then
// exits 128+n itself.
func stopOnSignals(first func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
	first()
	sig := <-sigs
	signal.Reset(sig)
	if self, err := os.FindProcess(os.Getpid()); err == nil && self.Signal(sig) == nil {
		// A signal a process sends itself is delivered as kill returns,
		// unless it is ignored.
		time.Sleep(time.Second)
	}
	n, _ := sig.(syscall.Signal)
	os.Exit(128 + int(n))
}

// cli is the command line: one struct per subcommand, every flag with its
// environment variable and default.
type cli struct {
	Serve   serveCmd   `cmd:"" help:"Serve the gRPC API."`
	Inspect inspectCmd `cmd:"" help:"Show one swarm's state, read-only (but --repair): layout, revision and stamp, lease, record counts, by-name and its index's consistency, newest log entries."`
	Migrate migrateCmd `cmd:"" help:"Move swarms from the document layout onto per record keys (one transaction per swarm; needs --writers-upgraded)."`
	Version versionCmd `cmd:"" help:"Print the version."`
}

// redisFlags are the flags of every subcommand that talks to Redis.
type redisFlags struct {
	// RedisURL is any URL rueidis.ParseURL takes; empty: embedded Redis.
	RedisURL string `name:"redis-url" env:"FENCED_REDIS_URL,AGENTIHOOKS_SWARM_REDIS_URL" placeholder:"URL" help:"Redis URL: redis://[user:password@]host:port, rediss:// (TLS), unix://; several addresses (?addr=host:port) for Cluster; ?master_set=NAME for Sentinel. Empty: serve uses an embedded in-memory Redis, for trying fenced only (nothing is durable); inspect and migrate refuse."`
	// KeyPrefix starts every key: <prefix>:swarm:{<slug>}:fence:...
	KeyPrefix string `name:"key-prefix" env:"AGENTIHOOKS_SWARM_KEY_PREFIX" default:"agentihooks" help:"Key prefix shared with the other writers (no '{' or '}')."`
	// redisTLSFlags adjust a rediss:// URL's TLS (security.go).
	redisTLSFlags
}

// serveCmd is the configuration of "fenced serve".
type serveCmd struct {
	redisFlags
	// securityFlags are gRPC TLS, mTLS and bearer tokens (security.go).
	securityFlags
	// observabilityFlags are metrics and tracing (observability.go).
	observabilityFlags
	// limitFlags bound shared resources per caller (limits.go).
	limitFlags
	// Listen is the gRPC address.
	Listen string `env:"FENCED_LISTEN" default:":7420" help:"gRPC listen address (host:port; port 0 picks a free one)."`
	// Sections are the configured section names besides meta.
	Sections []string `env:"FENCED_SECTIONS" default:"executions,archive,intents,orphans,grants,registrations,claims,journals,fences,operations" help:"Section names besides meta, comma-separated."`
	// MaxWrites bounds the writes of one batch.
	MaxWrites int `env:"FENCED_MAX_WRITES" default:"1024" help:"Most writes in one batch."`
	// MaxValueBytes bounds one put's value, in bytes.
	MaxValueBytes int `env:"FENCED_MAX_VALUE_BYTES" default:"1048576" help:"Largest value of one put, in bytes."`
	// MaxBatchValueBytes bounds the values of one batch, in bytes.
	MaxBatchValueBytes int `env:"FENCED_MAX_BATCH_VALUE_BYTES" default:"8388608" help:"Most value bytes in one batch (put values, and the keys of record checks)."`
	// MaxChecks bounds the record checks (WRITE_KIND_CHECK_RECORDS pairs)
	// of one batch.
	MaxChecks int `env:"FENCED_MAX_CHECKS" default:"20000" help:"Most record checks (WRITE_KIND_CHECK_RECORDS pairs, in all) in one batch."`
	// RequireFence names the sections only fenced batches may write.
	RequireFence []string `env:"FENCED_REQUIRE_FENCE" help:"Sections (comma-separated; meta included by name; * for every one) a FencedBatch may put or delete in only with a lease fence or a claim fence; an unfenced one is refused FAILED_PRECONDITION FENCE_REQUIRED, nothing written. Empty: an unfenced batch commits on revisions alone."`
	// WaitReplicas and WaitTimeout: the default replica acknowledgement.
	WaitReplicas int           `env:"FENCED_WAIT_REPLICAS" default:"0" help:"Replicas that must acknowledge every commit and lease change (Redis WAIT) unless a batch says otherwise; a lease grant or renewal fewer acknowledge is refused (REPLICATION_TIMEOUT); 0: do not wait."`
	WaitTimeout  time.Duration `env:"FENCED_WAIT_TIMEOUT" default:"1s" help:"How long a commit or lease change waits for replica acknowledgements."`
	// RequestIDWindow is how long committed request ids are remembered.
	RequestIDWindow time.Duration `env:"FENCED_REQUEST_ID_WINDOW" default:"10m" help:"How long a committed batch's request_id is remembered (retries inside it are answered, not rerun)."`
	// LegacyRequestKeys: also read and write request ids' keys of the
	// layout before the request-ids hash (a rolling upgrade).
	LegacyRequestKeys bool `env:"FENCED_LEGACY_REQUEST_KEYS" default:"true" negatable:"" help:"Also read and write each request id's key of the layout before request-ids (request:<id>), so that a batch resent across a rolling upgrade from an older fenced is answered, not rerun; turn off once every replica runs this version and --request-id-window has passed."`
	// MaxClaimsPerSwarm bounds the claims (named leases) one swarm holds.
	MaxClaimsPerSwarm int64 `env:"FENCED_MAX_CLAIMS_PER_SWARM" default:"100000" help:"Most claims (named leases) one swarm may hold at once; an Acquire of a new name past it is RESOURCE_EXHAUSTED TOO_MANY_CLAIMS."`
	// ClaimReapInterval is how often the claim reaper passes over the
	// swarms that hold claims; 0 turns it off.
	ClaimReapInterval time.Duration `env:"FENCED_CLAIM_REAP_INTERVAL" default:"1s" help:"How often this fenced's claim reaper ends the claims whose grant lapsed and deletes the records bound to claims that ended (docs/design/12-claims.md §12.5), in steps of at most ~256 records (~2 ms of Redis time) each, on the ticks where it takes the replicas' turn (P:fence:reaper-turn); 0: never (run it on at least one replica, or lapsed claims' records stay stored, though no read sees them)."`
	// ByNameRebuildPage is the records one step of a background by-name
	// index rebuild reads; 0 turns the background rebuild off.
	ByNameRebuildPage int `env:"FENCED_BY_NAME_REBUILD_PAGE" default:"200" help:"When a batch finds by-name's index stale (a writer bypassed fenced), rebuild it in the background, at most this many records per script, each step sized by the Redis time the previous ones took to about 1 ms; 0: never (fenced inspect --repair does it)."`
	// MaxSnapshotRecords and MaxSnapshotBytes bound one Sections answer.
	MaxSnapshotRecords int `env:"FENCED_MAX_SNAPSHOT_RECORDS" default:"20000" help:"Most records one Sections read may hold (counted before reading); larger sections are read with ScanSection."`
	MaxSnapshotBytes   int `env:"FENCED_MAX_SNAPSHOT_BYTES" default:"4128768" help:"Largest Sections answer and ScanSection page, in bytes (default: 4 MiB less 64 KiB, under gRPC clients' default receive limit)."`
	// LeaseMinTTL and LeaseMaxTTL bound the TTL of a lease grant or renewal.
	LeaseMinTTL time.Duration `env:"FENCED_LEASE_MIN_TTL" default:"100ms" help:"Shortest lease TTL a client may ask for."`
	LeaseMaxTTL time.Duration `env:"FENCED_LEASE_MAX_TTL" default:"10m" help:"Longest lease TTL a client may ask for."`
	// RedisTimeout bounds every call to Redis.
	RedisTimeout time.Duration `name:"redis-timeout" env:"FENCED_REDIS_TIMEOUT" default:"3s" help:"Longest a call waits for Redis (a commit or lease change waiting for replicas gets its replica timeout on top): past it, the call answers UNAVAILABLE REDIS_UNAVAILABLE, with or without a client deadline."`
	// RedisFunctions calls the committing scripts as fenced's function
	// library (FCALL) where Redis takes it.
	RedisFunctions bool `name:"redis-functions" env:"FENCED_REDIS_FUNCTIONS" default:"true" negatable:"" help:"Commit through fenced's Redis function library (FCALL; ~5 us less Redis time per batch) where Redis takes it. --no-redis-functions calls the scripts by EVALSHA only: do so when Redis users other than fenced's may run FUNCTION LOAD (any user with @scripting or @write, whatever its keys), since such a user can replace the library with code of its own that fenced would then run."`
	// AllowEvictingRedis serves on a Redis that may evict keys.
	AllowEvictingRedis bool `name:"allow-evicting-redis" env:"FENCED_ALLOW_EVICTING_REDIS" help:"Serve even when Redis may evict keys (maxmemory > 0 and maxmemory-policy other than noeviction), with a warning on every health probe and fenced_redis_may_evict = 1. Without it fenced refuses to start, and turns NOT_SERVING, on such a Redis: an evicted key can let a request commit twice or an epoch be granted twice."`
	// HealthListen serves health alone, in plaintext, for probes.
	HealthListen string `name:"health-listen" env:"FENCED_HEALTH_LISTEN" placeholder:"ADDR" help:"Also serve grpc.health.v1 alone, in plaintext, on this address (e.g. :7422): for Kubernetes gRPC probes, which cannot speak TLS, when --tls-cert is set. Empty: off."`
	// HealthInterval is how often Redis is pinged for health.
	HealthInterval time.Duration `env:"FENCED_HEALTH_INTERVAL" default:"1s" help:"How often Redis is pinged for the health service."`
	// DrainDelay is how long, after SIGTERM, health answers NOT_SERVING
	// while calls are still served, before the graceful stop begins.
	DrainDelay time.Duration `env:"FENCED_DRAIN_DELAY" default:"5s" help:"After SIGTERM, how long health answers NOT_SERVING while calls are still served, so that load balancers stop sending calls before fenced stops taking them; then the graceful stop (--shutdown-timeout). 0: no delay."`
	// ShutdownTimeout bounds the graceful stop after SIGTERM.
	ShutdownTimeout time.Duration `env:"FENCED_SHUTDOWN_TIMEOUT" default:"10s" help:"How long in-flight calls may finish after SIGTERM."`
	// LogFormat is text or json.
	LogFormat string `env:"FENCED_LOG_FORMAT" enum:"text,json" default:"text" help:"Log format: text or json."`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"FENCED_LOG_LEVEL" enum:"debug,info,warn,error" default:"info" help:"Log level: debug (one line per call), info, warn, error."`

	// ready, when set (tests), receives the bound address once serving.
	ready func(addr net.Addr)
}

type versionCmd struct{}

// env passes what every subcommand needs besides its flags.
type env struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
}

// run parses args and runs the subcommand until it ends or ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c cli
	exited := false
	parser, err := kong.New(&c,
		kong.Name("fenced"),
		kong.Description("fenced: fenced, per-record writes to a swarm's fencing state in Redis, over gRPC."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(int) { exited = true }),
		kong.UsageOnError(),
	)
	if err != nil {
		return err
	}
	kctx, err := parser.Parse(args)
	if exited {
		return nil // --help
	}
	if err != nil {
		return err
	}
	return kctx.Run(&env{ctx: ctx, stdout: stdout, stderr: stderr})
}

func (versionCmd) Run(e *env) error {
	v := "(devel)"
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		v = info.Main.Version
	}
	_, err := fmt.Fprintln(e.stdout, "fenced", v)
	return err
}

func (c *serveCmd) limits() (batch.Limits, error) {
	l := batch.Limits{
		Sections:           c.Sections,
		MaxWrites:          c.MaxWrites,
		MaxValueBytes:      c.MaxValueBytes,
		MaxBatchValueBytes: c.MaxBatchValueBytes,
		MaxChecks:          c.MaxChecks,
		RequireFence:       c.RequireFence,
	}
	if err := l.Check(); err != nil {
		var ve *batch.ValidationError
		if errors.As(err, &ve) {
			msgs := make([]string, len(ve.Violations))
			for i, v := range ve.Violations {
				msgs[i] = "--" + strings.ReplaceAll(v.Field, "_", "-") + ": " + v.Description
			}
			return l, fmt.Errorf("configuration: %s", strings.Join(msgs, "; "))
		}
		return l, fmt.Errorf("configuration: %w", err)
	}
	return l, nil
}

func (c *serveCmd) logger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if c.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	// Identical WARN and ERROR lines (Redis down, a client repeating a
	// refused call) pass three at once, then one per 10 s with a count of
	// those dropped.
	return slog.New(lograte.New(h, slog.LevelWarn, lograte.DefaultEvery, lograte.DefaultBurst))
}

// redisURL is the Redis URL in effect: the flag, else the environment.
func (r *redisFlags) redisURL() string {
	if r.RedisURL != "" {
		return r.RedisURL
	}
	// kong takes the first of a flag's env variables that is set, even when
	// it is set to "": FENCED_REDIS_URL="" (an unset variable in a compose
	// file or manifest) would hide this fallback and serve from the
	// embedded Redis.
	return os.Getenv("AGENTIHOOKS_SWARM_REDIS_URL")
}

// open connects to the configured Redis, or starts the embedded one; the
// returned func releases what was opened.
func (r *redisFlags) open(log *slog.Logger, o store.Options) (*store.Store, func(), error) {
	o.Engine.Prefix = r.KeyPrefix
	if u := r.redisURL(); u != "" {
		st, err := r.openStore(u, o)
		if err != nil {
			return nil, nil, err
		}
		return st, st.Close, nil
	}
	emb, err := store.StartEmbedded()
	if err != nil {
		return nil, nil, err
	}
	st, err := emb.Open(o)
	if err != nil {
		emb.Close()
		return nil, nil, err
	}
	log.Warn("NO REDIS URL GIVEN: serving from an embedded in-memory Redis. NOTHING IS DURABLE: every record is lost when fenced stops. For production set --redis-url or FENCED_REDIS_URL.",
		"embedded_redis", emb.Addr())
	return st, func() { st.Close(); emb.Close() }, nil
}

// Run serves until e.ctx is cancelled: check the configuration, open what
// the server needs (security, observability, the store), listen, serve,
// then drain and shut down.
func (c *serveCmd) Run(e *env) error {
	log := c.logger(e.stderr)
	slog.SetDefault(log)
	limits, err := c.checkConfig()
	if err != nil {
		return err
	}
	fileLimit, err := raiseFileLimit()
	if err != nil {
		log.Warn("could not raise the open-file limit to its hard limit", "err", err, "file_limit", fileLimit)
	}
	maxConns := c.limitFlags.connections(log, fileLimit)
	c.limitFlags.retired(log)
	sec, stopSec, err := c.security(e.ctx, log)
	if err != nil {
		return err
	}
	defer stopSec()
	obs, err := c.startObservability(e.ctx, log)
	if err != nil {
		return err
	}
	defer obs.stop()
	durable := batch.Durability{Replicas: c.WaitReplicas, Timeout: c.WaitTimeout}
	st, closeStore, err := c.startStore(e.ctx, log, obs, durable)
	if err != nil {
		return err
	}
	defer closeStore()
	reapCtx, stopReaper := context.WithCancel(e.ctx)
	reaped := make(chan struct{})
	go func() { defer close(reaped); st.RunReaper(reapCtx, c.ClaimReapInterval) }()
	// Stopped before the store closes (the defers run last first).
	defer func() { stopReaper(); <-reaped }()
	lis, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv, err := c.newServer(st, limits, log, durable, sec, obs, maxConns)
	if err == nil {
		err = c.serveBeside(log, obs, srv)
	}
	if err != nil {
		lis.Close()
		return err
	}
	log.Info("serving gRPC", "addr", lis.Addr().String(), "redis", redactURL(c.redisURL()), "cluster", st.Cluster(), "key_prefix", c.KeyPrefix,
		"max_connections", maxConns, "file_limit", fileLimit)
	if c.ready != nil {
		c.ready(lis.Addr())
	}
	return c.serve(e.ctx, log, srv, lis)
}

// checkConfig checks the flags that kong's types do not and answers the
// batch limits.
func (c *serveCmd) checkConfig() (batch.Limits, error) {
	limits, err := c.limits()
	if err != nil {
		return limits, err
	}
	if c.WaitReplicas < 0 || c.MaxSnapshotRecords < 1 || c.MaxSnapshotBytes < 1 {
		return limits, fmt.Errorf("configuration: --wait-replicas must be >= 0, --max-snapshot-records and --max-snapshot-bytes >= 1")
	}
	if c.ClaimReapInterval < 0 {
		return limits, fmt.Errorf("configuration: --claim-reap-interval must be >= 0 (0: no reaper)")
	}
	if c.MaxClaimsPerSwarm < 1 {
		return limits, fmt.Errorf("configuration: --max-claims-per-swarm must be >= 1")
	}
	if c.ByNameRebuildPage < 0 {
		return limits, fmt.Errorf("configuration: --by-name-rebuild-page must be >= 0")
	}
	if c.DrainDelay < 0 {
		return limits, fmt.Errorf("configuration: --drain-delay must be >= 0")
	}
	if c.RedisTimeout < time.Millisecond {
		return limits, fmt.Errorf("configuration: --redis-timeout must be at least 1ms")
	}
	if c.MaxRequestBytesInFlight < int64(c.MaxBatchValueBytes) {
		return limits, fmt.Errorf("configuration: --max-request-bytes-in-flight %d is below --max-batch-value-bytes %d: a batch at the limits would be served only when nothing else is in flight", c.MaxRequestBytesInFlight, c.MaxBatchValueBytes)
	}
	if err := c.limitFlags.check(c.WaitReplicas, c.WaitTimeout); err != nil {
		return limits, err
	}
	return limits, nil
}

// startStore opens the store with the flags' options (the configured Redis
// or the embedded one) and refuses a Redis that may evict keys; the
// returned func closes what was opened.
func (c *serveCmd) startStore(ctx context.Context, log *slog.Logger, obs *observability, durable batch.Durability) (*store.Store, func(), error) {
	var o store.Options
	o.Engine = engine.Options{RedisTimeout: c.RedisTimeout, AllowEviction: c.AllowEvictingRedis, NoFunctions: !c.RedisFunctions,
		Wait: durable, Logger: log, Observer: obs.storeObserver()}
	o.Reads = batch.ReadLimits{MaxSnapshotRecords: c.MaxSnapshotRecords, MaxSnapshotBytes: c.MaxSnapshotBytes}
	o.Records.RequestIDWindow, o.Records.NoLegacyRequestKeys = c.RequestIDWindow, !c.LegacyRequestKeys
	o.Leases.MaxClaimsPerSwarm = c.MaxClaimsPerSwarm
	o.Docs.Sections = c.Sections
	if c.ByNameRebuildPage > 0 {
		o.ByName.Background, o.ByName.Page, o.ByName.Rebuilt = true, c.ByNameRebuildPage, byNameRebuilt(log)
	}
	c.limitFlags.storeOptions(&o)
	st, closeStore, err := c.open(log, o)
	if err != nil {
		return nil, nil, err
	}
	if err := st.CheckEviction(ctx); err != nil {
		closeStore()
		return nil, nil, fmt.Errorf("refusing to start: %w", err)
	}
	return st, closeStore, nil
}

// newServer builds the gRPC server over st from the flags.
func (c *serveCmd) newServer(st *store.Store, limits batch.Limits, log *slog.Logger, durable batch.Durability, sec server.Security, obs *observability, maxConns int) (*server.Server, error) {
	bounds := batch.LeaseBounds{MinTTLMs: c.LeaseMinTTL.Milliseconds(), MaxTTLMs: c.LeaseMaxTTL.Milliseconds()}
	if err := bounds.Check(); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	return server.New(st, limits, server.Options{
		Logger:         log,
		HealthInterval: c.HealthInterval,
		LeaseBounds:    bounds,
		Records: server.ServiceOptions{Durability: durable, MaxSnapshotBytes: c.MaxSnapshotBytes,
			MaxAckReplicas: c.MaxAckReplicas, MaxAckTimeout: c.MaxAckTimeout, Watch: c.limitFlags.watch(),
			SectionStreams: c.limitFlags.sectionStreams()},
		Security:  sec,
		Telemetry: obs.telemetry(),
		Transport: c.limitFlags.transport(maxConns),
		Fairness:  c.limitFlags.fairness(),
	}), nil
}

// serveBeside starts what is served beside gRPC: metrics (when
// configured) and the plaintext health listener (--health-listen).
func (c *serveCmd) serveBeside(log *slog.Logger, obs *observability, srv *server.Server) error {
	if err := obs.serve(srv); err != nil {
		return err
	}
	if c.HealthListen == "" {
		return nil
	}
	hlis, err := net.Listen("tcp", c.HealthListen)
	if err != nil {
		return fmt.Errorf("--health-listen: %w", err)
	}
	go func() {
		if err := srv.ServeHealth(hlis); err != nil {
			log.Error("health listener stopped", "err", err)
		}
	}()
	log.Info("serving health alone, in plaintext", "addr", hlis.Addr().String())
	return nil
}

// serve serves on lis until ctx is cancelled, then drains (--drain-delay)
// and shuts down within --shutdown-timeout.
func (c *serveCmd) serve(ctx context.Context, log *slog.Logger, srv *server.Server, lis net.Listener) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	if c.DrainDelay > 0 {
		log.Info("draining: health NOT_SERVING, still serving calls (signal again to stop at once)", "delay", c.DrainDelay)
		srv.Drain()
		delay := time.NewTimer(c.DrainDelay)
		select {
		case err := <-served:
			delay.Stop()
			return err
		case <-delay.C:
		}
	}
	log.Info("shutting down: health NOT_SERVING, draining calls", "timeout", c.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	srv.Shutdown(sctx)
	if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}

// redactURL hides the password of a Redis URL for logs; "" reads
// "embedded".
func redactURL(raw string) string {
	if raw == "" {
		return "embedded"
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// byNameRebuilt logs the end of a background by-name index rebuild.
func byNameRebuilt(log *slog.Logger) func(string, *byname.Rebuild, error) {
	return func(slug string, r *byname.Rebuild, err error) {
		switch {
		case err != nil:
			log.Warn("by-name index rebuild failed; it is retried with backoff (at most a minute apart)", "slug", slug, "err", err)
		case r.Busy:
			log.Info("by-name index rebuild left to another (another fenced holds the swarm's claim)", "slug", slug)
		case !r.Clean:
			log.Warn("by-name index rebuilt but found stale again (a writer keeps bypassing fenced); it is retried with backoff", "slug", slug, "rounds", r.Rounds, "scanned", r.Scanned)
		default:
			log.Info("by-name index rebuilt", "slug", slug, "rounds", r.Rounds, "steps", r.Steps, "scanned", r.Scanned,
				"members_removed", r.Removed, "entries_fixed", r.Fixed, "entries_removed", r.Extra)
		}
	}
}
