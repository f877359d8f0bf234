package batch

import (
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/agentihooks/fenced/internal/protocol"
)

// Defaults for Limits (docs/design/03-fenced-batch.md §3.1).
const (
	DefaultMaxWrites          = 1024
	DefaultMaxValueBytes      = 1 << 20 // 1 MiB
	DefaultMaxBatchValueBytes = 8 << 20 // 8 MiB
	// DefaultMaxChecks bounds the record checks (KindCheckRecords pairs) of
	// one batch: as many as a Sections read answers (the server's default
	// --max-snapshot-records), so a section read whole (the fixture's
	// largest, executions, holds 1,352) is checked in one batch; each pair
	// costs Redis a read of its record (65,536 pairs ran ~400 ms).
	DefaultMaxChecks = 20000
	// MaxSlugLen is the longest slug in characters (= bytes: slugs are ASCII).
	MaxSlugLen = 128
	// MaxKeyBytes is the longest record key, in bytes.
	MaxKeyBytes = 1024
	// MaxOwnerBytes is the longest lease owner a fence may name, in bytes.
	MaxOwnerBytes = 1024
	// MaxSafeInteger (2^53 - 1) bounds revisions, epochs and times: Redis's
	// Lua holds numbers as doubles, exact only up to it.
	MaxSafeInteger = protocol.RevMax
)

// DefaultSections are the sections of a swarm besides MetaSection (docs/design/01-vocabulary.md §1).
var DefaultSections = []string{
	"executions", "archive", "intents", "orphans", "grants",
	"registrations", "claims", "journals", "fences", "operations",
}

// LeaseOwnedKeys are the meta records that only fenced itself writes (the
// lease service, the layout, the section revisions); a client batch may
// check them but never put or delete them.
var LeaseOwnedKeys = protocol.MetaFields

// MaxRequestIDLen is the longest request id, in characters (printable ASCII).
const MaxRequestIDLen = 128

// reservedNames cannot be configured as sections: they name the swarm's other
// keys (docs/design/02-redis-layout.md §2.1), so a section of that name would overwrite them.
var reservedNames = []string{MetaSection, protocol.KeyByName, protocol.KeyByNameIndex, protocol.KeyRevision, protocol.KeyLog, protocol.KeyRequestIDs, protocol.KeyClaims, protocol.KeyClaimExpiry, protocol.KeyClaimSweep, protocol.KeySectionRevisions}

// Limits are the names and bounds a request must keep. The zero value is not
// usable; start from DefaultLimits.
type Limits struct {
	// Sections are the configured section names, MetaSection excluded.
	Sections []string
	// MaxWrites is the most writes one batch may carry.
	MaxWrites int
	// MaxValueBytes is the largest value one put may carry, in bytes.
	MaxValueBytes int
	// MaxBatchValueBytes is the most value bytes one batch may carry in all:
	// its puts' values and the keys of its record checks.
	MaxBatchValueBytes int
	// MaxChecks is the most record checks (the pairs of its KindCheckRecords
	// writes, in all) one batch may carry.
	MaxChecks int
	// RequireFence names the sections a batch may put or delete in only
	// when it is fenced (a lease fence, or a claim fence): a configured
	// section name, MetaSection, or "*" for every one. Empty: none (an
	// unfenced batch commits on revisions alone). CheckFencedBatch refuses
	// an unfenced batch writing one (*FenceRequiredError).
	RequireFence []string
}

// AllSections is the RequireFence entry that names every section.
const AllSections = "*"

// DefaultLimits returns the default sections and limits.
func DefaultLimits() Limits {
	return Limits{
		Sections:           slices.Clone(DefaultSections),
		MaxWrites:          DefaultMaxWrites,
		MaxValueBytes:      DefaultMaxValueBytes,
		MaxBatchValueBytes: DefaultMaxBatchValueBytes,
		MaxChecks:          DefaultMaxChecks,
	}
}

