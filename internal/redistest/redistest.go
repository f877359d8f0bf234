// Package redistest is the single place in this module that starts real Redis
// servers for tests.
//
// It owns the whole lifecycle of those servers: finding the redis-server
// binary (or, when it is missing, falling back to a Docker engine through
// testcontainers-go), choosing free loopback ports, giving every server its
// own t.TempDir, waiting until it answers PING, wiring a Redis Cluster
// together, and killing the processes it started when the test ends. Tests
// that need a real Redis use this package instead of starting redis-server
// themselves; missing features belong here.
//
// Servers listen on 127.0.0.1 only. Failures call t.Fatal; the package never
// skips a test: if neither redis-server nor a Docker engine is available the
// test fails with an install hint.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

const (
	// readyTimeout bounds how long a server may take to answer PING: a
	// failure bound, never a measurement (the probe returns at the first
	// PONG). On a 2-core box at load 60-90 a restarted redis-server took
	// more than 10 s.
	readyTimeout = time.Minute
	// bindAttempts bounds how often Start retries with a fresh port when the
	// chosen port was taken between probing and binding.
	bindAttempts = 5
	// pollInterval is the pause between readiness probes.
	pollInterval = 20 * time.Millisecond
	// cmdTimeout bounds a single command sent through Do/DoArray.
	cmdTimeout = 10 * time.Second
	// logTailLines is how many log lines failure messages include.
	logTailLines = 40
)

// notFoundHint is the failure message when no Redis can be started at all.
const notFoundHint = "redis-server not found: install it (Debian: apt-get install -y redis-server) or run a Docker engine"

// Option configures a server started by Start.
type Option func(*config)

type config struct {
	aof   bool
	extra []string
	// cluster holds the cluster-mode arguments; set only by StartCluster.
	cluster bool
}

// WithAOF turns on the append-only file with appendfsync always, so every
// acknowledged write survives Kill followed by Restart.
func WithAOF() Option {
	return func(c *config) { c.aof = true }
}

// WithArgs appends extra redis-server command-line arguments, for example
// WithArgs("--maxmemory", "10mb"). They come after the defaults, so they
// override them.
func WithArgs(args ...string) Option {
	return func(c *config) { c.extra = append(c.extra, args...) }
}

// Server is one Redis server started by Start or StartCluster. Addr, URL,
// Pid, Client, Do and DoArray are safe for concurrent use; Kill and Restart
// must not run concurrently with each other.
type Server struct {
	dir string

	mu      sync.Mutex
	addr    string   // host:port the server is reachable at
	proc    *process // local backend; nil when running in Docker
	docker  *dockerServer
	args    []string // full redis-server argv (without the binary) for Restart
	bin     string
	busPort int // cluster bus port, 0 when not in cluster mode
}

// Start starts a standalone redis-server on a free 127.0.0.1 port in a fresh
// t.TempDir, with persistence off (save "" and appendonly no) unless options
// say otherwise, and waits until it answers PING. The server is killed when
// the test ends. If redis-server is not on PATH, Start falls back to a Docker
// container (image redis:7) when a Docker engine answers, and otherwise fails
// the test with an install hint.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	bin, useDocker := chooseBackend(t)
	if useDocker {
		return startDocker(t, cfg)
	}
	return startLocal(t, bin, cfg)
}

// chooseBackend returns the redis-server path, or useDocker=true when the
// Docker fallback must be used. It fails the test when neither is available.
func chooseBackend(t testing.TB) (bin string, useDocker bool) {
	t.Helper()
	if os.Getenv("REDISTEST_DOCKER") == "1" {
		return "", true
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, false
	}
	if dockerAvailable() {
		return "", true
	}
	t.Fatal(notFoundHint)
	return "", false
}

// startLocal runs redis-server from bin, retrying with a new port when the
// chosen one was grabbed by someone else before redis-server bound it.
func startLocal(t testing.TB, bin string, cfg config) *Server {
	t.Helper()
	s := &Server{dir: t.TempDir(), bin: bin}
	t.Cleanup(s.stop)
	var lastErr error
	for attempt := 0; attempt < bindAttempts; attempt++ {
		port := freePort(t)
		if cfg.cluster {
			s.busPort = freePort(t)
		}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.args = localArgs(s.dir, port, s.busPort, cfg)
		err := s.launch()
		if err == nil {
			return s
		}
		lastErr = err
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	t.Fatalf("redistest: start redis-server: %v\n%s", lastErr, s.logTail())
	return nil
}

// localArgs builds the redis-server argv for a local server.
func localArgs(dir string, port, busPort int, cfg config) []string {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--dir", dir,
		"--logfile", "redis.log",
		"--save", "",
		"--appendonly", "no",
	}
	if cfg.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	if cfg.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
			"--cluster-port", strconv.Itoa(busPort),
			"--cluster-announce-ip", "127.0.0.1",
		)
	}
	return append(args, cfg.extra...)
}

