// Package protocol is the one home of every value that fenced's Go code and
// its Lua scripts (internal/store/lua) must agree on: the key layout of a
// swarm, the meta records only fenced writes, the write kinds and mode
// letters of a commit's arguments, the reply tags of every script, the step
// names of the by-name rebuild, the log cap, the largest revision and the
// issue order of revisions (revision.go).
//
// The Go side uses the constants below. The Lua side never spells them: each
// script is prefixed with Prelude, a `local P = {...}` table generated here
// at init (sorted, so a script's text and SHA-1 are deterministic), and the
// scripts say P.REPLY_OK, P.FIELD_LEASE, P.KIND_PATTERN... A test in
// internal/store fails when a script names a P entry that Prelude lacks, or
// spells one of these values as a literal, or when Go code of the store
// decodes a reply tag by its literal.
//
// To add a value: declare the constant, add it to entries (with its Lua
// name), use P.<NAME> in the Lua.
package protocol

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Key layout of one swarm (docs/design/02-redis-layout.md §2.1). Every key of a
// swarm but Current is "<prefix>:swarm:{<slug>}" + FenceInfix + a name:
// a section's name, or one of the Key* names below.
const (
	// FenceInfix separates a key's hash tag from its name; the Lua reads a
	// section's name back out of its key after it (SectionPattern).
	FenceInfix = "}:fence:"
	// KeyMeta is the meta section: a hash of the swarm's own records.
	KeyMeta = "meta"
	// KeyRevision is the swarm's revision counter (a string of decimal
	// digits).
	KeyRevision = "revision"
	// KeyLog is the commit log, a stream trimmed to at least LogCap entries
	// (XADD MAXLEN ~, LogTrim).
	KeyLog = "log"
	// KeyByName is the hash agent name -> executions id, derived from
	// executions.
	KeyByName = "by-name"
	// KeyByNameIndex is the sorted set that orders each agent name's
	// executions by generation. The scripts derive it from the by-name key
	// (same hash tag) instead of receiving it.
	KeyByNameIndex = "by-name-index"
	// KeyRequestIDs is the hash of the swarm's committed request ids:
	// request id -> "<revision>:<digest>:<expires_ms>".
	KeyRequestIDs = "request-ids"
	// KeySectionRevisions is the hash of the swarm's section revisions:
	// section name -> the revision (decimal digits) of the last batch that
	// put or deleted in it, and SectionFloor -> the latest of them. The
	// scripts derive it from the meta key (same hash tag). It replaced the
	// meta record FieldSectionRevisions, which a commit retires.
	KeySectionRevisions = "section-revisions"
	// SectionFloor is the field of KeySectionRevisions that holds the
	// latest section revision: no section's name (sections are [a-z0-9_-]).
	SectionFloor = "*"
	// KeyRequestPrefix starts the key that remembered a committed request
	// id before KeyRequestIDs (KeyRequestPrefix + id = "<revision>:<digest>",
	// with a PX): read and written in legacy mode only (ModeLegacyRequest).
	KeyRequestPrefix = "request:"
	// CurrentKey is the key, after "<prefix>:swarm:", that holds the document
	// layout and the standalone stamp (no hash tag).
	CurrentKey = "state:fencing:current"
	// StampSuffix follows the slug in the CurrentKey field that a standalone
	// commit stamps with its revision.
	StampSuffix = ":records"
	// HistoryKeyPrefix is, after "<prefix>:swarm:", what precedes the slug
	// in the key of a document swarm's history list (the last
	// HistoryCopies whole documents, newest first; no hash tag).
	HistoryKeyPrefix = "state:fencing:history:"
	// HistoryCopies is how many whole documents the history list keeps.
	HistoryCopies = 2
)

// Meta records that only fenced writes (a client batch may check them, never
// put or delete them): MetaFields lists them.
const (
	FieldLease            = "lease"
	FieldEpoch            = "epoch"
	FieldLeaderChanges    = "leader_changes"
	FieldLayout           = "layout"
	FieldSectionRevisions = "section_revisions"
)

