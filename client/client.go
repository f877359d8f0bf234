// Package client is the Go client of fenced, for tick and hive processes
// written in Go. It dials fenced with production defaults, decodes errors
// into typed values from the gRPC status details (never from message text),
// turns "read, change, write" into one fenced, retried call (Update), and
// keeps a swarm's lease (Keeper).
//
//	c, err := client.Dial("fenced:7420")
//	k, err := c.Keep(ctx, "my-swarm", "tick-"+host, 10*time.Second)
//	defer k.Close(ctx)
//	rev, err := c.Update(ctx, "my-swarm", k.Fence(), func(tx *client.Txn) error {
//		v, ok, err := tx.Get("claims", "T-1")
//		...
//		return tx.Put("claims", "T-1", newValue)
//	})
package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/client/internal/model"
	"github.com/agentihooks/fenced/internal/protocol"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Client calls one fenced deployment. It is safe for concurrent use.
//
// It remembers the latest swarm revision it has seen per swarm (from every
// read, commit and lease change, in issue order: CompareRevisions): fenced
// issues every revision after every earlier one, even after Redis lost
// acknowledged writes, so a read showing an earlier swarm revision means
// Redis lost data the client saw. That read fails with
// ErrRevisionWentBackwards (*RevisionWentBackwardsError), once: the client
// then goes on from the earlier revision. A swarm moving from fenced's
// former 16-digit revisions to its 14-digit ones is not going backwards.
type Client struct {
	conn    *grpc.ClientConn // nil when built with New
	records fencedv1.RecordsServiceClient
	leases  fencedv1.LeaseServiceClient

	// plainWatch: a Watch sent with gzip was refused UNIMPLEMENTED (a
	// fenced older than its gzip support): every later Watch of this
	// Client goes uncompressed (Watch).
	plainWatch atomic.Bool

	mu    sync.Mutex
	seen  map[string]int64 // slug -> latest swarm revision seen
	views map[viewKey]*View
}

// saw records a swarm revision a commit or lease change answered: it only
// raises the mark.
func (c *Client) saw(slug string, revision int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if laterRevision(revision, c.seen[slug]) {
		c.seen[slug] = revision
	}
}

// mark is the latest swarm revision seen so far: a read takes it before
// it is sent, and compares its answer with it (a commit that ends while the
// read is in flight may have a higher revision than the read's, rightly).
func (c *Client) mark(slug string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[slug]
}

// read records the swarm revision a read answered, given the mark taken
// before the read was sent: *RevisionWentBackwardsError when it is earlier
// (the mark then moves down to it, unless a later answer raised it
// meanwhile, so that the caller is told once), else nil. 0 (no batch ever
// committed, as after a restart without persistence) counts too.
func (c *Client) read(slug string, before, revision int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if laterRevision(before, revision) {
		if c.seen[slug] == before {
			c.seen[slug] = revision
		}
		return &RevisionWentBackwardsError{Slug: slug, Highest: before, Revision: revision}
	}
	if laterRevision(revision, c.seen[slug]) {
		c.seen[slug] = revision
	}
	return nil
}

// MaxMessageBytes is the largest message the client sends or receives by
// default: room for a whole large swarm (Sections) and for the largest
// batch the server's default limits allow (8 MiB of values).
const MaxMessageBytes = 64 << 20

// retryReads is the service config of Dial: the read-only RPCs are retried
// on UNAVAILABLE (up to 4 attempts, 50 ms growing to 1 s); commits and lease
// changes are never retried by the transport (they are not idempotent).
const retryReads = `{"methodConfig": [{
  "name": [
    {"service": "fenced.v1.RecordsService", "method": "Layout"},
    {"service": "fenced.v1.RecordsService", "method": "Sections"},
    {"service": "fenced.v1.RecordsService", "method": "Record"},
    {"service": "fenced.v1.LeaseService", "method": "Current"}
  ],
  "retryPolicy": {
    "maxAttempts": 4,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"]
  }
}]}`

