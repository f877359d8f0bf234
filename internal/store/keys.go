package store

import (
	"strings"

	"github.com/agentihooks/fenced/internal/protocol"
)

// swarmKeys are the Redis keys of one swarm (docs/design/02-redis-layout.md §2.1). Every one but
// current carries the slug as its hash tag, so that one script can touch
// all of them on Redis Cluster.
type swarmKeys struct {
	slug string
	base string // "<prefix>:swarm:{<slug>}:fence:"
	// fixed is base+meta, base+revision and base+log back to back: the keys
	// every commit sends, made with base in one allocation (base is its
	// start, each key a slice of it).
	fixed string
	// current is P:state:fencing:current: the document layout and the
	// standalone stamp. It has no hash tag.
	current string
}

// fixedNames are the names whose keys swarmKeys.fixed holds, in order.
var fixedNames = [...]string{protocol.KeyMeta, protocol.KeyRevision, protocol.KeyLog}

func (s *Store) keys(slug string) swarmKeys {
	n := len(s.prefix) + len(":{") + len(slug) + len(protocol.FenceInfix)
	var b strings.Builder
	b.Grow(len(fixedNames)*n + len(protocol.KeyMeta) + len(protocol.KeyRevision) + len(protocol.KeyLog))
	for _, name := range fixedNames {
		b.WriteString(s.prefix)
		b.WriteString(":{")
		b.WriteString(slug)
		b.WriteString(protocol.FenceInfix)
		b.WriteString(name)
	}
	fixed := b.String()
	return swarmKeys{slug: slug, base: fixed[:n], fixed: fixed, current: s.currentKey}
}

// fixedKey is the i-th key of k.fixed (fixedNames[i]).
func (k swarmKeys) fixedKey(i int) string {
	from := 0
	for j := range i {
		from += len(k.base) + len(fixedNames[j])
	}
	return k.fixed[from : from+len(k.base)+len(fixedNames[i])]
}

func (k swarmKeys) section(name string) string { return k.base + name }
func (k swarmKeys) meta() string               { return k.fixedKey(0) }
func (k swarmKeys) revision() string           { return k.fixedKey(1) }
func (k swarmKeys) log() string                { return k.fixedKey(2) }
func (k swarmKeys) byName() string             { return k.base + protocol.KeyByName }

// byNameIndex is the sorted set that orders each agent name's executions
// by generation (byname.lua).
func (k swarmKeys) byNameIndex() string { return k.base + protocol.KeyByNameIndex }

// requestIDs is the hash of the swarm's committed request ids
// (lib_memo.lua).
func (k swarmKeys) requestIDs() string { return k.base + protocol.KeyRequestIDs }
