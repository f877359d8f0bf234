package store

// WithAfterDocumentPlan calls f with the slug after every document write or
// migration was planned and before it is sent to Redis: tests use it to
// change Redis in between, deterministically.
func WithAfterDocumentPlan(f func(slug string)) Option {
	return func(s *Store) { s.afterPlan = f }
}
