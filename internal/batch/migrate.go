package batch

// WritersNotUpgraded is why a migration the caller did not confirm is
// refused (field writers_upgraded; `fenced migrate` prints it too): readers
// of the document layout read only the document, so they would stop seeing
// the swarm's changes once it moved onto per-record keys.
const WritersNotUpgraded = "upgrade every live fencing reader and writer before migrating to per record keys"

// CheckMigrate validates a Migrate request: the slug, and writersUpgraded,
// which must be set. It returns a *ValidationError naming every bad field,
// or nil.
func CheckMigrate(slug string, writersUpgraded bool) error {
	var vs violations
	if why := ValidSlug(slug); why != "" {
		vs.add("slug", "%s", why)
	}
	if !writersUpgraded {
		vs.add("writers_upgraded", "%s", WritersNotUpgraded)
	}
	return vs.err()
}
