package store

import (
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// ClientOptions turns a Redis URL into rueidis options. Any URL that
// rueidis.ParseURL takes works: redis://, rediss://, unix://, several
// addresses (?addr=host:port) for Cluster, ?master_set= for Sentinel.
// Client-side caching is off (fenced never reads through a cache), and
// rueidis retries only read-only commands: a commit is never sent twice.
func ClientOptions(url string) (rueidis.ClientOption, error) {
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return rueidis.ClientOption{}, fmt.Errorf("store: redis url: %w", err)
	}
	opt.DisableCache = true
	if opt.ConnWriteTimeout == 0 {
		opt.ConnWriteTimeout = 5 * time.Second
	}
	return opt, nil
}

// Open connects to the Redis at url (see ClientOptions) and returns a Store
// over it with the given key prefix, able to reconnect (WithDial). On Cluster, rueidis follows MOVED and
// ASK itself; none reaches a caller.
func Open(url, prefix string, opts ...Option) (*Store, error) {
	opt, err := ClientOptions(url)
	if err != nil {
		return nil, err
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("store: connect to redis: %w", err)
	}
	dial := WithDial(func() (rueidis.Client, error) { return rueidis.NewClient(opt) })
	s, err := New(client, prefix, append([]Option{dial}, opts...)...)
	if err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// Embedded is an in-memory Redis (miniredis) inside the process, on a
// loopback port: enough to try fenced on a machine without Redis, never for
// production. Nothing it holds survives the process.
type Embedded struct {
	server *miniredis.Miniredis
}

// StartEmbedded starts an in-memory Redis on 127.0.0.1 at a free port.
func StartEmbedded() (*Embedded, error) {
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("store: start embedded redis: %w", err)
	}
	return &Embedded{server: m}, nil
}

// Addr is the embedded Redis's host:port.
func (e *Embedded) Addr() string { return e.server.Addr() }

// Open returns a Store over the embedded Redis.
func (e *Embedded) Open(prefix string, opts ...Option) (*Store, error) {
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{e.server.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err != nil {
		return nil, fmt.Errorf("store: connect to embedded redis: %w", err)
	}
	s, err := New(client, prefix, opts...)
	if err != nil {
		client.Close()
		return nil, err
	}
	// miniredis has neither ROLE nor CONFIG, and never evicts: no warnings.
	s.roleRefused.Store(true)
	s.configRefused.Store(true)
	return s, nil
}

// Close stops the embedded Redis.
func (e *Embedded) Close() { e.server.Close() }
