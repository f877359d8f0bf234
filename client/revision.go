package client

import "github.com/agentihooks/fenced/internal/protocol"

// CompareRevisions compares two revisions (swarm, section or record
// revisions) in the order fenced issued them: -1 when a was issued before
// b, 0 when equal, +1 when a was issued after b. Revisions are not ordered
// by magnitude alone: fenced read Redis's clock in µs before (15-16 digits,
// 1796079180861096) and reads it in units of 100 µs now (14 digits, below
// 10^14, so that a writer formatting one as a Lua number writes it
// exactly), and every 14-digit revision is later than every 15-16 digit
// one. Numbers below 10^13 (older writers counting 1, 2, 3) are earlier
// than both. Within each of the three ranges the larger is the later
// (docs/design/05-numbering.md §5.1). Compare for equality with ==.
func CompareRevisions(a, b int64) int { return protocol.CompareRevisions(a, b) }

// laterRevision reports whether a was issued after b.
func laterRevision(a, b int64) bool { return protocol.RevisionLater(a, b) }

// latestRevision is the later of a and b.
func latestRevision(a, b int64) int64 { return protocol.LatestRevision(a, b) }
