package engine

import (
	"strings"

	"github.com/agentihooks/fenced/internal/protocol"
)

// Keys are the Redis keys of one swarm (docs/design/02-redis-layout.md
// §2.1), as Engine.Keys makes them. Every one but Current and History
// carries the slug as its hash tag, so that one script can touch all of
// them on Redis Cluster.
type Keys struct {
	// Slug is the swarm's.
	Slug string
	base string // "<prefix>:swarm:{<slug>}:fence:"
	// fixed is base+meta, base+revision and base+log back to back: the keys
	// every commit sends, made with base in one allocation (base is its
	// start, each key a slice of it).
	fixed string
	// Current is P:state:fencing:current: the document layout and the
	// standalone stamp. It has no hash tag.
	Current string
}

// fixedNames are the names whose keys Keys.fixed holds, in order.
var fixedNames = [...]string{protocol.KeyMeta, protocol.KeyRevision, protocol.KeyLog}

// Keys are slug's keys.
func (e *Engine) Keys(slug string) Keys {
	n := len(e.prefix) + len(":{") + len(slug) + len(protocol.FenceInfix)
	var b strings.Builder
	b.Grow(len(fixedNames)*n + len(protocol.KeyMeta) + len(protocol.KeyRevision) + len(protocol.KeyLog))
	for _, name := range fixedNames {
		b.WriteString(e.prefix)
		b.WriteString(":{")
		b.WriteString(slug)
		b.WriteString(protocol.FenceInfix)
		b.WriteString(name)
	}
	fixed := b.String()
	return Keys{Slug: slug, base: fixed[:n], fixed: fixed, Current: e.currentKey}
}

// fixedKey is the i-th key of k.fixed (fixedNames[i]).
func (k Keys) fixedKey(i int) string {
	from := 0
	for j := range i {
		from += len(k.base) + len(fixedNames[j])
	}
	return k.fixed[from : from+len(k.base)+len(fixedNames[i])]
}

// Section is the hash of the section name.
func (k Keys) Section(name string) string { return k.base + name }

// Meta is the swarm's meta hash (lease, epoch, layout, section revisions).
func (k Keys) Meta() string { return k.fixedKey(0) }

// Revision is the swarm's revision counter.
func (k Keys) Revision() string { return k.fixedKey(1) }

// Log is the swarm's log stream (one entry per batch).
func (k Keys) Log() string { return k.fixedKey(2) }

// ByName is the hash of each agent name's newest execution.
func (k Keys) ByName() string { return k.base + protocol.KeyByName }

// ByNameIndex is the sorted set that orders each agent name's executions
// by generation (byname.lua).
func (k Keys) ByNameIndex() string { return k.base + protocol.KeyByNameIndex }

// RequestIDs is the hash of the swarm's committed request ids
// (lib_memo.lua).
func (k Keys) RequestIDs() string { return k.base + protocol.KeyRequestIDs }

// SectionRevisions is the swarm's hash of section revisions
// (docs/design/03-fenced-batch.md §3.4).
func (k Keys) SectionRevisions() string { return k.base + protocol.KeySectionRevisions }

// Claims is the hash of the swarm's claim grants (claim-grants).
func (k Keys) Claims() string { return k.base + protocol.KeyClaims }

// ClaimExpiry is the sorted set mirroring each grant's expiry.
func (k Keys) ClaimExpiry() string { return k.base + protocol.KeyClaimExpiry }

// ClaimSweep is the queue of the claims whose bound records are reclaimed.
func (k Keys) ClaimSweep() string { return k.base + protocol.KeyClaimSweep }

// ClaimSet is the set of the records bound to the claim name
// (docs/design/12-claims.md §12.4).
func (k Keys) ClaimSet(name string) string { return k.base + protocol.KeyClaimPrefix + name }

// History is P:state:fencing:history:<slug>, the document layout's list
// of the swarm's former documents (no hash tag).
func (k Keys) History() string {
	return k.Current[:len(k.Current)-len(protocol.CurrentKey)] + protocol.HistoryKeyPrefix + k.Slug
}
