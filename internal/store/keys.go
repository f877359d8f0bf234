package store

import "github.com/agentihooks/fenced/internal/store/protocol"

// swarmKeys are the Redis keys of one swarm (docs/design.md §2.1). Every one but
// current carries the slug as its hash tag, so that one script can touch
// all of them on Redis Cluster.
type swarmKeys struct {
	slug string
	base string // "<prefix>:swarm:{<slug>}:fence:"
	// current is P:state:fencing:current: the document layout and the
	// standalone stamp. It has no hash tag.
	current string
}

func (s *Store) keys(slug string) swarmKeys {
	return swarmKeys{
		slug:    slug,
		base:    s.prefix + ":{" + slug + protocol.FenceInfix,
		current: s.prefix + ":" + protocol.CurrentKey,
	}
}

func (k swarmKeys) section(name string) string { return k.base + name }
func (k swarmKeys) meta() string               { return k.base + protocol.KeyMeta }
func (k swarmKeys) revision() string           { return k.base + protocol.KeyRevision }
func (k swarmKeys) log() string                { return k.base + protocol.KeyLog }
func (k swarmKeys) byName() string             { return k.base + protocol.KeyByName }

// byNameIndex is the sorted set that orders each agent name's executions
// by generation (byname.lua).
func (k swarmKeys) byNameIndex() string { return k.base + protocol.KeyByNameIndex }

// request is the key that remembers a committed batch's request id.
func (k swarmKeys) request(id string) string { return k.base + protocol.KeyRequestPrefix + id }