// MetaFields are the meta records that only fenced writes.
var MetaFields = []string{FieldLease, FieldEpoch, FieldLeaderChanges, FieldLayout, FieldSectionRevisions}

// Values of the layout record.
const (
	// LayoutRecords: the swarm is stored one record per field.
	LayoutRecords = "records"
	// LayoutDocument: the swarm is still one JSON document.
	LayoutDocument = "document"
)

// Write kinds: the first character of a commit's write argument.
const (
	KindPut          = "p"
	KindDelete       = "d"
	KindCheck        = "c"
	KindCheckSection = "S"
	// KindCheckRecords: one record (pair) of a records check; a write of
	// n pairs is n arguments of this kind.
	KindCheckRecords = "R"
	// KindCheckCount: a count check of a section read whole; its key slot
	// is '<count>:<revision sum>' (decimal), its expected the revision read at.
	KindCheckCount = "C"
	// KindPutBound: a put binding its record to the batch's claim fence
	// (docs/design/12-claims.md §12.4): a put in every other respect.
	KindPutBound = "b"
)

// Mode letters: the first field of a commit's (and the lease script's)
// first argument is made of these.
const (
	// ModeStamp: standalone Redis; stamp CurrentKey (the last key).
	ModeStamp = "s"
	// ModeLayoutChecked: the caller checked the document layout (Cluster,
	// after a ReplyLayoutUnknown).
	ModeLayoutChecked = "l"
	// ModeRequest: the batch carries a request id (its key is the swarm's
	// KeyRequestIDs hash).
	ModeRequest = "r"
	// ModeLegacyRequest, with ModeRequest: also read and write the request
	// id's KeyRequestPrefix key, as fenced did before KeyRequestIDs (a
	// rolling upgrade).
	ModeLegacyRequest = "k"
	// ModeClaim: the batch carries a claim fence (docs/design/12-claims.md
	// §12.3): the commit's second argument is the claim, its key the
	// swarm's KeyClaims hash.
	ModeClaim = "c"
	// FenceClaim: the fifth element of a STALE reply of the commit when the
	// claim fence failed ({STALE, owner, epoch, expires_at, claim}).
	FenceClaim = "claim"
	// ModeNone: none of the above (alone, or replaced by ModeLayoutChecked
	// on the second call).
	ModeNone = "-"
)

// Reply tags: the first element of a script's reply (or, for ReplyReplayed
// and ReplyByNameStale, the third of an OK). Each script's header lists its
// replies and their shapes.
const (
	ReplyOK             = "OK"
	ReplyReplayed       = "REPLAYED"
	ReplyByNameStale    = "BYNAME_STALE"
	ReplyReused         = "REUSED"
	ReplyConflict       = "CONFLICT"
	ReplyStale          = "STALE"
	ReplyHeld           = "HELD"
	ReplyLayoutDocument = "LAYOUT_DOCUMENT"
	ReplyLayoutUnknown  = "LAYOUT_UNKNOWN"
	ReplyCorrupt        = "CORRUPT"
	ReplyLimit          = "LIMIT"
	// ReplyWrongType: a swarm key a committing script reads or writes
	// holds another Redis type: {WRONGTYPE, name, type, want, key}
	// (key: its whole Redis name).
	ReplyWrongType = "WRONGTYPE"
	ReplyTooLarge  = "TOO_LARGE"
	// ReplyLengths: scan_section.lua's batch was too large to answer
	// whole; it answers each field's stored length instead.
	ReplyLengths = "LENGTHS"
	// ReplyBusy: another rebuild holds the by-name claim.
	ReplyBusy  = "BUSY"
	ReplyClean = "CLEAN"
	ReplyAgain = "AGAIN"
	// ReplyTooMany: a new claim in a swarm at its --max-claims-per-swarm:
	// {TOO_MANY, claims, max}.
	ReplyTooMany = "TOO_MANY"
)

