package engine

import (
	"fmt"
	"sync"

	"github.com/agentihooks/fenced/internal/batch"
)

// Defaults of Options.MaxReplicaWaits and MaxReplicaWaitsPerSwarm. rueidis runs a pipeline holding WAIT
// on a dedicated connection from its blocking pool (BlockingPoolSize,
// default 1024; a caller over it blocks until one frees up, however long
// the waits last). The process bound stays well below it so that waits
// never queue there, and the swarm bound keeps one swarm from taking every
// slot of the process.
const (
	DefaultMaxReplicaWaits         = 512
	DefaultMaxReplicaWaitsPerSwarm = 64
)

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

// newWaitSlots bounds waits to perProcess and perSwarm (the defaults when
// below 1).
func newWaitSlots(perProcess, perSwarm int) *waitSlots {
	if perProcess < 1 {
		perProcess = DefaultMaxReplicaWaits
	}
	if perSwarm < 1 {
		perSwarm = DefaultMaxReplicaWaitsPerSwarm
	}
	return &waitSlots{max: perProcess, perSwarm: perSwarm, bySwarm: map[string]int{}}
}

// WaitSlot takes one of the replica wait slots (Options.MaxReplicaWaits)
// for a wait of d on slug, before the call that waits is sent: a wait
// longer than the server's own (Options.Wait) is a caller's choice and
// takes a long one. release gives it back. Errors: ErrReplicaWaitsExhausted
// (wrapped, naming the bound).
func (e *Engine) WaitSlot(slug string, d batch.Durability) (release func(), err error) {
	return e.waits.acquire(slug, d.Duration() > e.opts.Wait.Duration())
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
