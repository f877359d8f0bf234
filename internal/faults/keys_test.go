package faults

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
)

// hashTag answers the part of a key Redis Cluster hashes: between the first
// '{' and the first '}' after it, when not empty; else the whole key.
func hashTag(k string) string {
	if i := strings.IndexByte(k, '{'); i >= 0 {
		if j := strings.IndexByte(k[i+1:], '}'); j > 0 {
			return k[i+1 : i+1+j]
		}
	}
	return k
}

// randomText draws n runes from an alphabet of what could break a key
// layout: braces, colons, glob characters, spaces, control characters,
// multi-byte runes.
func randomText(rng *rand.Rand, n int) string {
	const alphabet = "ab{}:*?[]\\ \n\t\x00\"'/.-_é日🙂"
	runes := []rune(alphabet)
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteRune(runes[rng.IntN(len(runes))])
	}
	return b.String()
}

// TestBatchesStayInTheirSwarm sends 400 random batches (random valid slugs;
// keys, owners and request ids full of braces, colons and glob characters;
// every section; some invalid slugs and sections) through fenced, then
// lists every key Redis holds: each carries the hash tag of a valid slug
// that was written, under the swarm's prefix with a known name, or is the
// standalone stamp P:state:fencing:current. No input reached a key outside
// its swarm.
func TestBatchesStayInTheirSwarm(t *testing.T) {
	seed := seedFor(t, 3001)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	redis := redistest.Start(t)
	r := startReplica(t, redis.URL(), server.Options{})
	c, _ := dial(t, r.addr)

	const slugChars = "abcXYZ019._-"
	sections := batch.DefaultLimits().Sections
	written := map[string]bool{}
	refused := 0
	for i := 0; i < 400; i++ {
		slug := string(slugChars[rng.IntN(9)]) // starts with a letter or digit
		for j := rng.IntN(12); j > 0; j-- {
			slug += string(slugChars[rng.IntN(len(slugChars))])
		}
		valid := true
		if rng.IntN(10) == 0 {
			slug = "x{" + slug + "}" // refused: a slug may not hold braces
			valid = false
		}
		var writes []client.Write
		for j := 0; j < 1+rng.IntN(4); j++ {
			section := sections[rng.IntN(len(sections))]
			if rng.IntN(20) == 0 {
				section = "meta"
			}
			k := randomText(rng, 1+rng.IntN(20))
			if !utf8.ValidString(k) {
				t.Fatalf("randomText made invalid UTF-8 %q", k)
			}
			writes = append(writes, client.Write{Kind: client.Put, Section: section, Key: fmt.Sprintf("%d:%s", j, k), Expected: client.Blind,
				Value: []byte(fmt.Sprintf(`{"i":%d}`, i))})
		}
		if rng.IntN(10) == 0 {
			writes[0].Section = "by-name" // refused: derived
			valid = false
		}
		var opts []client.BatchOption
		if rng.IntN(2) == 0 {
			id := []byte(randomText(rng, 1+rng.IntN(10)))
			for j := range id { // printable ASCII
				if id[j] < 0x21 || id[j] > 0x7e {
					id[j] = '{'
				}
			}
			opts = append(opts, client.WithRequestID(string(id)))
		}
		fence := client.Unfenced
		if rng.IntN(4) == 0 {
			fence = &client.Fence{Owner: randomText(rng, 5), Epoch: 1 + rng.Int64N(3)}
		}
		_, err := c.Batch(ctxT(t), slug, fence, writes, opts...)
		switch {
		case !valid:
			if !errors.Is(err, client.ErrInvalidArgument) {
				t.Errorf("batch %d on %q: %v, want INVALID_ARGUMENT", i, slug, err)
			}
			refused++
		case err == nil:
			written[slug] = true
		case errors.Is(err, client.ErrLeaseStale), errors.Is(err, client.ErrInvalidArgument) && opts != nil:
			// no lease on the swarm; or a request id reused for another batch
		default:
			t.Errorf("batch %d on %q: %v", i, slug, err)
		}
		if valid && rng.IntN(8) == 0 {
			if _, _, err := c.Acquire(ctxT(t), slug, "own{"+randomText(rng, 4)+"}", time.Minute); err == nil {
				written[slug] = true
			} else if !errors.Is(err, client.ErrLeaseHeld) {
				t.Errorf("Acquire on %q: %v", slug, err)
			}
		}
	}

	names := map[string]bool{"meta": true, "revision": true, "log": true, "by-name": true, "by-name-index": true, "section-revisions": true}
	for _, s := range sections {
		names[s] = true
	}
	stamp := prefix + ":swarm:state:fencing:current"
	keys := redis.DoArray(t, "KEYS", "*")
	for _, k := range keys {
		if k == stamp {
			continue
		}
		slug := hashTag(k)
		rest, ok := strings.CutPrefix(k, prefix+":swarm:{"+slug+"}:fence:")
		if !ok || !written[slug] {
			t.Errorf("key %q is not a key of a swarm that was written", k)
			continue
		}
		if !names[rest] && rest != "request-ids" && !strings.HasPrefix(rest, "request:") {
			t.Errorf("key %q: %q is not a name of a swarm's keys", k, rest)
		}
	}
	t.Logf("%d keys of %d swarms after 400 random batches (%d refused as invalid)", len(keys), len(written), refused)
}
