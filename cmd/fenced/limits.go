package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/server/admission"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/fair"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// limitFlags bound what one caller can hold of fenced's shared resources:
// the gRPC transport (keepalive, idle connections, streams, headers,
// connections), health Watch streams and replica acknowledgement waits.
// docs/security.md lists every bound with its default and why.
type limitFlags struct {
	// KeepaliveMinTime is the shortest client ping interval accepted.
	KeepaliveMinTime time.Duration `name:"keepalive-min-time" env:"FENCED_KEEPALIVE_MIN_TIME" default:"10s" help:"Shortest interval between a client's keepalive pings that fenced accepts, with or without calls in flight (faster: GOAWAY too_many_pings). The Go client pings every 30s; grpc-go clients cannot ping faster than 10s."`
	// KeepaliveTime is the idle time before the server pings a client.
	KeepaliveTime time.Duration `name:"keepalive-time" env:"FENCED_KEEPALIVE_TIME" default:"1m" help:"After this long without traffic on a connection fenced pings the client, to find dead peers (at least 1s)."`
	// KeepaliveTimeout is how long a ping's answer may take.
	KeepaliveTimeout time.Duration `name:"keepalive-timeout" env:"FENCED_KEEPALIVE_TIMEOUT" default:"20s" help:"How long fenced waits for the answer to its ping before closing the connection."`
	// MaxConnectionIdle closes connections without calls for this long.
	MaxConnectionIdle time.Duration `name:"max-connection-idle" env:"FENCED_MAX_CONNECTION_IDLE" default:"15m" help:"Close a connection that has had no call in flight for this long (clients reconnect on their next call)."`
	// MaxConcurrentStreams bounds the calls in flight on one connection.
	MaxConcurrentStreams uint32 `name:"max-concurrent-streams" env:"FENCED_MAX_CONCURRENT_STREAMS" default:"256" help:"Most calls (streams) in flight on one connection; a client queues the rest. Must be above --max-watchers-per-connection."`
	// StreamWorkers is how many goroutines the server keeps to run calls;
	// 0: none.
	StreamWorkers int `name:"stream-workers" env:"FENCED_STREAM_WORKERS" default:"128" help:"Goroutines kept to run calls (grpc-go stream workers): a call runs on an idle one, whose stack has already grown, instead of on a new goroutine (~1.5us less per FencedBatch); with all busy a call gets a goroutine of its own. Each is held from start (0: none, at most 65536)."`
	// MaxHeaderListBytes bounds one call's metadata.
	MaxHeaderListBytes uint32 `name:"max-header-bytes" env:"FENCED_MAX_HEADER_BYTES" default:"65536" help:"Largest header list (metadata) of one call, in bytes as HTTP/2 counts them; larger calls are reset before any handler or token check."`
	// MaxHealthWatchers bounds open health Watch streams.
	MaxHealthWatchers int `name:"max-health-watchers" env:"FENCED_MAX_HEALTH_WATCHERS" default:"1024" help:"Most grpc.health.v1 Watch streams open at once (health needs no token); more are refused RESOURCE_EXHAUSTED."`
	// MaxConnections bounds open gRPC connections; 0: derived from the
	// file limit.
	MaxConnections int `name:"max-connections" env:"FENCED_MAX_CONNECTIONS" default:"0" help:"Most gRPC connections open at once; more are closed as they are accepted. 0: the file limit (raised to its hard limit at start) less a reserve for Redis connections and files, at most 16384."`
	// MaxConnectionsPerIP bounds open connections from one peer address.
	MaxConnectionsPerIP int `name:"max-connections-per-ip" env:"FENCED_MAX_CONNECTIONS_PER_IP" default:"1024" help:"Most gRPC connections open at once from one client IP address (-1: no per-address bound; behind a proxy every client shares its address)."`
	// FirstMessageTimeout bounds how long a call may take to send its
	// request; 0: unbounded.
	FirstMessageTimeout time.Duration `name:"first-message-timeout" env:"FENCED_FIRST_MESSAGE_TIMEOUT" default:"30s" help:"Longest a call may take, from its headers, to send its whole request (a stream: its first message); past it the call ends DEADLINE_EXCEEDED and frees its goroutine. Leave room for the largest batch over a slow or shared link (30s: ~9 MiB at 3 Mbit/s; 0: unbounded)."`
	// MaxRequestBytesInFlight bounds the request bytes being handled.
	MaxRequestBytesInFlight int64 `name:"max-request-bytes-in-flight" env:"FENCED_MAX_REQUEST_BYTES_IN_FLIGHT" default:"67108864" help:"Most request bytes (their encoded size) the calls being handled may hold at once in this process, from when a request is read until its call ends; a call that does not fit is refused RESOURCE_EXHAUSTED TOO_MANY_BYTES_IN_FLIGHT before anything is written. Requests of at most 64 KiB are not weighed, so large batches filling it never get small calls refused (their latency is the fair queue's: --max-redis-calls-in-flight) (default 64 MiB: seven batches at the default limits, each holding ~8 MB while it waits for Redis). At least --max-batch-value-bytes."`
	// MaxUnreadAnswerBytesPerCaller bounds the read answers one caller
	// has not read.
	MaxUnreadAnswerBytesPerCaller int64 `name:"max-unread-answer-bytes-per-caller" env:"FENCED_MAX_UNREAD_ANSWER_BYTES_PER_CALLER" default:"16777216" help:"Most bytes of read answers (Sections, ScanSection, Record) queued to one caller (--flows-by) and not yet written to it, because it grants no HTTP/2 flow-control credit; a read whose answer would go over it is refused RESOURCE_EXHAUSTED TOO_MANY_BYTES_IN_FLIGHT (metadata unread_answer_bytes), one answer alone always goes (default 16 MiB: four Sections answers at the largest)."`
	// MaxRequestBytesPerCaller bounds one caller's share of it.
	MaxRequestBytesPerCaller int64 `name:"max-request-bytes-per-caller" env:"FENCED_MAX_REQUEST_BYTES_PER_CALLER" default:"33554432" help:"Most of --max-request-bytes-in-flight the calls of one caller (--flows-by) may hold at once; one more over 64 KiB is refused RESOURCE_EXHAUSTED TOO_MANY_BYTES_IN_FLIGHT (metadata caller_bytes_in_flight), so that one caller's large batches waiting on replicas or a slow Redis leave the rest to the others (default 32 MiB, half the default budget). A request larger than it is served when its caller has nothing else in flight; at or above --max-request-bytes-in-flight: no share."`
	// MaxAckReplicas and MaxAckTimeout bound a batch's replica_ack.
	MaxAckReplicas int           `name:"max-ack-replicas" env:"FENCED_MAX_ACK_REPLICAS" default:"8" help:"Largest replica_ack.replicas a batch may ask for; more is INVALID_ARGUMENT before anything is written."`
	MaxAckTimeout  time.Duration `name:"max-ack-timeout" env:"FENCED_MAX_ACK_TIMEOUT" default:"5m" help:"Longest replica_ack.timeout_ms a batch may ask for; longer is INVALID_ARGUMENT before anything is written."`
	// MaxReplicaWaits and MaxReplicaWaitsPerSwarm bound waits in flight.
	MaxReplicaWaits         int `name:"max-replica-waits" env:"FENCED_MAX_REPLICA_WAITS" default:"512" help:"Most commits and lease changes waiting for replicas (Redis WAIT, each on a dedicated Redis connection) at once in this process; more are refused RESOURCE_EXHAUSTED before anything is written. Waits no longer than --wait-timeout (lease changes, batches without replica_ack) may take a quarter more, which longer replica_ack waits never use. Keep it and that quarter below the Redis client's blocking pool (1024)."`
	MaxReplicaWaitsPerSwarm int `name:"max-replica-waits-per-swarm" env:"FENCED_MAX_REPLICA_WAITS_PER_SWARM" default:"64" help:"Most of those waits for one swarm, so that one swarm cannot take them all."`
	// MaxWatchers, MaxWatchersPerConnection and MaxWatchersPerCaller bound
	// RecordsService Watch streams; WatchBuffer and WatchProgressInterval shape each one.
	MaxWatchers              int           `name:"max-watchers" env:"FENCED_MAX_WATCHERS" default:"10000" help:"Most RecordsService Watch streams open at once in this process; more are refused RESOURCE_EXHAUSTED TOO_MANY_WATCHERS. Watchers of one swarm share one Redis reader."`
	MaxWatchersPerConnection int           `name:"max-watchers-per-connection" env:"FENCED_MAX_WATCHERS_PER_CONNECTION" default:"128" help:"Most Watch streams open at once on one client connection; below --max-concurrent-streams, so that a connection's watchers leave streams for its other calls and one more Watch is refused (RESOURCE_EXHAUSTED) instead of queued."`
	MaxWatchersPerCaller     int           `name:"max-watchers-per-caller" aliases:"max-watchers-per-ip" env:"FENCED_MAX_WATCHERS_PER_CALLER,FENCED_MAX_WATCHERS_PER_IP" default:"0" help:"Most Watch streams open at once of one caller (--flows-by), over all its connections and addresses, so that one caller cannot take every --max-watchers slot (more: RESOURCE_EXHAUSTED TOO_MANY_WATCHERS, limit caller). 0: a quarter of --max-watchers, at least --max-watchers-per-connection; -1: no per-caller bound."`
	WatchBuffer              int           `name:"watch-buffer" env:"FENCED_WATCH_BUFFER" default:"256" help:"Fan-outs of its swarm's reader (each every batch since the previous one, under 3,000) one watcher may fall behind before it is dropped (RESOURCE_EXHAUSTED WATCHER_TOO_SLOW; it resumes from its last revision)."`
	WatchCoalesce            time.Duration `name:"watch-coalesce" env:"FENCED_WATCH_COALESCE" default:"50ms" help:"Shortest time between two fan-outs of one swarm's Watch reader: a batch after a quiet spell goes out at once; under a stream of commits each fan-out carries every batch since the last, so watching costs one message per watcher per interval whatever the write rate (0: no coalescing)."`
	WatchCoalesceWatchers    int           `name:"watch-coalesce-watchers" env:"FENCED_WATCH_COALESCE_WATCHERS" default:"512" help:"Watchers of one swarm one --watch-coalesce interval serves: with more, the time between two fan-outs under a stream of commits grows in proportion (1,000 watchers: twice the interval), at most 1s, so that a swarm's fan-outs cost about as much whatever its watchers (0: it does not grow)."`
	// FlowsBy, MaxRedisCallsInFlight, SharedConcurrency and
	// MaxQueuedCallsPerCaller shape the fair queue in front of Redis
	// (admission.Fairness).
	FlowsBy                 string `name:"flows-by" env:"FENCED_FLOWS_BY" enum:"token,address" default:"token" help:"How the fair queue in front of Redis tells callers apart: token (the bearer token's name when authorization is on, whatever the caller's connections and addresses; else the peer address) or address (the peer's IP address, tokens or not: callers behind one proxy are one caller, one caller with several addresses several)."`
	MaxRedisCallsInFlight   int    `name:"max-redis-calls-in-flight" env:"FENCED_MAX_REDIS_CALLS_IN_FLIGHT" default:"64" help:"Seats of the fair queue in front of Redis: calls served at once, a call taking one seat per 125us of Redis it is estimated at (a commit of up to ~8 puts one, a batch of a thousand puts or a Sections of a large swarm all, alone), so that what is queued in Redis ahead of a call stays within about this many x 125us; the others wait their turn, callers served in fair shares. A caller alone is held only for a call of every seat."`
	SharedConcurrency       int    `name:"shared-concurrency" env:"FENCED_SHARED_CONCURRENCY" default:"0" help:"Calls served at once to the callers active together (calls waiting or served, or one ended within the last second), in equal parts, while more than one is: a caller flooding fenced with parallel calls leaves the others their part of its cores; a caller alone is bounded by the seats only (0: GOMAXPROCS, at least 2)."`
	MaxQueuedCallsPerCaller int    `name:"max-queued-calls-per-caller" env:"FENCED_MAX_QUEUED_CALLS_PER_CALLER" default:"256" help:"Calls one caller may have waiting in the fair queue; one more is refused RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED with a RetryInfo delay, nothing written."`
	// MaxSectionStreams and MaxSectionStreamsPerCaller bound StreamSections
	// streams (server.SectionStreamOptions).
	MaxSectionStreams          int `name:"max-section-streams" env:"FENCED_MAX_SECTION_STREAMS" default:"16" help:"Most StreamSections streams (whole sections of any size) open at once in this process; more are refused RESOURCE_EXHAUSTED TOO_MANY_SECTION_STREAMS with a retry delay, nothing read. Each holds at most one answer's worth of records and one 1 MiB message at once."`
	MaxSectionStreamsPerCaller int `name:"max-section-streams-per-caller" aliases:"max-section-streams-per-ip" env:"FENCED_MAX_SECTION_STREAMS_PER_CALLER,FENCED_MAX_SECTION_STREAMS_PER_IP" default:"2" help:"Most StreamSections streams one caller (as --flows-by tells callers apart) has open at once (more: RESOURCE_EXHAUSTED TOO_MANY_SECTION_STREAMS, limit caller)."`
	// RetiredHeavyReads holds the heavy-read gate's flags, gone with the
	// fair queue (issue 41): accepted, so that scripts written for them
	// still start, and ignored with a WARN (retired).
	RetiredHeavyReads
	WatchProgressInterval time.Duration `name:"watch-progress-interval" env:"FENCED_WATCH_PROGRESS_INTERVAL" default:"30s" help:"A Watch stream quiet this long gets a progress event (its revision), so that proxies with idle timeouts keep it."`
}