// freePort asks the kernel for a free 127.0.0.1 TCP port. The port is only
// free at the moment of the call; callers retry on bind failure.
func freePort(t testing.TB) int {
	t.Helper()
	var err error
	for i := 0; i < 3; i++ {
		var l net.Listener
		l, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			continue
		}
		port := l.Addr().(*net.TCPAddr).Port
		if err = l.Close(); err == nil {
			return port
		}
	}
	t.Fatalf("redistest: find free port: %v", err)
	return 0
}

// Addr returns the server's "host:port" (127.0.0.1:port for local servers).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// URL returns the server address as a redis:// URL accepted by
// rueidis.ParseURL.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Dir returns the server's data directory (its own t.TempDir), where the
// AOF, nodes.conf and redis.log live. Docker servers keep their data inside
// the container, so their Dir stays empty.
func (s *Server) Dir() string { return s.dir }

// Pid returns the OS process id of the running redis-server, or 0 when the
// server is not running or runs inside Docker.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid()
}

// Client returns a rueidis client connected to this server alone
// (DisableCache and ForceSingleClient set, so it works on cluster nodes too).
// It is closed when the test ends.
func (s *Server) Client(t testing.TB) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{s.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err != nil {
		t.Fatalf("redistest: connect to %s: %v", s.Addr(), err)
	}
	t.Cleanup(c.Close)
	return c
}

// InfoInt is the integer field of INFO section (total_net_output_bytes of
// "stats", used_memory of "memory"). A missing or non-integer field fails
// the test.
func (s *Server) InfoInt(t testing.TB, section, field string) int64 {
	t.Helper()
	v, ok := parseInfo(s.Do(t, "INFO", section))[field]
	if !ok {
		t.Fatalf("redistest: INFO %s has no %s", section, field)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("redistest: INFO %s %s = %q: %v", section, field, v, err)
	}
	return n
}

// Do sends one command to this server over a fresh connection and returns
// the reply as a string: simple and bulk strings as is, integers in decimal,
// nil as "", and arrays/maps flattened and joined with "\n". An error reply
// fails the test.
func (s *Server) Do(t testing.TB, args ...string) string {
	t.Helper()
	return strings.Join(flatten(s.do(t, args)), "\n")
}

// DoArray is like Do but returns the flattened elements of an array or map
// reply (a scalar reply becomes a one-element slice, nil an empty one).
func (s *Server) DoArray(t testing.TB, args ...string) []string {
	t.Helper()
	return flatten(s.do(t, args))
}

func (s *Server) do(t testing.TB, args []string) any {
	t.Helper()
	if len(args) == 0 {
		t.Fatal("redistest: Do needs a command")
	}
	v, err := doOnce(s.Addr(), args)
	if err != nil {
		t.Fatalf("redistest: %s on %s: %v", strings.Join(args, " "), s.Addr(), err)
	}
	return v
}

// doOnce runs one command on addr through a short-lived single-node client.
// It speaks RESP2 on purpose: RESP3 turns INFO-style replies into verbatim
// strings that rueidis returns with their "txt:" prefix, and map replies
// (CONFIG GET, HGETALL) into Go maps with random order, while RESP2 gives
// plain strings and ordered flat arrays.
func doOnce(addr string, args []string) (any, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{addr},
		DisableCache:      true,
		ForceSingleClient: true,
		DisableRetry:      true,
		AlwaysRESP2:       true,
	})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	res := c.Do(ctx, c.B().Arbitrary(args...).Build())
	if err := res.Error(); err != nil {
		if rueidis.IsRedisNil(err) {
			return nil, nil
		}
		return nil, err
	}
	return res.ToAny()
}

// flatten renders a decoded reply as strings.
func flatten(v any) []string {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return []string{x}
	case int64:
		return []string{strconv.FormatInt(x, 10)}
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, flatten(e)...)
		}
		return out
	case map[string]any: // not produced over RESP2; kept for completeness
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var out []string
		for _, k := range keys {
			out = append(out, k)
			out = append(out, flatten(x[k])...)
		}
		return out
	default:
		return []string{fmt.Sprint(x)}
	}
}