// KeepaliveTime and KeepaliveTimeout are Dial's keepalive: after
// KeepaliveTime without traffic on a connection with calls in flight the
// client pings, and closes the connection when the answer takes longer than
// KeepaliveTimeout. fenced's server accepts pings down to every 10 s
// (--keepalive-min-time), grpc-go's floor, so a long call (a replica wait,
// a health Watch) is never cut for pinging. Override with WithKeepalive.
const (
	KeepaliveTime    = 30 * time.Second
	KeepaliveTimeout = 10 * time.Second
)

// WithKeepalive is the Dial option that sets the keepalive: a ping after
// every interval without traffic while calls are in flight, the connection
// closed when an answer takes longer than timeout. grpc-go raises an
// interval under 10 s to 10 s; fenced's server accepts pings down to its
// --keepalive-min-time (10 s by default).
func WithKeepalive(interval, timeout time.Duration) grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: interval, Timeout: timeout})
}

// Dial connects to fenced at target (any gRPC target: "host:port",
// "dns:///fenced.ns:7420"). Defaults, each overridable by opts (applied
// after them): plaintext transport credentials (pass
// grpc.WithTransportCredentials for TLS), keepalive pings every
// KeepaliveTime of silence during calls (KeepaliveTimeout), messages up to MaxMessageBytes both ways, and
// transport retries of reads on UNAVAILABLE only.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	defaults := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		WithKeepalive(KeepaliveTime, KeepaliveTimeout),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		grpc.WithDefaultServiceConfig(retryReads),
	}
	conn, err := grpc.NewClient(target, append(defaults, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("fenced client: dial %s: %w", target, err)
	}
	c := New(conn)
	c.conn = conn
	return c, nil
}

// New returns a Client over an existing connection; Close then does not
// close it. Its calls that fenced refuses their turn at Redis
// (ErrCallsQueued: nothing written) are sent again after the server's
// delay while their deadline allows (queuedConn).
func New(conn grpc.ClientConnInterface) *Client {
	conn = queuedConn{conn}
	return &Client{records: fencedv1.NewRecordsServiceClient(conn), leases: fencedv1.NewLeaseServiceClient(conn), seen: map[string]int64{}}
}