// Lease operations (lease.lua's second argument).
const (
	LeaseAcquire = "acquire"
	LeaseRenew   = "renew"
	LeaseRelease = "release"
)

// Steps of the by-name rebuild (byname_rebuild.lua's first argument).
const (
	RebuildClaim   = "claim"
	RebuildRelease = "release"
	RebuildStart   = "start"
	RebuildAdd     = "add"
	RebuildVerify  = "verify"
	RebuildNames   = "names"
	RebuildExtras  = "extras"
	RebuildFinish  = "finish"
)

// Flags of the by-name index: members that start with FlagPrefix are never
// records.
const (
	FlagPrefix = "~"
	// FlagStale: the index may not reflect executions (score: a count of
	// detections).
	FlagStale = "~stale"
	// MemberUnnamed starts the index member of an executions record
	// without a name: MemberUnnamed + id.
	MemberUnnamed = "-"
	// FlagClaim starts a rebuild's claim: FlagClaim + expires_ms + ":" + token.
	FlagClaim = "~rebuilding:"
)

// Fields of a log entry.
const (
	LogFieldRevision  = "revision"
	LogFieldOwner     = "owner"
	LogFieldRecords   = "records"
	LogFieldRequestID = "request_id"
	// LogFieldChanges holds the records the batch put or deleted: per
	// record KindPut or KindDelete, then "<section>:<key length>:<key>",
	// concatenated (Watch reads it).
	LogFieldChanges = "changes"
	// LogFieldSections replaces LogFieldChanges when those would pass
	// LogChangesMax bytes: the changed sections joined by
	// LogSectionsSeparator.
	LogFieldSections     = "sections"
	LogSectionsSeparator = ","
	// LogFieldPrev is the swarm revision before the batch.
	LogFieldPrev = "prev"
	// The claim event of a claim operation's entry (docs/design/12-claims.md
	// §12.6): the claim's name, the event's kind (ClaimGranted...), the
	// grant's epoch and expiry (ms); the claim's owner is LogFieldOwner.
	LogFieldClaim        = "claim"
	LogFieldClaimKind    = "claim_kind"
	LogFieldClaimEpoch   = "claim_epoch"
	LogFieldClaimExpires = "claim_expires_at"
)

// Claim event kinds (LogFieldClaimKind).
const (
	ClaimGranted  = "granted"
	ClaimRenewed  = "renewed"
	ClaimReleased = "released"
	// ClaimLapsed: the reclaim of a claim that expired unrenewed.
	ClaimLapsed = "lapsed"
)

// Claim keys (docs/design/12-claims.md), under the swarm's hash tag.
const (
	// KeyClaims is the hash claim name -> grant record. Not "claims" (the
	// spec's first name): that is one of fenced's default sections, whose
	// records live in the key of the same name.
	KeyClaims = "claim-grants"
	// KeyClaimExpiry is the sorted set claim name -> expires_at ms.
	KeyClaimExpiry = "claim-expiry"
	// KeyClaimPrefix + <name> is the set of the records bound to the claim
	// name, each member "<section>\n<key>" (docs/design/12-claims.md
	// §12.4). Section names are [a-z0-9_-], so no section's key is one.
	KeyClaimPrefix = "claim:"
	// KeyClaimSweep is the hash claim name -> "<dead epoch>:<cursor>" of
	// the reclaims left to the reaper (docs/design/12-claims.md §12.5): the
	// records of the set KeyClaimPrefix+name bound to that name at an
	// epoch at or below the dead epoch are dead; cursor is where the next
	// SSCAN of the set starts.
	KeyClaimSweep = "claim-sweep"
	// ClaimSwarmsKey is, after "<prefix>:swarm:", the set of the slugs of
	// the swarms that may hold claims (no hash tag: on Cluster it lives on
	// one node), which the reaper walks (§12.5).
	ClaimSwarmsKey = "fence:claim-swarms"
	// ReaperTurnKey is, after "<prefix>:swarm:", the string naming the
	// replica whose reaper has the current pass (SET NX PX of its
	// --claim-reap-interval; no hash tag), so that one replica walks the
	// swarms per interval, not each (§12.5).
	ReaperTurnKey = "fence:reaper-turn"
	// ClaimReapBudget sizes one reclaim script run: it reads one SSCAN page
	// of COUNT ClaimReapBudget/4 members of a claim's set (about 64
	// members, a small set whole), so it deletes at most about that many
	// records (docs/design/12-claims.md §12.5).
	ClaimReapBudget = 256
	// ClaimLogPerClaim is how many log entries per live claim the log keeps
	// at least on a claim operation (MAXLEN ~ max(LogCap, 4 x claims)).
	ClaimLogPerClaim = 4
)

