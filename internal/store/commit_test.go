package store

import (
	"slices"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/redis/rueidis"
)

// offlineClient is a rueidis.Client that only says its mode: enough for New
// and for building a commit's KEYS and ARGV, which send nothing. Any other
// call panics (the embedded nil interface).
type offlineClient struct {
	rueidis.Client
	mode rueidis.ClientMode
}

func (c offlineClient) Mode() rueidis.ClientMode { return c.mode }

// offlineStore is a Store with key prefix "p" over no Redis: standalone
// (commits stamp P:state:fencing:current) unless cluster.
func offlineStore(t testing.TB, cluster bool) *Store {
	t.Helper()
	mode := rueidis.ClientModeStandalone
	if cluster {
		mode = rueidis.ClientModeCluster
	}
	s, err := New(offlineClient{mode: mode}, "p")
	if err != nil {
		t.Fatalf("New(offline, p): %v", err)
	}
	return s
}

// TestOnlyExecutionsWritesSendByNameKeys: a batch that puts or deletes no
// execution runs the plain commit and sends neither the by-name key nor
// the executions key; a check of executions sends the executions key
// alone; a put or delete in executions runs the by-name variant and sends
// both (the script derives the index's key from by-name's, so it is never
// sent).
func TestOnlyExecutionsWritesSendByNameKeys(t *testing.T) {
	s := offlineStore(t, false)
	const slug = "keys"
	k := s.keys(slug)
	for _, c := range []struct {
		name   string
		write  batch.Write
		script *script
		want   []string
	}{
		{"claims put", batch.Write{Kind: batch.KindPut, Section: "claims", Key: "c", Value: `1`}, commitScript, nil},
		{"executions check", batch.Write{Kind: batch.KindCheck, Section: "executions", Key: "e"}, commitScript, []string{"executions"}},
		{"executions put", batch.Write{Kind: batch.KindPut, Section: "executions", Key: "e", Value: `{"name":"a"}`}, commitByNameScript, []string{"executions", "by-name"}},
		{"executions delete", batch.Write{Kind: batch.KindDelete, Section: "executions", Key: "e", Expected: 1}, commitByNameScript, []string{"executions", "by-name"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc, keys, _ := s.commitArgs(k, &batch.Batch{Slug: slug, Writes: []batch.Write{c.write}})
			var got []string
			for _, key := range keys {
				for _, n := range []string{"executions", "by-name", "by-name-index"} {
					if key == k.section(n) {
						got = append(got, n)
					}
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("commitArgs(%s): KEYS %q hold %q, want %q", c.name, keys, got, c.want)
			}
			if sc != c.script {
				t.Errorf("commitArgs(%s): script %s (by-name %v), want by-name %v", c.name, sc.name, sc == commitByNameScript, c.script == commitByNameScript)
			}
		})
	}
}