// RetiredHeavyReads are the flags of the heavy-read gate the fair queue
// replaced: hidden, their values ignored.
type RetiredHeavyReads struct {
	MaxHeavyReadsPerCaller string `name:"max-heavy-reads-per-caller" env:"FENCED_MAX_HEAVY_READS_PER_CALLER" hidden:"" help:"Retired: ignored (the fair queue schedules heavy reads)."`
	MaxHeavyReads          string `name:"max-heavy-reads" env:"FENCED_MAX_HEAVY_READS" hidden:"" help:"Retired: ignored (the fair queue schedules heavy reads)."`
	HeavyReadShare         string `name:"heavy-read-share" env:"FENCED_HEAVY_READ_SHARE" hidden:"" help:"Retired: ignored (the fair queue schedules heavy reads)."`
	HeavyReadBurst         string `name:"heavy-read-burst" env:"FENCED_HEAVY_READ_BURST" hidden:"" help:"Retired: ignored (the fair queue schedules heavy reads)."`
}

// retired logs a WARN naming each retired flag given: its value is
// ignored.
func (l *limitFlags) retired(log *slog.Logger) {
	r := l.RetiredHeavyReads
	for _, f := range []struct{ name, value string }{
		{"--max-heavy-reads-per-caller", r.MaxHeavyReadsPerCaller}, {"--max-heavy-reads", r.MaxHeavyReads},
		{"--heavy-read-share", r.HeavyReadShare}, {"--heavy-read-burst", r.HeavyReadBurst},
	} {
		if f.value != "" {
			log.Warn("retired flag ignored: heavy reads take their turn in the fair queue like every call (configuration.md, Fair share)", "flag", f.name, "value", f.value)
		}
	}
}