// LogChangesMax bounds a log entry's changes field, in bytes: with LogCap
// entries a swarm's log stays under ~16 MB whatever its batches.
const LogChangesMax = 16384

// Flags of byname_check.lua's answer: two characters per executions field,
// CheckRecord or CheckNotRecord, then CheckIndexed or CheckMissing.
const (
	CheckRecord    = "r"
	CheckNotRecord = "u"
	CheckIndexed   = "i"
	CheckMissing   = "m"
)

// LogCap is how many entries the log keeps at least: XADD MAXLEN ~ LogCap
// (LogTrim) drops the oldest whole stream node once the log is a node
// (stream-node-max-entries, 100, or stream-node-max-bytes, 4096) past it.
// An exact trim (MAXLEN =) cost ~3 µs of Redis time on every commit.
const LogCap = 1000

// LogTrim is XADD's MAXLEN modifier for the log: approximate.
const LogTrim = "~"

// RevMax (2^53-1) is the largest revision, epoch or time fenced reads,
// writes or compares: Redis's Lua numbers are doubles, exact up to it. The
// revisions and epochs fenced issues stay at most IssueMax (revision.go).
const RevMax = 1<<53 - 1

// entries are the Lua names of the values above, as Prelude defines them.
var entries = []struct{ name, value string }{
	{"FENCE_INFIX", FenceInfix},
	{"KEY_META", KeyMeta},
	{"KEY_REVISION", KeyRevision},
	{"KEY_LOG", KeyLog},
	{"KEY_BY_NAME", KeyByName},
	{"KEY_BY_NAME_INDEX", KeyByNameIndex},
	{"KEY_REQUEST_PREFIX", KeyRequestPrefix},
	{"KEY_REQUEST_IDS", KeyRequestIDs},
	{"KEY_SECTION_REVISIONS", KeySectionRevisions},
	{"SECTION_FLOOR", SectionFloor},
	{"KEY_CLAIMS", KeyClaims},
	{"KEY_CLAIM_EXPIRY", KeyClaimExpiry},
	{"KEY_CLAIM_PREFIX", KeyClaimPrefix},
	{"KEY_CLAIM_SWEEP", KeyClaimSweep},
	{"STAMP_SUFFIX", StampSuffix},
	{"FIELD_LEASE", FieldLease},
	{"FIELD_EPOCH", FieldEpoch},
	{"FIELD_LEADER_CHANGES", FieldLeaderChanges},
	{"FIELD_LAYOUT", FieldLayout},
	{"FIELD_SECTION_REVISIONS", FieldSectionRevisions},
	{"LAYOUT_RECORDS", LayoutRecords},
	{"LAYOUT_DOCUMENT", LayoutDocument},
	{"KIND_PUT", KindPut},
	{"KIND_DELETE", KindDelete},
	{"KIND_CHECK", KindCheck},
	{"KIND_CHECK_SECTION", KindCheckSection},
	{"KIND_CHECK_RECORDS", KindCheckRecords},
	{"KIND_CHECK_COUNT", KindCheckCount},
	{"KIND_PUT_BOUND", KindPutBound},
	{"MODE_STAMP", ModeStamp},
	{"MODE_LAYOUT_CHECKED", ModeLayoutChecked},
	{"MODE_REQUEST", ModeRequest},
	{"MODE_LEGACY_REQUEST", ModeLegacyRequest},
	{"MODE_CLAIM", ModeClaim},
	{"FENCE_CLAIM", FenceClaim},
	{"MODE_NONE", ModeNone},
	{"REPLY_OK", ReplyOK},
	{"REPLY_REPLAYED", ReplyReplayed},
	{"REPLY_BYNAME_STALE", ReplyByNameStale},
	{"REPLY_REUSED", ReplyReused},
	{"REPLY_CONFLICT", ReplyConflict},
	{"REPLY_STALE", ReplyStale},
	{"REPLY_HELD", ReplyHeld},
	{"REPLY_LAYOUT_DOCUMENT", ReplyLayoutDocument},
	{"REPLY_LAYOUT_UNKNOWN", ReplyLayoutUnknown},
	{"REPLY_CORRUPT", ReplyCorrupt},
	{"REPLY_LIMIT", ReplyLimit},
	{"REPLY_WRONGTYPE", ReplyWrongType},
	{"REPLY_TOO_LARGE", ReplyTooLarge},
	{"REPLY_LENGTHS", ReplyLengths},
	{"REPLY_BUSY", ReplyBusy},
	{"REPLY_CLEAN", ReplyClean},
	{"REPLY_AGAIN", ReplyAgain},
	{"LEASE_ACQUIRE", LeaseAcquire},
	{"LEASE_RENEW", LeaseRenew},
	{"LEASE_RELEASE", LeaseRelease},
	{"REBUILD_CLAIM", RebuildClaim},
	{"REBUILD_RELEASE", RebuildRelease},
	{"REBUILD_START", RebuildStart},
	{"REBUILD_ADD", RebuildAdd},
	{"REBUILD_VERIFY", RebuildVerify},
	{"REBUILD_NAMES", RebuildNames},
	{"REBUILD_EXTRAS", RebuildExtras},
	{"REBUILD_FINISH", RebuildFinish},
	{"FLAG_PREFIX", FlagPrefix},
	{"FLAG_STALE", FlagStale},
	{"FLAG_CLAIM", FlagClaim},
	{"MEMBER_UNNAMED", MemberUnnamed},
	{"LOG_FIELD_REVISION", LogFieldRevision},
	{"LOG_FIELD_OWNER", LogFieldOwner},
	{"LOG_FIELD_RECORDS", LogFieldRecords},
	{"LOG_FIELD_REQUEST_ID", LogFieldRequestID},
	{"LOG_FIELD_CHANGES", LogFieldChanges},
	{"LOG_FIELD_SECTIONS", LogFieldSections},
	{"LOG_SECTIONS_SEPARATOR", LogSectionsSeparator},
	{"LOG_FIELD_PREV", LogFieldPrev},
	{"LOG_CHANGES_MAX", strconv.Itoa(LogChangesMax)},
	{"LOG_CAP", strconv.Itoa(LogCap)},
	{"LOG_FIELD_CLAIM", LogFieldClaim},
	{"LOG_FIELD_CLAIM_KIND", LogFieldClaimKind},
	{"LOG_FIELD_CLAIM_EPOCH", LogFieldClaimEpoch},
	{"LOG_FIELD_CLAIM_EXPIRES", LogFieldClaimExpires},
	{"CLAIM_GRANTED", ClaimGranted},
	{"CLAIM_RENEWED", ClaimRenewed},
	{"CLAIM_RELEASED", ClaimReleased},
	{"CLAIM_LAPSED", ClaimLapsed},
	{"CLAIM_LOG_PER_CLAIM", strconv.Itoa(ClaimLogPerClaim)},
	{"REPLY_TOO_MANY", ReplyTooMany},
	{"LOG_TRIM", LogTrim},
	{"CHECK_RECORD", CheckRecord},
	{"CHECK_NOT_RECORD", CheckNotRecord},
	{"CHECK_INDEXED", CheckIndexed},
	{"CHECK_MISSING", CheckMissing},
	{"REV_MAX_TEXT", strconv.FormatInt(RevMax, 10)},
	{"ISSUE_MAX_TEXT", strconv.FormatInt(IssueMax, 10)},
	{"CLOCK_ERA_MIN_TEXT", strconv.FormatInt(ClockEraMin, 10)},
	{"REVISION_TICK_US", strconv.Itoa(RevisionTickUs)},
	// Patterns the scripts match with, built from the values above.
	// KIND_PATTERN / MODE_PATTERN: one character class of every kind / mode
	// letter. SECTION_PATTERN captures a section's name out of its key;
	// SLUG_PATTERN the slug out of any key of the swarm.
	{"KIND_PATTERN", charClass(KindPut, KindDelete, KindCheck, KindCheckSection, KindCheckRecords, KindCheckCount, KindPutBound)},
	{"MODE_PATTERN", charClass(ModeStamp, ModeLayoutChecked, ModeRequest, ModeLegacyRequest, ModeClaim, ModeNone)},
	{"SECTION_PATTERN", luaPatternQuote(FenceInfix) + "(.*)$"},
	{"SLUG_PATTERN", "{(.-)" + luaPatternQuote(FenceInfix)},
}

