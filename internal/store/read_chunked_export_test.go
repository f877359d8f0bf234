package store

// WithAfterSnapshotCheck calls f with the slug after each round trip of the
// MEMORY USAGE checks before a Sections read was answered: benchmarks use
// it to tell the round trips apart in SLOWLOG.
func WithAfterSnapshotCheck(f func(slug string)) Option {
	return func(s *Store) { s.afterSnapshotCheck = f }
}
