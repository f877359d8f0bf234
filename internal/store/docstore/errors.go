package docstore

// The document layout's own refusals; the others it answers are the
// engine's (docplan's refusals in its terms: document.go storeError).

import (
	"errors"
	"fmt"
	"strings"

	"github.com/agentihooks/fenced/internal/store/engine"
)

// ErrMigrationContended: the swarm's own fencing state (its document,
// meta/layout or counter) kept changing during every attempt of a Migrate,
// until its deadline; nothing was committed. gRPC: ABORTED,
// REVISION_CONFLICT. docs/migration.md says what to do.
var ErrMigrationContended = errors.New("the swarm fencing state kept changing; nothing was committed")

// ErrDocumentContended: a document batch or lease operation found the
// swarm's own document (or its meta/layout, or its counter) changed by
// another writer between its read and its write on every attempt (16);
// nothing was written. Writes to other swarms' documents never cause it.
// fenced maps it to ABORTED, REVISION_CONFLICT (re-read and run the change
// again).
var ErrDocumentContended = errors.New("the swarm's document kept changing; nothing was written")

// ErrOutcomeUnknown: a Migrate sent its move to Redis, got no answer (the
// reply was lost, or came after the deadline) and could not learn
// afterwards whether the move committed. Returned wrapping the last
// failure (ErrUnavailable, a context error...). Run the migration again: a
// repeat is safe (the move is a compare-and-set on the document: it
// commits at most once, and a repeat after it answers AlreadyMoved). gRPC:
// that of the failure it wraps (UNAVAILABLE, DEADLINE_EXCEEDED).
var ErrOutcomeUnknown = errors.New("the move's outcome is unknown (Redis did not answer it); run it again: a repeat is safe")

// ErrSectionNotServed: the swarm's document holds a section that fenced is
// not configured to serve. Returned as *SectionNotServedError by Migrate
// (dry run included) before anything is written: moved, its records could
// be neither read nor written through fenced. Configure the section on
// every fenced (--sections, FENCED_SECTIONS; fenced migrate --sections
// too), or remove it from the document, and migrate again. gRPC:
// FAILED_PRECONDITION, SECTION_NOT_SERVED (metadata "sections": the
// names, comma-separated).
var ErrSectionNotServed = errors.New("the swarm's document holds a section fenced does not serve")

// SectionNotServedError is ErrSectionNotServed naming the sections.
type SectionNotServedError struct {
	// Sections are the document's sections not served, in its order.
	Sections []string
}

func (e *SectionNotServedError) Error() string {
	return fmt.Sprintf("%v: %s; nothing was written: add it to --sections (FENCED_SECTIONS) of every fenced, or remove it from the document, then migrate again",
		ErrSectionNotServed, strings.Join(e.Sections, ", "))
}

// Is makes errors.Is(err, ErrSectionNotServed) true.
func (e *SectionNotServedError) Is(target error) bool { return target == ErrSectionNotServed }

// UnmovableError is Migrate's refusal of a swarm whose document holds
// parts the records layout would not read as the document layout does
// (docs/design/02-redis-layout.md §2.6, docs/migration.md): Records names
// every one (section, key, why; *CorruptError each), in the document's
// order. Nothing was written. errors.Is(err, ErrCorruptRecord) holds, and
// errors.As finds the first part as a *CorruptError: the server answers
// DATA_LOSS RECORD_CORRUPT naming it, the message listing the first
// MaxUnmovableListed.
type UnmovableError struct {
	Records []engine.CorruptError
}

// MaxUnmovableListed is how many parts an UnmovableError's text lists.
const MaxUnmovableListed = 16

func (e *UnmovableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the document holds %d part(s) the records layout would not read; nothing was written (repair them, then migrate again):", len(e.Records))
	for i, r := range e.Records {
		if i == MaxUnmovableListed {
			fmt.Fprintf(&b, "; and %d more", len(e.Records)-i)
			break
		}
		sep := "; "
		if i == 0 {
			sep = " "
		}
		why := r.Why
		if r.Name != "" {
			why = r.Name
		}
		if r.Key == "" {
			fmt.Fprintf(&b, "%s%s: %s", sep, r.Section, why)
		} else {
			fmt.Fprintf(&b, "%s%s/%s: %s", sep, r.Section, r.Key, why)
		}
	}
	return b.String()
}

// Is makes errors.Is(err, ErrCorruptRecord) true.
func (e *UnmovableError) Is(target error) bool { return target == engine.ErrCorruptRecord }

// Unwrap answers the first part, so that errors.As finds a *CorruptError.
func (e *UnmovableError) Unwrap() error { return &e.Records[0] }