// connectionReserve is the file descriptors kept for everything but gRPC
// connections when --max-connections is derived from the file limit: Redis
// connections (rueidis: one pipelined connection per node plus up to
// --max-replica-waits dedicated ones), the listeners, /metrics, TLS and token
// files.
func (l *limitFlags) connectionReserve() int {
	return l.MaxReplicaWaits + engine.ReplicaWaitReserve(l.MaxReplicaWaits) + 256
}

// maxStreamWorkers caps --stream-workers: every worker is a goroutine
// held from start, and more workers than calls in flight only cost memory.
const maxStreamWorkers = 1 << 16

// maxDerivedConnections caps a --max-connections derived from a large file
// limit.
const maxDerivedConnections = 16384

// check refuses bounds that cannot work.
func (l *limitFlags) check(waitReplicas int, waitTimeout time.Duration) error {
	switch {
	case l.KeepaliveMinTime <= 0 || l.KeepaliveTime < time.Second || l.KeepaliveTimeout <= 0 || l.MaxConnectionIdle <= 0:
		return fmt.Errorf("configuration: --keepalive-min-time, --keepalive-timeout and --max-connection-idle must be > 0, --keepalive-time >= 1s")
	case l.MaxConcurrentStreams < 1 || l.MaxHeaderListBytes < 1024 || l.MaxHealthWatchers < 1:
		return fmt.Errorf("configuration: --max-concurrent-streams and --max-health-watchers must be >= 1, --max-header-bytes >= 1024")
	case l.FirstMessageTimeout < 0:
		return fmt.Errorf("configuration: --first-message-timeout must be >= 0 (0: unbounded)")
	case l.StreamWorkers < 0 || l.StreamWorkers > maxStreamWorkers:
		return fmt.Errorf("configuration: --stream-workers must be >= 0 (0: none) and <= %d", maxStreamWorkers)
	case l.MaxConnections < 0 || l.MaxConnectionsPerIP < -1 || l.MaxConnectionsPerIP == 0:
		return fmt.Errorf("configuration: --max-connections must be >= 0 (0: derived), --max-connections-per-ip >= 1 or -1 (off)")
	case l.MaxAckReplicas < 1 || l.MaxAckTimeout < time.Millisecond:
		return fmt.Errorf("configuration: --max-ack-replicas must be >= 1, --max-ack-timeout >= 1ms")
	case waitReplicas > l.MaxAckReplicas:
		return fmt.Errorf("configuration: --wait-replicas %d is over --max-ack-replicas %d", waitReplicas, l.MaxAckReplicas)
	case waitTimeout > l.MaxAckTimeout:
		return fmt.Errorf("configuration: --wait-timeout %v is over --max-ack-timeout %v", waitTimeout, l.MaxAckTimeout)
	case l.MaxReplicaWaits < 1 || l.MaxReplicaWaitsPerSwarm < 1:
		return fmt.Errorf("configuration: --max-replica-waits and --max-replica-waits-per-swarm must be >= 1")
	case l.MaxWatchers < 1 || l.MaxWatchersPerConnection < 1 || l.WatchBuffer < 1 || l.WatchProgressInterval < 100*time.Millisecond || l.WatchCoalesce < 0 || l.WatchCoalesceWatchers < 0:
		return fmt.Errorf("configuration: --max-watchers, --max-watchers-per-connection and --watch-buffer must be >= 1, --watch-progress-interval >= 100ms, --watch-coalesce and --watch-coalesce-watchers >= 0")
	case l.MaxWatchersPerCaller < -1:
		return fmt.Errorf("configuration: --max-watchers-per-caller must be >= 1, 0 (a quarter of --max-watchers, at least --max-watchers-per-connection) or -1 (off)")
	case l.MaxRedisCallsInFlight < 1 || l.SharedConcurrency < 0 || l.MaxQueuedCallsPerCaller < 1:
		return fmt.Errorf("configuration: --max-redis-calls-in-flight and --max-queued-calls-per-caller must be >= 1, --shared-concurrency >= 0 (0: GOMAXPROCS)")
	case l.MaxSectionStreams < 1 || l.MaxSectionStreamsPerCaller < 1:
		return fmt.Errorf("configuration: --max-section-streams and --max-section-streams-per-caller must be >= 1")
	case l.MaxWatchersPerConnection >= int(l.MaxConcurrentStreams):
		return fmt.Errorf("configuration: --max-watchers-per-connection %d must be below --max-concurrent-streams %d: a connection's watchers would take all its streams, and its next Watch and its other calls would wait instead of the Watch being refused", l.MaxWatchersPerConnection, l.MaxConcurrentStreams)
	}
	return nil
}

