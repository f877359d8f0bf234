package store

// WithAfterDocumentPlan calls f with the slug after every document write or
// migration was planned and before it is sent to Redis: tests use it to
// change Redis in between, deterministically.
func WithAfterDocumentPlan(f func(slug string)) Option {
	return func(s *Store) { s.afterPlan = f }
}

// WithAfterSnapshotStep calls f after each step of a chunked snapshot was
// answered and before the next is sent (attempt and step from 1): tests
// use it to commit between steps, deterministically.
func WithAfterSnapshotStep(f func(slug string, attempt, step int)) Option {
	return func(s *Store) { s.afterSnapshotStep = f }
}
