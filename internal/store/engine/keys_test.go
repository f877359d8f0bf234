package engine

import (
	"testing"

	"github.com/agentihooks/fenced/internal/protocol"
)

// TestSwarmKeysAreTheConcatenations: the keys cut from one string are the
// keys of docs/design/02-redis-layout.md §2.1, for slugs of any length.
func TestSwarmKeysAreTheConcatenations(t *testing.T) {
	e := &Engine{prefix: "P:swarm", currentKey: "P:swarm:" + protocol.CurrentKey}
	for _, slug := range []string{"", "a", "swarm-1", "a:{b}\x00c-long-slug-with-more-bytes-than-the-names"} {
		k := e.Keys(slug)
		base := "P:swarm:{" + slug + protocol.FenceInfix
		for _, c := range []struct{ got, want string }{
			{k.base, base},
			{k.Meta(), base + protocol.KeyMeta},
			{k.Revision(), base + protocol.KeyRevision},
			{k.Log(), base + protocol.KeyLog},
			{k.Section("intents"), base + "intents"},
			{k.Current, "P:swarm:" + protocol.CurrentKey},
		} {
			if c.got != c.want {
				t.Errorf("slug %q: key %q, want %q", slug, c.got, c.want)
			}
		}
	}
}