// Check reports whether the limits themselves are usable: positive bounds and
// section names of [a-z0-9_-] that are unique and not reserved.
func (l Limits) Check() error {
	var vs violations
	if l.MaxWrites < 1 {
		vs.add("max_writes", "must be at least 1, got %d", l.MaxWrites)
	}
	if l.MaxValueBytes < 1 {
		vs.add("max_value_bytes", "must be at least 1, got %d", l.MaxValueBytes)
	}
	if l.MaxChecks < 1 {
		vs.add("max_checks", "must be at least 1, got %d", l.MaxChecks)
	}
	for _, name := range l.RequireFence {
		if name != AllSections && name != MetaSection && !slices.Contains(l.Sections, name) {
			vs.add("require_fence", "%q is not a configured section, meta or %q", name, AllSections)
		}
	}
	if l.MaxBatchValueBytes < l.MaxValueBytes {
		vs.add("max_batch_value_bytes", "must be at least max_value_bytes (%d), got %d", l.MaxValueBytes, l.MaxBatchValueBytes)
	}
	if len(l.Sections) == 0 {
		vs.add("sections", "at least one section is required")
	}
	for i, s := range l.Sections {
		field := fmt.Sprintf("sections[%d]", i)
		switch {
		case !isSectionName(s):
			vs.add(field, "%q must be 1-64 characters of [a-z0-9_-]", s)
		case slices.Contains(reservedNames, s):
			vs.add(field, "%q is reserved for the swarm's own keys", s)
		case slices.Index(l.Sections, s) != i:
			vs.add(field, "%q is named twice", s)
		}
	}
	return vs.err()
}