// Close closes the Client's views and the connection Dial opened.
func (c *Client) Close() error {
	c.mu.Lock()
	views := slices.Collect(maps.Values(c.views))
	clear(c.views)
	c.mu.Unlock()
	for _, v := range views {
		v.Close()
	}
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Record is one stored record: its Revision, its Value byte for byte as
// its writer sent it (fenced's value grammar: JSON in which NaN, Infinity
// and -Infinity may stand, which encoding/json refuses), and the claim
// (Claim, ClaimEpoch) it is bound to; see model.Record.
type Record = model.Record

// Fence is the lease condition of a batch: the batch commits only while the
// swarm's lease is live and names this epoch (and owner, when set). Keeper
// provides it.
type Fence struct {
	Owner string
	Epoch int64
	// NowMs is the caller's clock in ms; 0 when unknown. It can only make
	// the server's check stricter.
	NowMs int64
}

// Unfenced is the fence of a batch written without the swarm's lease, by
// choice: Batch and Update send it as no fence at all, so the batch commits
// on its revisions alone, whoever holds the lease (a hive's batches, which
// hold none). A nil fence is refused (ErrNoFence) unless a claim fences the
// batch (WithClaim): an unfenced write is never an accident. Never modify
// it.
var Unfenced = &Fence{}

func (f *Fence) proto() *fencedv1.LeaseFence {
	if f == nil || f == Unfenced {
		return nil
	}
	return &fencedv1.LeaseFence{Owner: f.Owner, Epoch: f.Epoch, NowMs: f.NowMs}
}

// Get reads one record and the swarm revision together. rec is nil when the
// record is absent. Errors: ErrRevisionWentBackwards; ErrSnapshotTooLarge
// (*TooLargeError naming it) for a record over the server's limit alone (a
// foreign writer's); see Decode.
func (c *Client) Get(ctx context.Context, slug, section, key string) (rec *Record, revision int64, err error) {
	before := c.mark(slug)
	resp, err := c.records.Record(ctx, &fencedv1.RecordRequest{Slug: slug, Section: section, Key: key})
	if err != nil {
		return nil, 0, Decode(err)
	}
	if err := c.read(slug, before, resp.GetRevision()); err != nil {
		return nil, 0, err
	}
	if r := resp.GetRecord(); r != nil {
		got := model.RecordOf(r)
		rec = &got
	}
	return rec, resp.GetRevision(), nil
}

// Sections reads whole sections (every section but archive when names is
// empty) and the swarm revision as one snapshot, of any size (Snapshot).
// Errors: see Snapshot.
func (c *Client) Sections(ctx context.Context, slug string, names ...string) (map[string]map[string]Record, int64, error) {
	snap, err := c.Snapshot(ctx, slug, names...)
	if err != nil {
		return nil, 0, err
	}
	return snap.Sections, snap.Revision, nil
}

// Snapshot is sections read at one instant: its Revision, its Sections
// (each section's records by key) and SectionRevisions (each section's
// revision: fence on it with a CheckSection write).
type Snapshot = model.Snapshot

// Snapshot is Sections with the section revisions: one consistent
// snapshot of any size. It asks with one Sections call; a snapshot over
// the server's limits for one answer (ErrSnapshotTooLarge) is read again
// with StreamSections, one snapshot streamed in messages of at most 1 MiB
// (restarted by the server when a write lands in it while it is read; only
// a complete one is answered), so that no snapshot is refused for its size
// (a server older than StreamSections answers the ErrSnapshotTooLarge).
// Errors: ErrRevisionWentBackwards; ErrConflict when writes kept landing
// in a streamed snapshot on each of the server's attempts (read again);
// ErrResourceExhausted with a retry delay when the server has as many
// streams open as it allows (TOO_MANY_SECTION_STREAMS); see Decode.
func (c *Client) Snapshot(ctx context.Context, slug string, names ...string) (*Snapshot, error) {
	before := c.mark(slug)
	resp, err := c.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: slug, Names: names})
	if err != nil {
		err = Decode(err)
		var tl *TooLargeError
		if errors.As(err, &tl) && tl.Key == "" {
			snap, serr := c.streamSnapshot(ctx, slug, names)
			if status.Code(serr) == codes.Unimplemented {
				return nil, err
			}
			if serr != nil {
				return nil, Decode(serr)
			}
			if err := c.read(slug, before, snap.Revision); err != nil {
				return nil, err
			}
			return snap, nil
		}
		return nil, err
	}
	if err := c.read(slug, before, resp.GetRevision()); err != nil {
		return nil, err
	}
	snap := &Snapshot{
		Revision:         resp.GetRevision(),
		Sections:         make(map[string]map[string]Record, len(resp.GetSections())),
		SectionRevisions: make(map[string]int64, len(resp.GetSections())),
	}
	for name, sec := range resp.GetSections() {
		snap.Sections[name] = recordsFrom(sec.GetRecords())
		snap.SectionRevisions[name] = sec.GetRevision()
	}
	return snap, nil
}