// connections is the connection limit in effect: --max-connections, or one
// derived from the file limit (soft, after raising it to the hard limit).
// A --max-connections at or over what the file limit leaves is lowered to
// it, with a warning: past it, accept fails (EMFILE) and fenced stops
// answering everyone, /metrics included.
func (l *limitFlags) connections(log *slog.Logger, fileLimit uint64) int {
	room := int(min(fileLimit, 1<<30)) - l.connectionReserve()
	room = max(room, 16)
	switch {
	case l.MaxConnections == 0:
		return min(room, maxDerivedConnections)
	case l.MaxConnections > room:
		log.Warn("--max-connections is over what the file limit leaves; lowered", "max_connections", l.MaxConnections, "file_limit", fileLimit, "reserve", l.connectionReserve(), "lowered_to", room)
		return room
	}
	return l.MaxConnections
}

// transport is the server's Transport for these flags.
func (l *limitFlags) transport(maxConnections int) bounds.Transport {
	return bounds.Transport{
		KeepaliveMinTime:     l.KeepaliveMinTime,
		KeepaliveTime:        l.KeepaliveTime,
		KeepaliveTimeout:     l.KeepaliveTimeout,
		MaxConnectionIdle:    l.MaxConnectionIdle,
		MaxConcurrentStreams: l.MaxConcurrentStreams,
		MaxHeaderListBytes:   l.MaxHeaderListBytes,
		MaxHealthWatchers:    l.MaxHealthWatchers,
		MaxConnections:       maxConnections,
		MaxConnectionsPerIP:  l.MaxConnectionsPerIP,
		StreamWorkers:        streamWorkers(l.StreamWorkers),

		MaxRequestBytesInFlight:       l.MaxRequestBytesInFlight,
		MaxRequestBytesPerCaller:      l.MaxRequestBytesPerCaller,
		MaxUnreadAnswerBytesPerCaller: l.MaxUnreadAnswerBytesPerCaller,
		FirstMessageTimeout:           firstMessageTimeout(l.FirstMessageTimeout),
	}
}