// Prelude is the Lua prepended to every script: `local P = {...}` holding
// every value of this package under its Lua name (upper case), and
// P.REV_MAX, the number. Generated once, sorted by name.
var Prelude = prelude()

// Names are the Lua names Prelude defines, sorted.
var Names = names()

// Values maps each Lua name of Prelude to its value.
func Values() map[string]string {
	m := make(map[string]string, len(entries))
	for _, e := range entries {
		m[e.name] = e.value
	}
	return m
}

func names() []string {
	out := make([]string, 0, len(entries)+1)
	for _, e := range entries {
		out = append(out, e.name)
	}
	out = append(out, "REV_MAX")
	slices.Sort(out)
	return out
}

func prelude() string {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b struct{ name, value string }) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	b.WriteString("-- Generated from internal/protocol (Go): the values the scripts\n")
	b.WriteString("-- share with fenced's Go code. Do not spell them in a script: use P.<NAME>.\n")
	b.WriteString("local P = {\n")
	for i, e := range sorted {
		if i > 0 && e.name == sorted[i-1].name {
			panic("protocol: duplicate Lua name " + e.name)
		}
		if !regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`).MatchString(e.name) {
			panic("protocol: bad Lua name " + e.name)
		}
		fmt.Fprintf(&b, "  %s = %s,\n", e.name, luaQuote(e.value))
	}
	b.WriteString("}\n")
	b.WriteString("P.REV_MAX = tonumber(P.REV_MAX_TEXT)\n")
	return b.String()
}

// luaQuote writes s as a Lua string literal (single quotes, escaped).
func luaQuote(s string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, "\\%d", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// luaPatternQuote escapes Lua's pattern magic characters in s.
func luaPatternQuote(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte("^$()%.[]*+-?", s[i]) >= 0 {
			b.WriteByte('%')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// charClass is a Lua character class of the one-character values vs.
func charClass(vs ...string) string {
	var b strings.Builder
	b.WriteByte('[')
	for _, v := range vs {
		if len(v) != 1 {
			panic("protocol: not one character: " + v)
		}
		b.WriteString(luaPatternQuote(v))
	}
	b.WriteByte(']')
	return b.String()
}