// streamSnapshot reads the sections with StreamSections: the records of
// the last attempt, joined from their parts, and the end. Errors: the
// call's status error, unDecoded.
func (c *Client) streamSnapshot(ctx context.Context, slug string, names []string) (*Snapshot, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.records.StreamSections(ctx, &fencedv1.StreamSectionsRequest{Slug: slug, Names: names})
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{Sections: map[string]map[string]Record{}}
	var part []byte // the value of a record sent in parts, so far
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return nil, status.Error(codes.Internal, "fenced: StreamSections ended without its end")
		}
		if err != nil {
			return nil, err
		}
		if resp.GetRestart() {
			snap.Sections, part = map[string]map[string]Record{}, nil
			continue
		}
		for _, r := range resp.GetRecords() {
			if r.GetMore() || part != nil {
				part = append(part, r.GetRecord().GetValue()...)
				if r.GetMore() {
					continue
				}
			}
			rec := model.RecordOf(r.GetRecord())
			if part != nil {
				rec.Value, part = json.RawMessage(part), nil
			}
			sec := snap.Sections[r.GetSection()]
			if sec == nil {
				sec = map[string]Record{}
				snap.Sections[r.GetSection()] = sec
			}
			sec[r.GetKey()] = rec
		}
		if end := resp.GetEnd(); end != nil {
			snap.Revision, snap.SectionRevisions = end.GetRevision(), end.GetSectionRevisions()
			for name := range snap.SectionRevisions {
				if snap.Sections[name] == nil {
					snap.Sections[name] = map[string]Record{}
				}
			}
			return snap, nil
		}
	}
}

func recordsFrom(m map[string]*fencedv1.Record) map[string]Record {
	recs := make(map[string]Record, len(m))
	for k, r := range m {
		recs[k] = model.RecordOf(r)
	}
	return recs
}