// streamWorkers is Transport.StreamWorkers for --stream-workers n, whose 0
// means none (Transport's 0 means its default).
func streamWorkers(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// firstMessageTimeout is Transport.FirstMessageTimeout for
// --first-message-timeout d, whose 0 means unbounded (Transport's 0 means
// its default).
func firstMessageTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// storeOptions bounds the store's replica waits and sets its watch buffer
// and coalescing in o (the flags' 0, "none", is watch.Options's negative).
func (l *limitFlags) storeOptions(o *store.Options) {
	o.Engine.MaxReplicaWaits, o.Engine.MaxReplicaWaitsPerSwarm = l.MaxReplicaWaits, l.MaxReplicaWaitsPerSwarm
	o.Watch.Buffer, o.Watch.Coalesce, o.Watch.CoalesceWatchers = l.WatchBuffer, l.WatchCoalesce, l.WatchCoalesceWatchers
	if l.WatchCoalesce == 0 {
		o.Watch.Coalesce = -1
	}
	if l.WatchCoalesceWatchers == 0 {
		o.Watch.CoalesceWatchers = -1
	}
}

// fairness is the server's Fairness for these flags.
func (l *limitFlags) fairness() admission.Fairness {
	return admission.Fairness{FlowsBy: admission.FlowsBy(l.FlowsBy),
		Queue: fair.Config{Seats: l.MaxRedisCallsInFlight, Concurrency: l.SharedConcurrency, QueueLength: l.MaxQueuedCallsPerCaller}}
}

// sectionStreams is the server's SectionStreamOptions for these flags.
func (l *limitFlags) sectionStreams() server.SectionStreamOptions {
	return server.SectionStreamOptions{Max: l.MaxSectionStreams, MaxPerCaller: l.MaxSectionStreamsPerCaller}
}

// watch is the server's WatchOptions for these flags.
func (l *limitFlags) watch() server.WatchOptions {
	return server.WatchOptions{Max: l.MaxWatchers, MaxPerConnection: l.MaxWatchersPerConnection, MaxPerCaller: l.MaxWatchersPerCaller, ProgressInterval: l.WatchProgressInterval}
}
