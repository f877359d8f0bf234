package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// ClientOptions turns a Redis URL into rueidis options. Any URL that
// rueidis.ParseURL takes works: redis://, rediss://, unix://, several
// addresses (?addr=host:port) for Cluster, ?master_set= for Sentinel.
// Client-side caching is off (fenced never reads through a cache), and
// rueidis retries only read-only commands: a commit is never sent twice.
// AlwaysPipelining keeps a goroutine reading every connection, so one that
// Redis closed (a restart, its idle timeout) is replaced before the next
// call instead of failing it with EOF (docs/design/10-running-and-operating.md §10.3).
func ClientOptions(url string) (rueidis.ClientOption, error) {
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return rueidis.ClientOption{}, fmt.Errorf("store: redis url: %w", err)
	}
	opt.DisableCache = true
	opt.AlwaysPipelining = true
	if opt.ConnWriteTimeout == 0 {
		opt.ConnWriteTimeout = 5 * time.Second
	}
	return opt, nil
}

// Open connects to the Redis at url (see ClientOptions) and returns a
// Store over it, able to reconnect (o.Engine.Dial, set here). On Cluster,
// rueidis follows MOVED and ASK itself; none reaches a caller.
func Open(url string, o Options) (*Store, error) {
	opt, err := ClientOptions(url)
	if err != nil {
		return nil, err
	}
	client, err := NewClient(&opt)
	if err != nil {
		return nil, fmt.Errorf("store: connect to redis: %w", err)
	}
	o.Engine.Dial = func() (rueidis.Client, error) { return rueidis.NewClient(opt) }
	s, err := New(client, o)
	if err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// NewClient connects with rueidis.NewClient(*opt), then checks rueidis's
// choice of topology: a client in cluster mode whose server is not a Redis
// Cluster (clusterEnabled) is closed and made again as a single client, and
// opt.ForceSingleClient is set so that later connections made from *opt
// agree. Without this, a store over the embedded Redis reached by its URL
// would call itself Cluster, skip the standalone stamp and ask for the
// layout outside the script. Errors are rueidis's, unwrapped.
func NewClient(opt *rueidis.ClientOption) (rueidis.Client, error) {
	client, err := rueidis.NewClient(*opt)
	if err != nil || client.Mode() != rueidis.ClientModeCluster || clusterEnabled(client) {
		return client, err
	}
	client.Close()
	opt.ForceSingleClient = true
	return rueidis.NewClient(*opt)
}

// clusterEnabled reports whether a client rueidis put in cluster mode talks
// to a Redis Cluster. rueidis picks cluster mode for any server that answers
// CLUSTER SLOTS, and miniredis answers it as a one-node cluster although it
// is a standalone Redis. A Redis Cluster node says cluster_enabled:1 in INFO
// cluster; a server that answers INFO cluster without it, or refuses the
// section (miniredis: "section (cluster) is not supported"), is not one.
// When the question cannot be answered (NOPERM for an ACL user, a network
// error) rueidis's choice stands.
func clusterEnabled(client rueidis.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := client.Do(ctx, client.B().Info().Section("cluster").Build()).ToString()
	if err != nil {
		var re *rueidis.RedisError
		if errors.As(err, &re) && !strings.HasPrefix(re.Error(), "NOPERM") {
			return false
		}
		return true
	}
	return strings.Contains(info, "cluster_enabled:1")
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
func (m *Embedded) Addr() string { return m.server.Addr() }

// Open returns a Store over the embedded Redis.
func (m *Embedded) Open(o Options) (*Store, error) {
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{m.server.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err != nil {
		return nil, fmt.Errorf("store: connect to embedded redis: %w", err)
	}
	// miniredis has neither ROLE nor CONFIG, and never evicts: no warnings.
	o.Engine.Embedded = true
	s, err := New(client, o)
	if err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// Close stops the embedded Redis.
func (m *Embedded) Close() { m.server.Close() }