// ScanSection reads a section page by page (at most pageSize records per
// page; 0: the server's default), calling fn for every record; fn's error
// stops the scan. It answers the section revision of the first and the last
// page: when they differ, the section changed during the scan (a record may
// then have been seen twice, or missed if inserted meanwhile). A record
// over the server's limit alone (a foreign writer's, over
// --max-snapshot-bytes: no page can hold it) stops the scan with
// ErrSnapshotTooLarge, a *TooLargeError naming its Section, Key and stored
// Bytes, with the NextPageToken past it: scan on with ScanFrom(that
// token), or pass SkipTooLarge to step past such records as they come.
// Errors: ErrRevisionWentBackwards (a page's swarm revision),
// ErrSnapshotTooLarge, see Decode.
func (c *Client) ScanSection(ctx context.Context, slug, section string, pageSize int, fn func(key string, r Record) error, opts ...ScanOption) (first, last int64, err error) {
	var o scanOptions
	for _, opt := range opts {
		opt(&o)
	}
	token, read := o.token, false
	for {
		before := c.mark(slug)
		resp, err := c.records.ScanSection(ctx, &fencedv1.ScanSectionRequest{Slug: slug, Section: section, PageSize: int32(pageSize), PageToken: token})
		if err != nil {
			err = Decode(err)
			var te *TooLargeError
			if !o.skip || !errors.As(err, &te) || te.Key == "" || te.NextPageToken == "" {
				return first, last, err
			}
			if o.skipped != nil {
				if err := o.skipped(te); err != nil {
					return first, last, err
				}
			}
			token = te.NextPageToken
			continue
		}
		if err := c.read(slug, before, resp.GetRevision()); err != nil {
			return first, last, err
		}
		if !read {
			first, read = resp.GetSectionRevision(), true
		}
		last = resp.GetSectionRevision()
		for k, r := range resp.GetRecords() {
			if err := fn(k, model.RecordOf(r)); err != nil {
				return first, last, err
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			return first, last, nil
		}
	}
}

// ScanOption is an option of ScanSection.
type ScanOption func(*scanOptions)

type scanOptions struct {
	token   string
	skip    bool
	skipped func(*TooLargeError) error
}

// ScanFrom starts ScanSection at a page token instead of the section's
// start: a *TooLargeError's NextPageToken, to scan on past the record it
// names. A token of another swarm or section, or not handed out by fenced,
// is ErrInvalidArgument (page_token).
func ScanFrom(token string) ScanOption { return func(o *scanOptions) { o.token = token } }

// SkipTooLarge has ScanSection step past every record over the server's
// limit alone (RESOURCE_EXHAUSTED SNAPSHOT_TOO_LARGE naming it): skipped
// (nil: none) is called with its *TooLargeError (Section, Key, Bytes,
// MaxBytes, NextPageToken), nothing of the record read, and the scan goes
// on from the NextPageToken past it; skipped's error stops the scan. fn
// still sees every other record. A server that names no next page token
// (older than this client) stops the scan with the error.
func SkipTooLarge(skipped func(*TooLargeError) error) ScanOption {
	return func(o *scanOptions) { o.skip, o.skipped = true, skipped }
}

// WriteKind is what a Write does.
type WriteKind = fencedv1.WriteKind

// The write kinds.
const (
	Put    = fencedv1.WriteKind_WRITE_KIND_PUT
	Delete = fencedv1.WriteKind_WRITE_KIND_DELETE
	Check  = fencedv1.WriteKind_WRITE_KIND_CHECK
	// CheckSection compares a section's revision; Key is empty. It also
	// catches records inserted since the read, but not the changes of a
	// writer that bypasses fenced (it raises no section revision), and it
	// conflicts on every insert into the section.
	CheckSection = fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION
	// CheckRecords compares the revision of every record in Checks (of
	// Section); Key is empty and Expected 0. One such write counts as one
	// write of the batch whatever its pairs (at most the server's
	// --max-checks, default 20000, in all; their keys count in
	// --max-batch-value-bytes). How Update fences a section read whole
	// when CheckCount does not hold.
	CheckRecords = fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS
	// CheckCount checks a section read whole by the snapshot's revision
	// (Expected), how many records it held (Count) and the sum of their
	// revisions (RevisionSum): the rule of CheckRecords of every one of
	// them, in a few bytes, when every record read is at or before the
	// snapshot's revision (docs/design/03-fenced-batch.md §3.4); it counts
	// as Count record checks against --max-checks. How Update fences a
	// section read whole when that holds. CountCheck makes one.
	CheckCount = fencedv1.WriteKind_WRITE_KIND_CHECK_COUNT
)

// RevisionSumModulus is what CheckCount's RevisionSum is taken modulo
// (10^14).
const RevisionSumModulus = protocol.RevisionSumModulus

// RevisionSum is a CheckCount's RevisionSum of revisions revs: their sum
// modulo RevisionSumModulus.
func RevisionSum(revs ...int64) int64 { return protocol.RevisionSum(revs...) }

// CountCheck is the CheckCount of section as a snapshot read it at
// revision rev (its records recs), and ok; ok is false when the rule does
// not hold for it (a section read empty, or a record stored after rev:
// check it with CheckRecords).
func CountCheck(section string, rev int64, recs map[string]Record) (w Write, ok bool) {
	if len(recs) == 0 || rev < 1 {
		return Write{}, false
	}
	var sum int64
	for _, r := range recs {
		if r.Revision < 1 || CompareRevisions(r.Revision, rev) > 0 {
			return Write{}, false
		}
		sum = protocol.RevisionSum(sum, r.Revision)
	}
	return Write{Kind: CheckCount, Section: section, Expected: rev, Count: int64(len(recs)), RevisionSum: sum}, true
}

// Blind is the Expected revision that disables a write's check.
const Blind = -1

// Write is one put, delete or check, naming the revision its record was
// read at (0: must be absent; Blind: no check).
type Write struct {
	Kind     WriteKind
	Section  string
	Key      string
	Expected int64
	// Value is a Put's value, stored byte for byte: one text of the value
	// grammar (JSON, and NaN, Infinity, -Infinity; see Record.Value); else
	// INVALID_ARGUMENT naming writes[i].value and the byte at fault.
	Value json.RawMessage
	// Checks are the records a CheckRecords compares; nil for other kinds.
	Checks []RecordCheck
	// Count and RevisionSum are a CheckCount's (CountCheck); 0 for other
	// kinds.
	Count, RevisionSum int64
	// Bound binds a Put's record to the batch's claim (WithClaim;
	// RecordWrite.bind_to_claim, docs/design/12-claims.md §12.4): once
	// that claim is released or lapses the record is absent to every read
	// and write (a put expecting 0 commits over it). A later Put without
	// Bound unbinds it; one under another claim rebinds it. Without a
	// claim fence, or on another kind, the batch is ErrInvalidArgument
	// naming writes[i].bind_to_claim.
	Bound bool
}

// PutBound is a Put of value at (section, key), read at expected, bound to
// the batch's claim (Write.Bound).
func PutBound(section, key string, expected int64, value json.RawMessage) Write {
	return Write{Kind: Put, Section: section, Key: key, Expected: expected, Value: value, Bound: true}
}

// RecordCheck is one record of a CheckRecords write: Key must be stored at
// revision Expected (0: must be absent; never Blind).
type RecordCheck struct {
	Key      string
	Expected int64
}

// BatchOption sets an optional field of a FencedBatch.
type BatchOption func(*fencedv1.FencedBatchRequest)

// WithRequestID makes the batch idempotent under id (1-128 printable ASCII
// characters, unique per change): sending it again with the same id inside
// the server's window answers the original revision and writes nothing, so
// a batch whose reply was lost can always be retried safely. NewRequestID
// makes one.
func WithRequestID(id string) BatchOption {
	return func(r *fencedv1.FencedBatchRequest) { r.RequestId = id }
}

// WithReplicaAck makes fenced wait until replicas acknowledged the commit
// (Redis WAIT), at most timeout (0: the server's default). Fewer in time is
// ErrReplicationTimeout (*ReplicationError with the committed revision).
func WithReplicaAck(replicas int, timeout time.Duration) BatchOption {
	return func(r *fencedv1.FencedBatchRequest) {
		r.ReplicaAck = &fencedv1.ReplicaAck{Replicas: int32(replicas), TimeoutMs: timeout.Milliseconds()}
	}
}

// ClaimFence is a batch's condition on one of the swarm's claims (a named
// lease, docs/design/12-claims.md §12.3): the batch commits only while the
// claim Name is held by Owner at Epoch (the grant's) and has not expired
// by the later of Redis's clock and NowMs. It is checked in the same
// atomic step as the Fence (either, both or neither may be given) and
// every revision; a refusal is ErrLeaseStale (*LeaseError with Fence
// "claim", Claim and the current grant as Holder), nothing written.
type ClaimFence struct {
	// Name is the claim's name: 1-200 bytes of [A-Za-z0-9._:@/-].
	Name string
	// Owner is the claim's holder. Required.
	Owner string
	// Epoch is the claim grant's epoch (>= 1).
	Epoch int64
	// NowMs is the caller's clock in ms; 0 when unknown. It can only make
	// the server's check stricter.
	NowMs int64
}

// WithClaim fences the batch by the claim c as well (nil: no claim
// fence). With Update it fences every batch sent.
func WithClaim(c *ClaimFence) BatchOption {
	return func(r *fencedv1.FencedBatchRequest) {
		if c == nil {
			r.Claim = nil
			return
		}
		r.Claim = &fencedv1.ClaimFence{Name: c.Name, Owner: c.Owner, Epoch: c.Epoch, NowMs: c.NowMs}
	}
}

// NewRequestID returns a random request id (32 hex digits).
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// Batch sends writes as one FencedBatch, once: all commit or none. It
// answers the revision committed at. An answer that leaves open whether it
// committed (UNAVAILABLE but REPLICATION_TIMEOUT, DEADLINE_EXCEEDED,
// CANCELED: fenced's OUTCOME_UNKNOWN, a lost reply, or ctx ending while
// the batch was sent) is ErrOutcomeUnknown, as *OutcomeUnknownError with
// the WithRequestID id as RequestID (and still matching its own kind,
// ErrUnavailable, context.DeadlineExceeded): Batch does not resend it;
// send the same writes again under that id (Update does so by itself).
// fence is the lease's (Keeper.Fence), or Unfenced to write without one by
// choice; nil without a claim (WithClaim) is ErrNoFence, nothing sent.
// Errors: ErrNoFence, ErrFenceRequired (the server requires a fence for a
// section written, --require-fence), see Decode.
func (c *Client) Batch(ctx context.Context, slug string, fence *Fence, writes []Write, opts ...BatchOption) (int64, error) {
	req := &fencedv1.FencedBatchRequest{Slug: slug, Fence: fence.proto(), Writes: make([]*fencedv1.RecordWrite, len(writes))}
	for i, w := range writes {
		req.Writes[i] = &fencedv1.RecordWrite{Kind: w.Kind, Section: w.Section, Key: w.Key, Expected: w.Expected, Value: string(w.Value), BindToClaim: w.Bound,
			Count: w.Count, RevisionSum: w.RevisionSum}
		if len(w.Checks) > 0 {
			checks := make([]*fencedv1.RecordCheck, len(w.Checks))
			for j, c := range w.Checks {
				checks[j] = &fencedv1.RecordCheck{Key: c.Key, Expected: c.Expected}
			}
			req.Writes[i].Checks = checks
		}
	}
	for _, o := range opts {
		o(req)
	}
	if fence == nil && req.Claim == nil {
		return 0, ErrNoFence
	}
	resp, err := c.records.FencedBatch(ctx, req)
	if err != nil {
		return 0, batchError(ctx, req.GetRequestId(), Decode(err))
	}
	c.saw(slug, resp.GetRevision())
	c.viewsCommitted(slug, resp.GetRevision(), writes, req.GetClaim())
	return resp.GetRevision(), nil
}

// Lease is a swarm's lease: its Owner, Epoch (the fencing token),
// ExpiresAtMs (ms by Redis's clock) and ReplicasAcked (replicas that
// acknowledged the grant or renewal, with --wait-replicas).
type Lease = model.Lease

func leaseFrom(l *fencedv1.Lease) Lease {
	return Lease{Owner: l.GetOwner(), Epoch: l.GetEpoch(), ExpiresAtMs: l.GetExpiresAtMs()}
}

// Acquire asks for the swarm's lease for ttl. Errors: ErrLeaseHeld (as
// *LeaseError with the holder and RetryAfter); ErrReplicationTimeout (as
// *ReplicationError, also ErrUnavailable) when the server requires replica
// acknowledgements and too few came in time: no lease is held (call again:
// the asker acquiring again keeps the epoch the primary recorded); see
// Decode.
func (c *Client) Acquire(ctx context.Context, slug, owner string, ttl time.Duration) (Lease, int64, error) {
	return c.acquire(ctx, slug, "", owner, ttl)
}

// AcquireClaim asks for the swarm's claim name (a named lease: its own
// owner, expiry and epochs, docs/design/12-claims.md) for ttl; as Acquire.
// Errors also: ErrInvalidArgument for a name outside LeaseName's rules
// (1-200 bytes of [A-Za-z0-9._:@/-]); codes.ResourceExhausted with reason
// TOO_MANY_CLAIMS for a new name in a swarm holding the server's
// --max-claims-per-swarm claims; ErrLayoutDocument on a document-layout
// swarm.
func (c *Client) AcquireClaim(ctx context.Context, slug, name, owner string, ttl time.Duration) (Lease, int64, error) {
	return c.acquire(ctx, slug, name, owner, ttl)
}

func (c *Client) acquire(ctx context.Context, slug, name, owner string, ttl time.Duration) (Lease, int64, error) {
	resp, err := c.leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Name: name, Owner: owner, TtlMs: ttl.Milliseconds()})
	if err != nil {
		return Lease{}, 0, Decode(err)
	}
	c.saw(slug, resp.GetRevision())
	l := leaseFrom(resp.GetLease())
	l.ReplicasAcked = int(resp.GetReplicasAcked())
	return l, resp.GetRevision(), nil
}