// Kill sends SIGKILL to the server and waits for it to exit (for Docker
// servers: stops the container immediately). Data not yet persisted is lost;
// with WithAOF every acknowledged write is persisted.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.docker != nil {
		if err := s.docker.kill(); err != nil {
			t.Fatalf("redistest: kill container: %v", err)
		}
		return
	}
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// Restart starts the server again with the same arguments, port and data
// directory (so AOF data survives) and waits until it answers PING. A server
// that is still running is killed first. Docker servers keep their data but
// may come back on a different host port; use Addr again after Restart.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill(t)
	if s.docker != nil {
		if err := s.restartDocker(); err != nil {
			t.Fatalf("redistest: restart container: %v", err)
		}
		return
	}
	// The old process is gone but the port may linger briefly in the
	// kernel; redis-server sets SO_REUSEADDR, so only a foreign listener
	// can make this fail. Retry a few times before giving up.
	var err error
	for attempt := 0; attempt < bindAttempts; attempt++ {
		if err = s.launch(); err == nil || !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		t.Fatalf("redistest: restart redis-server on %s: %v\n%s", s.Addr(), err, s.logTail())
	}
}

// stop is the t.Cleanup hook: it kills whatever is still running.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// waitReady polls addr with PING over raw TCP until it answers PONG, exited
// reports a dead process, or readyTimeout passes.
func waitReady(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	var last error
	for {
		if last = ping(addr); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG from %s within %v: %w", addr, readyTimeout, last)
		}
		select {
		case <-exited:
			return errExited
		case <-time.After(pollInterval):
		}
	}
}

var errExited = errors.New("redis-server exited before answering PING")

// ping sends one RESP PING on a fresh TCP connection and expects +PONG.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING reply %q", line)
	}
	return nil
}

// logTail returns the last lines of the server's log and stdio capture.
func (s *Server) logTail() string {
	if s.docker != nil {
		return s.docker.logTail()
	}
	var b strings.Builder
	for _, name := range logNames {
		data, err := os.ReadFile(filepath.Join(s.dir, name))
		if err != nil || len(data) == 0 {
			continue
		}
		fmt.Fprintf(&b, "--- %s (tail) ---\n%s\n", name, tail(string(data), logTailLines))
	}
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CommandStat is one command's line of INFO commandstats: how many times
// Redis ran it and the µs it spent (usec).
type CommandStat struct {
	Calls, Usec float64
}

// CommandStats is INFO commandstats by command name as Redis spells it
// ("evalsha", "memory|usage"); a command Redis never ran is absent.
func (s *Server) CommandStats(t testing.TB) map[string]CommandStat {
	t.Helper()
	stats := map[string]CommandStat{}
	for line := range strings.SplitSeq(s.Do(t, "INFO", "commandstats"), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat {
			continue
		}
		var st CommandStat
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				st.Usec, _ = strconv.ParseFloat(v, 64)
			}
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				st.Calls, _ = strconv.ParseFloat(v, 64)
			}
		}
		stats[name] = st
	}
	return stats
}

// MainThreadCPU is the CPU time Redis's main thread has used (INFO cpu's
// used_cpu_user_main_thread + used_cpu_sys_main_thread, Redis 7): the
// thread that runs every command and script, so a difference of two
// readings is what the commands between them cost Redis, without the time
// it waited to be scheduled (which INFO commandstats' usec counts on a
// busy machine).
func (s *Server) MainThreadCPU(t testing.TB) time.Duration {
	t.Helper()
	info := parseInfo(s.Do(t, "INFO", "cpu"))
	var total float64
	for _, field := range []string{"used_cpu_user_main_thread", "used_cpu_sys_main_thread"} {
		v, ok := info[field]
		if !ok {
			t.Fatalf("redistest: INFO cpu has no %s", field)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("redistest: INFO cpu %s = %q: %v", field, v, err)
		}
		total += f
	}
	return time.Duration(total * float64(time.Second))
}

// SettleHash rewrites the hash at key with DUMP and RESTORE ... REPLACE in
// one script, so that Redis holds it in one table sized for its fields.
// Right after many HSETs Redis may still be moving a hash to a larger
// table, one bucket per command and the rest on its own clock (serverCron's
// active rehashing); while it does, the fields one HSCAN cursor answers can
// change from one call to the next, and ScanSection's contract lets a
// record appear twice. A test that asserts each record of an unchanged
// section is read exactly once calls SettleHash first, so that what it
// asserts does not depend on how far Redis got.
func (s *Server) SettleHash(t testing.TB, key string) {
	t.Helper()
	s.Do(t, "EVAL", "local d = redis.call('DUMP', KEYS[1]) if d then redis.call('RESTORE', KEYS[1], 0, d, 'REPLACE') end return 1", "1", key)
}
