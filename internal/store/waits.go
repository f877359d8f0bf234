package store

import (
	"fmt"
	"sync"
)

// Defaults of WithReplicaWaitLimits. rueidis runs a pipeline holding WAIT
// on a dedicated connection from its blocking pool (BlockingPoolSize,
// default 1024; a caller over it blocks until one frees up, however long
// the waits last). The process bound stays well below it so that waits
// never queue there, and the swarm bound keeps one swarm from taking every
// slot of the process.
const (
	DefaultMaxReplicaWaits         = 512
	DefaultMaxReplicaWaitsPerSwarm = 64
)

// WithReplicaWaitLimits bounds the commits and lease changes waiting for
// replica acknowledgements at once: perProcess over every swarm, perSwarm
// for one slug (defaults DefaultMaxReplicaWaits and
// DefaultMaxReplicaWaitsPerSwarm; values below 1 keep the default). One
// more is refused with ErrReplicaWaitsExhausted before it is sent. Keep
// perProcess below the Redis client's blocking pool (rueidis
// BlockingPoolSize, 1024 unless the URL sets it).
func WithReplicaWaitLimits(perProcess, perSwarm int) Option {
	return func(s *Store) {
		if perProcess >= 1 {
			s.waits.max = perProcess
		}
		if perSwarm >= 1 {
			s.waits.perSwarm = perSwarm
		}
	}
}

// ReplicaWaitReserve is how many waits of the server's own length (see
// waitSlots.acquire) are admitted beyond perProcess: a quarter of it, at
// least 1. Waits a caller asked to be longer (replica_ack) never use them,
// so that callers flooding long waits over many swarms cannot refuse every
// other swarm's commits and lease changes under --wait-replicas.
func ReplicaWaitReserve(perProcess int) int { return max(1, perProcess/4) }

// waitSlots counts the replica waits in flight, in all and per swarm, and
// those longer than the server's own.
type waitSlots struct {
	max, perSwarm int

	mu       sync.Mutex
	open     int
	openLong int
	bySwarm  map[string]int
}

func newWaitSlots() *waitSlots {
	return &waitSlots{max: DefaultMaxReplicaWaits, perSwarm: DefaultMaxReplicaWaitsPerSwarm, bySwarm: map[string]int{}}
}

// acquire takes a slot for a wait on slug, or answers
// ErrReplicaWaitsExhausted (wrapped, naming the bound). long: the wait may
// last longer than the server's own (a caller's replica_ack); long waits
// take at most max slots, waits of the server's own length also the
// ReplicaWaitReserve(max) beyond them. release gives the slot back.
func (w *waitSlots) acquire(slug string, long bool) (release func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case long && w.openLong >= w.max:
		return nil, fmt.Errorf("%w: %d longer than the server's own in this fenced process, its limit", ErrReplicaWaitsExhausted, w.openLong)
	case w.open >= w.max+ReplicaWaitReserve(w.max):
		return nil, fmt.Errorf("%w: %d in this fenced process, its limit", ErrReplicaWaitsExhausted, w.open)
	case w.bySwarm[slug] >= w.perSwarm:
		return nil, fmt.Errorf("%w: %d for swarm %s, its limit", ErrReplicaWaitsExhausted, w.bySwarm[slug], slug)
	}
	w.open++
	if long {
		w.openLong++
	}
	w.bySwarm[slug]++
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.open--
			if long {
				w.openLong--
			}
			if w.bySwarm[slug]--; w.bySwarm[slug] <= 0 {
				delete(w.bySwarm, slug)
			}
		})
	}, nil
}