// Renew extends the live lease of owner at epoch by ttl from Redis's now.
// Errors: ErrLeaseStale (as *LeaseError); ErrReplicationTimeout (as
// *ReplicationError) when too few replicas acknowledged the renewal in
// time: it is not a renewal, the lease still ends when the last
// acknowledged one said; see Decode.
func (c *Client) Renew(ctx context.Context, slug, owner string, epoch int64, ttl time.Duration) (Lease, int64, error) {
	return c.renew(ctx, slug, "", owner, epoch, ttl)
}

// RenewClaim extends the live claim name of owner at epoch by ttl; as
// Renew.
func (c *Client) RenewClaim(ctx context.Context, slug, name, owner string, epoch int64, ttl time.Duration) (Lease, int64, error) {
	return c.renew(ctx, slug, name, owner, epoch, ttl)
}

func (c *Client) renew(ctx context.Context, slug, name, owner string, epoch int64, ttl time.Duration) (Lease, int64, error) {
	resp, err := c.leases.Renew(ctx, &fencedv1.RenewRequest{Slug: slug, Name: name, Owner: owner, Epoch: epoch, TtlMs: ttl.Milliseconds()})
	if err != nil {
		return Lease{}, 0, Decode(err)
	}
	c.saw(slug, resp.GetRevision())
	l := leaseFrom(resp.GetLease())
	l.ReplicasAcked = int(resp.GetReplicasAcked())
	return l, resp.GetRevision(), nil
}