func isSectionName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ValidSlug reports why slug is not a valid swarm slug (1-128 characters of
// [A-Za-z0-9._-], starting with a letter or digit), or "" when it is. A valid
// slug holds no brace, so it can never break out of its hash tag.
func ValidSlug(slug string) string {
	if slug == "" {
		return "required"
	}
	if len(slug) > MaxSlugLen {
		return fmt.Sprintf("at most %d characters, got %d", MaxSlugLen, len(slug))
	}
	for i := 0; i < len(slug); i++ {
		c := slug[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if i == 0 && !alnum {
			return "must start with a letter or digit"
		}
		if !alnum && c != '.' && c != '_' && c != '-' {
			// Quote the whole character, not its first byte: %q of a byte
			// would show the lead byte of "é" as 'Ã'.
			_, size := utf8.DecodeRuneInString(slug[i:])
			return fmt.Sprintf("character %q at byte %d is not one of [A-Za-z0-9._-]", slug[i:i+size], i)
		}
	}
	return ""
}

// clip shortens what a caller sent before it is quoted back in an error,
// so that errors stay small (they travel in trailers, which common clients
// cap at 8-16 KiB).
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// validRequestID reports why id is not a valid request id (empty is valid:
// no id), or "".
func validRequestID(id string) string {
	if len(id) > MaxRequestIDLen {
		return fmt.Sprintf("at most %d characters, got %d", MaxRequestIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return fmt.Sprintf("byte %d (%q) is not printable ASCII", i, id[i])
		}
	}
	return ""
}

// validKey reports why key is not a valid record key, or "".
func validKey(key string) string {
	switch {
	case key == "":
		return "required"
	case len(key) > MaxKeyBytes:
		return fmt.Sprintf("at most %d bytes, got %d", MaxKeyBytes, len(key))
	case !utf8.ValidString(key):
		return "not valid UTF-8"
	}
	return ""
}

// HasSection reports whether name is a configured section or MetaSection.
func (l Limits) HasSection(name string) bool {
	return name == MetaSection || slices.Contains(l.Sections, name)
}

func (l Limits) validSection(name string) string {
	switch {
	case name == "":
		return "required"
	case name == protocol.KeyByName:
		return `"by-name" is derived from executions and cannot be named`
	case !l.HasSection(name):
		if !utf8.ValidString(name) {
			return "not valid UTF-8"
		}
		return fmt.Sprintf("%q is not a section; sections are meta, %v", clip(name), l.Sections)
	}
	return ""
}

// CheckSlug validates a slug alone (reads).
func CheckSlug(slug string) error {
	var vs violations
	if why := ValidSlug(slug); why != "" {
		vs.add("slug", "%s", why)
	}
	return vs.err()
}

// CheckRecordRef validates the (slug, section, key) of a one-record read.
func (l Limits) CheckRecordRef(slug, section, key string) error {
	var vs violations
	if why := ValidSlug(slug); why != "" {
		vs.add("slug", "%s", why)
	}
	if why := l.validSection(section); why != "" {
		vs.add("section", "%s", why)
	}
	if why := validKey(key); why != "" {
		vs.add("key", "%s", why)
	}
	return vs.err()
}

// checkSectionRef checks the (slug, section) of a one-section read.
func (l Limits) checkSectionRef(vs *violations, slug, section string) {
	if why := ValidSlug(slug); why != "" {
		vs.add("slug", "%s", why)
	}
	if why := l.validSection(section); why != "" {
		vs.add("section", "%s", why)
	}
}

// CheckSections validates the slug and section names of a Sections read and
// returns the names to read: the given ones, or every section but "archive"
// (and MetaSection) when names is empty.
func (l Limits) CheckSections(slug string, names []string) ([]string, error) {
	var vs violations
	if why := ValidSlug(slug); why != "" {
		vs.add("slug", "%s", why)
	}
	for i, n := range names {
		field := fmt.Sprintf("names[%d]", i)
		if why := l.validSection(n); why != "" {
			vs.add(field, "%s", why)
		} else if slices.Index(names, n) != i {
			vs.add(field, "%q is named twice", clip(n))
		}
	}
	if err := vs.err(); err != nil {
		return nil, err
	}
	if len(names) > 0 {
		return names, nil
	}
	all := make([]string, 0, len(l.Sections)+1)
	for _, s := range l.Sections {
		if s != "archive" {
			all = append(all, s)
		}
	}
	return append(all, MetaSection), nil
}

// CheckBatch validates a batch against the limits: cheap checks first
// (slug, counts of writes and record checks, sizes, fence), then each
// write's names and kind (and each record check's key and revision), then
// the costly ones (JSON of each value, duplicate records). It returns a
// *ValidationError listing every violation, or nil. A valid batch needs no
// further checking before it reaches Redis.
func (l Limits) CheckBatch(b *Batch) error {
	var vs violations
	if why := ValidSlug(b.Slug); why != "" {
		vs.add("slug", "%s", why)
	}
	if why := validRequestID(b.RequestID); why != "" {
		vs.add("request_id", "%s", why)
	}
	switch n := len(b.Writes); {
	case n == 0:
		vs.add("writes", "at least one write is required")
	case n > l.MaxWrites:
		vs.add("writes", "at most %d writes per batch, got %d", l.MaxWrites, n)
		return vs.err() // do not walk an oversized batch
	}
	checks, over := 0, -1
	for i := range b.Writes {
		// A count check's records count as record checks: the script
		// reads every one of them (a count out of range is checkWrite's).
		n := len(b.Writes[i].Checks)
		if c := b.Writes[i].Count; b.Writes[i].Kind == KindCheckCount && c > 0 && c <= int64(l.MaxChecks) {
			n = int(c)
		}
		if checks += n; checks > l.MaxChecks && over < 0 {
			over = i
		}
	}
	if over >= 0 {
		field := fmt.Sprintf("writes[%d].checks", over)
		if b.Writes[over].Kind == KindCheckCount {
			field = fmt.Sprintf("writes[%d].count", over)
		}
		vs.add(field, "at most %d record checks per batch (--max-checks; a count check counts its records), got %d", l.MaxChecks, checks)
		return vs.err() // do not walk an oversized batch
	}
	total := 0
	for i := range b.Writes {
		w := &b.Writes[i]
		total += len(w.Value)
		for j := range w.Checks {
			total += len(w.Checks[j].Key)
		}
	}
	if total > l.MaxBatchValueBytes {
		if checks > 0 {
			vs.add("writes", "at most %d value bytes per batch (put values and record check keys), got %d", l.MaxBatchValueBytes, total)
		} else {
			vs.add("writes", "at most %d value bytes per batch, got %d", l.MaxBatchValueBytes, total)
		}
		return vs.err()
	}
	if f := b.Fence; f != nil {
		if f.Epoch < 1 || f.Epoch > MaxSafeInteger {
			vs.add("fence.epoch", "must be 1 to 2^53-1 (the fencing token of a granted lease), got %d", f.Epoch)
		}
		if f.NowMs < 0 || f.NowMs > MaxSafeInteger {
			vs.add("fence.now_ms", "must be 0 (unknown) or ms since the Unix epoch, got %d", f.NowMs)
		}
		if len(f.Owner) > MaxOwnerBytes {
			vs.add("fence.owner", "at most %d bytes, got %d", MaxOwnerBytes, len(f.Owner))
		} else if !utf8.ValidString(f.Owner) {
			vs.add("fence.owner", "not valid UTF-8")
		}
	}
	if c := b.Claim; c != nil {
		checkClaimFence(&vs, c)
	}
	for i := range b.Writes {
		if vs.full() {
			break
		}
		l.checkWrite(&vs, i, &b.Writes[i])
		if b.Writes[i].Bound {
			checkBound(&vs, i, &b.Writes[i], b.Claim != nil)
		}
	}
	if len(vs) == 0 {
		checkDuplicates(&vs, b.Writes)
	}
	return vs.err()
}

func (l Limits) checkWrite(vs *violations, i int, w *Write) {
	field := func(name string) string { return fmt.Sprintf("writes[%d].%s", i, name) }
	switch w.Kind {
	case KindPut, KindDelete, KindCheck, KindCheckSection, KindCheckRecords, KindCheckCount:
	default:
		vs.add(field("kind"), "must be WRITE_KIND_PUT, WRITE_KIND_DELETE, WRITE_KIND_CHECK, WRITE_KIND_CHECK_SECTION, WRITE_KIND_CHECK_RECORDS or WRITE_KIND_CHECK_COUNT, got %s", w.Kind)
	}
	sectionOK := false
	if why := l.validSection(w.Section); why != "" {
		vs.add(field("section"), "%s", why)
	} else {
		sectionOK = true
	}
	if w.Kind == KindCheckSection || w.Kind == KindCheckRecords || w.Kind == KindCheckCount {
		if w.Key != "" {
			vs.add(field("key"), "must be empty for a %s (a records check names its keys in checks)", w.Kind)
		}
	} else if why := validKey(w.Key); why != "" {
		vs.add(field("key"), "%s", why)
	} else if sectionOK && w.Section == MetaSection && w.Kind != KindCheck && slices.Contains(LeaseOwnedKeys, w.Key) {
		vs.add(field("key"), "meta record %q is owned by the lease service and can only be checked", w.Key)
	}
	switch {
	case w.Expected < Blind || w.Expected > MaxSafeInteger:
		vs.add(field("expected"), "must be a revision 1 to 2^53-1, 0 (must be absent) or -1 (BLIND), got %d", w.Expected)
	case w.Expected == Blind && w.Kind == KindCheck:
		vs.add(field("expected"), "a check cannot be BLIND (-1): name the revision read, or 0 for absent")
	case w.Expected == Blind && w.Kind == KindCheckSection:
		vs.add(field("expected"), "a section check cannot be BLIND (-1): name the section revision read (0: never written)")
	case w.Expected != 0 && w.Kind == KindCheckRecords:
		vs.add(field("expected"), "must be 0 for a records check (each of checks names its own revision), got %d", w.Expected)
	case w.Expected < 1 && w.Kind == KindCheckCount:
		vs.add(field("expected"), "must be the swarm revision the section was read at, 1 to 2^53-1, for a count check, got %d", w.Expected)
	}
	if w.Kind == KindCheckCount {
		switch c := w.Count; {
		case c < 1:
			vs.add(field("count"), "must be how many records the section held when read, at least 1 (a section read empty needs no check), got %d", c)
		case c > int64(l.MaxChecks):
			vs.add(field("count"), "at most %d records (--max-checks), got %d", l.MaxChecks, c)
		}
		if s := w.RevisionSum; s < 0 || s >= RevisionSumModulus {
			vs.add(field("revision_sum"), "must be the sum of the records' revisions modulo 10^14, 0 to 10^14-1, got %d", s)
		}
	} else {
		if w.Count != 0 {
			vs.add(field("count"), "must be 0 for a %s (only WRITE_KIND_CHECK_COUNT carries a count)", w.Kind)
		}
		if w.RevisionSum != 0 {
			vs.add(field("revision_sum"), "must be 0 for a %s (only WRITE_KIND_CHECK_COUNT carries a revision sum)", w.Kind)
		}
	}
	if w.Kind == KindCheckRecords {
		checkRecordChecks(vs, i, w)
	} else if len(w.Checks) > 0 {
		vs.add(field("checks"), "must be empty for a %s (only WRITE_KIND_CHECK_RECORDS carries checks)", w.Kind)
	}
	switch w.Kind {
	case KindPut:
		switch {
		case len(w.Value) > l.MaxValueBytes:
			vs.add(field("value"), "at most %d bytes, got %d", l.MaxValueBytes, len(w.Value))
		case !utf8.ValidString(w.Value) || !ValidJSON(w.Value):
			vs.add(field("value"), "not one JSON text (RFC 8259, or NaN, Infinity, -Infinity where a value stands): %s", JSONProblem(w.Value))
		case tooDeep(w.Value, MaxValueDepth) >= 0:
			vs.add(field("value"), "nests deeper than %d arrays and objects (byte %d): the stored record {\"r\":N,\"v\":VALUE} nests it once more, and a record may nest at most %d", MaxValueDepth, tooDeep(w.Value, MaxValueDepth), MaxScriptJSONDepth)
		case w.Section == "executions":
			// by-name indexes executions values as the script decodes them:
			// one the script cannot decode would be left out of it.
			if why := ScriptUndecodable(w.Value); why != "" {
				vs.add(field("value"), "%s; an executions value must decode in the script to be indexed by name", why)
			}
		}
	case KindDelete, KindCheck, KindCheckSection, KindCheckRecords, KindCheckCount:
		if w.Value != "" {
			vs.add(field("value"), "must be empty for a %s", w.Kind)
		}
	}
}

// checkBound adds the violation of a bound write (writes[i].bind_to_claim,
// docs/design/12-claims.md §12.4): only a put binds, to the batch's claim
// fence (claimed: the batch has one), and not in meta (the swarm's own
// records) or executions (indexed by name, which does not follow a claim).
func checkBound(vs *violations, i int, w *Write, claimed bool) {
	field := fmt.Sprintf("writes[%d].bind_to_claim", i)
	switch {
	case w.Kind != KindPut:
		vs.add(field, "only a put binds its record to a claim, got a %s", w.Kind)
	case !claimed:
		vs.add(field, "binds the record to the batch's claim fence, and the batch has none: set claim")
	case w.Section == MetaSection || w.Section == "executions":
		vs.add(field, "records of %s cannot be bound to a claim", w.Section)
	}
}

// checkRecordChecks checks the pairs of a KindCheckRecords write: at least
// one, each a valid key (any meta record may be checked, lease-owned ones
// included) and a revision 0 to 2^53-1. Repeated keys are
// checkDuplicates'.
func checkRecordChecks(vs *violations, i int, w *Write) {
	if len(w.Checks) == 0 {
		vs.add(fmt.Sprintf("writes[%d].checks", i), "a records check names at least one record (a section read whole and found empty needs no check)")
		return
	}
	for j := range w.Checks {
		if vs.full() {
			return
		}
		c := &w.Checks[j]
		if why := validKey(c.Key); why != "" {
			vs.add(fmt.Sprintf("writes[%d].checks[%d].key", i, j), "%s", why)
		}
		switch {
		case c.Expected == Blind:
			vs.add(fmt.Sprintf("writes[%d].checks[%d].expected", i, j), "a record check cannot be BLIND (-1): name the revision read, or 0 for absent")
		case c.Expected < Blind || c.Expected > MaxSafeInteger:
			vs.add(fmt.Sprintf("writes[%d].checks[%d].expected", i, j), "must be a revision 1 to 2^53-1 or 0 (must be absent), got %d", c.Expected)
		}
	}
}

// checkDuplicates refuses a (section, key) named twice in the batch: by two
// writes, by a write and a records check's pair, or by two pairs; and a
// section checked twice by WRITE_KIND_CHECK_SECTION or WRITE_KIND_CHECK_COUNT
// (either kind, each keyed by the section alone). Pairs are walked after
// every other write, so that a record named by both is reported at the
// pair.
func checkDuplicates(vs *violations, ws []Write) {
	type ref struct{ section, key string }
	type at struct{ write, check int } // check -1: the write itself
	name := func(a at) string {
		if a.check < 0 {
			return fmt.Sprintf("writes[%d]", a.write)
		}
		return fmt.Sprintf("writes[%d].checks[%d]", a.write, a.check)
	}
	n := len(ws)
	for i := range ws {
		n += len(ws[i].Checks)
	}
	seen := make(map[ref]at, n)
	for i := range ws {
		if ws[i].Kind == KindCheckRecords {
			continue
		}
		r := ref{ws[i].Section, ws[i].Key}
		if by, ok := seen[r]; ok {
			if r.key == "" {
				vs.add(fmt.Sprintf("writes[%d].section", i), "section %s is already checked by %s; a batch checks each section once", r.section, name(by))
			} else {
				vs.add(fmt.Sprintf("writes[%d].key", i), "record %s/%s is already written by %s; a batch names each record once", r.section, clip(r.key), name(by))
			}
			continue
		}
		seen[r] = at{i, -1}
	}
	for i := range ws {
		if ws[i].Kind != KindCheckRecords {
			continue
		}
		for j := range ws[i].Checks {
			if vs.full() {
				return
			}
			r := ref{ws[i].Section, ws[i].Checks[j].Key}
			if by, ok := seen[r]; ok {
				vs.add(fmt.Sprintf("writes[%d].checks[%d].key", i, j), "record %s/%s is already named by %s; a batch names each record once", r.section, clip(r.key), name(by))
				continue
			}
			seen[r] = at{i, j}
		}
	}
}

// CheckWatch validates a Watch request: the slug, start_revision (0 = from
// now, else 1 to 2^53-1) and the section names to filter by (as
// CheckSections; none = every section, not only the ones Sections reads
// by default). It returns the names, nil for all.
func (l Limits) CheckWatch(slug string, start int64, sections []string) ([]string, error) {
	var vs violations
	if why := ValidSlug(slug); why != "" {
		vs.add("slug", "%s", why)
	}
	if start < 0 || start > MaxSafeInteger {
		vs.add("start_revision", "must be a revision 1 to 2^53-1, or 0 (from now), got %d", start)
	}
	for i, n := range sections {
		field := fmt.Sprintf("sections[%d]", i)
		if why := l.validSection(n); why != "" {
			vs.add(field, "%s", why)
		} else if slices.Index(sections, n) != i {
			vs.add(field, "%q is named twice", clip(n))
		}
	}
	if err := vs.err(); err != nil {
		return nil, err
	}
	if len(sections) == 0 {
		return nil, nil
	}
	return sections, nil
}

// checkClaimFence adds the violations of a batch's claim fence: claim.name
// (ValidClaimName), claim.owner (required, as a lease owner),
// claim.epoch (1 to 2^53-1) and claim.now_ms (as fence.now_ms).
func checkClaimFence(vs *violations, c *ClaimFence) {
	if why := ValidClaimName(c.Name); why != "" {
		vs.add("claim.name", "%s", why)
	}
	switch {
	case c.Owner == "":
		vs.add("claim.owner", "required (the owner the claim was granted to)")
	case len(c.Owner) > MaxOwnerBytes:
		vs.add("claim.owner", "at most %d bytes, got %d", MaxOwnerBytes, len(c.Owner))
	case !utf8.ValidString(c.Owner):
		vs.add("claim.owner", "not valid UTF-8")
	}
	if c.Epoch < 1 || c.Epoch > MaxSafeInteger {
		vs.add("claim.epoch", "must be 1 to 2^53-1 (the fencing token of the claim's grant), got %d", c.Epoch)
	}
	if c.NowMs < 0 || c.NowMs > MaxSafeInteger {
		vs.add("claim.now_ms", "must be 0 (unknown) or ms since the Unix epoch, got %d", c.NowMs)
	}
}