// Release ends the live lease of owner at epoch. Errors: ErrLeaseStale, see
// Decode.
func (c *Client) Release(ctx context.Context, slug, owner string, epoch int64) (int64, error) {
	return c.release(ctx, slug, "", owner, epoch)
}

// ReleaseClaim ends the live claim name of owner at epoch; as Release.
func (c *Client) ReleaseClaim(ctx context.Context, slug, name, owner string, epoch int64) (int64, error) {
	return c.release(ctx, slug, name, owner, epoch)
}

func (c *Client) release(ctx context.Context, slug, name, owner string, epoch int64) (int64, error) {
	resp, err := c.leases.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Name: name, Owner: owner, Epoch: epoch})
	if err != nil {
		return 0, Decode(err)
	}
	c.saw(slug, resp.GetRevision())
	return resp.GetRevision(), nil
}

// Current reads the swarm's lease (nil when none), whether it is live,
// Redis's now in ms and the swarm revision. Errors:
// ErrRevisionWentBackwards, see Decode.
func (c *Client) Current(ctx context.Context, slug string) (lease *Lease, live bool, nowMs, revision int64, err error) {
	return c.current(ctx, slug, "")
}

// CurrentClaim reads the swarm's claim name (nil when never granted or
// released); as Current.
func (c *Client) CurrentClaim(ctx context.Context, slug, name string) (lease *Lease, live bool, nowMs, revision int64, err error) {
	return c.current(ctx, slug, name)
}

func (c *Client) current(ctx context.Context, slug, name string) (lease *Lease, live bool, nowMs, revision int64, err error) {
	before := c.mark(slug)
	resp, err := c.leases.Current(ctx, &fencedv1.CurrentRequest{Slug: slug, Name: name})
	if err != nil {
		return nil, false, 0, 0, Decode(err)
	}
	if err := c.read(slug, before, resp.GetRevision()); err != nil {
		return nil, false, 0, 0, err
	}
	if l := resp.GetLease(); l != nil {
		v := leaseFrom(l)
		lease = &v
	}
	return lease, resp.GetLive(), resp.GetNowMs(), resp.GetRevision(), nil
}
