package client_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/client"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestSnapshotOfAnySizeIsOneSnapshot: five 1 MB executions records written
// by an in-house writer (its spacing, Python's NaN) and one of 1.5 MB of
// two-byte characters (over one StreamSections message: sent in parts,
// split between characters) make a snapshot Sections refuses for its size.
// Snapshot and Sections answer it whole and byte for byte; an Update that
// reads executions whole commits, fenced by every record it read.
func TestSnapshotOfAnySizeIsOneSnapshot(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	rev, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "T-1", Value: json.RawMessage(`{"by": "hive-a"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"exe-big": `"` + strings.Repeat("é", 750_000) + `"`}
	for i := range 5 {
		want[fmt.Sprintf("exe-%d", i)] = fmt.Sprintf(`{"name": "agent-%d", "generation": %d, "score": NaN, "log": "%s"}`, i, i, strings.Repeat("x", 1<<20))
	}
	for k, v := range want {
		f.redis.Do(t, "HSET", key(slug, "executions"), k, fmt.Sprintf(`{"r": %d, "v": %s}`, rev, v))
	}
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := fencedv1.NewRecordsServiceClient(conn)
	if _, err := raw.Sections(ctx, &fencedv1.SectionsRequest{Slug: slug, Names: []string{"executions"}}); err == nil {
		t.Fatal("Sections(executions) of 6.5 MB answered; want SNAPSHOT_TOO_LARGE, what Snapshot reads past")
	}
	snap, err := f.c.Snapshot(ctx, slug, "executions", "claims")
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if snap.Revision != rev || len(snap.Sections["executions"]) != len(want) || string(snap.Sections["claims"]["T-1"].Value) != `{"by": "hive-a"}` {
		t.Fatalf("Snapshot = revision %d, %d executions, claims %v; want r%d, %d, T-1", snap.Revision, len(snap.Sections["executions"]), snap.Sections["claims"], rev, len(want))
	}
	for k, v := range want {
		if got := snap.Sections["executions"][k]; string(got.Value) != v || got.Revision != rev {
			t.Errorf("executions/%s = %d bytes at r%d, want the %d stored at r%d", k, len(got.Value), got.Revision, len(v), rev)
		}
	}
	secs, _, err := f.c.Sections(ctx, slug)
	if err != nil || len(secs["executions"]) != len(want) {
		t.Fatalf("Sections(every section) = %d executions, %v; want %d", len(secs["executions"]), err, len(want))
	}
	committed, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		execs, err := tx.Section("executions")
		if err != nil {
			return err
		}
		if n := execs.Len(); n != len(want) {
			return errors.New("executions read partly")
		}
		return tx.Put("claims", "count", json.RawMessage(fmt.Sprint(execs.Len())))
	})
	if err != nil {
		t.Fatalf("Update reading executions whole: %v", err)
	}
	if rec, _, err := f.c.Get(ctx, slug, "claims", "count"); err != nil || rec == nil || string(rec.Value) != "6" || rec.Revision != committed {
		t.Fatalf("claims/count = %+v, %v; want 6 at r%d", rec, err, committed)
	}
}

// TestUnfencedIsAnExplicitChoice: a nil fence without a claim is refused
// before anything is sent (ErrNoFence; Update does not run the change);
// Unfenced writes without a fence by choice; a claim alone fences a batch;
// a server requiring a fence refuses an Unfenced batch as ErrFenceRequired.
func TestUnfencedIsAnExplicitChoice(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	put := []client.Write{{Kind: client.Put, Section: "claims", Key: "T-3", Value: json.RawMessage(`{}`)}}
	if _, err := f.c.Batch(ctx, slug, nil, put); !errors.Is(err, client.ErrNoFence) {
		t.Fatalf("Batch with a nil fence = %v; want ErrNoFence", err)
	}
	ran := false
	if _, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error { ran = true; return tx.Put("claims", "T-3", json.RawMessage(`{}`)) }); !errors.Is(err, client.ErrNoFence) || ran {
		t.Fatalf("Update with a nil fence = %v (change ran: %v); want ErrNoFence, the change not run", err, ran)
	}
	if n := f.redis.Do(t, "EXISTS", key(slug, "claims")); n != "0" {
		t.Fatal("a refused nil fence wrote to Redis")
	}
	if _, err := f.c.Batch(ctx, slug, client.Unfenced, put); err != nil {
		t.Fatalf("Batch Unfenced: %v", err)
	}
}

// TestValuesWithPythonsNonFiniteLiteralsGoInAndOutByteForByte: a put of a
// value as Python's json.dumps writes it (NaN, Infinity, -Infinity) commits
// and reads back byte for byte, as Record.Value says; a value that is none
// of the grammar is ErrInvalidArgument naming the byte at fault.
func TestValuesWithPythonsNonFiniteLiteralsGoInAndOutByteForByte(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	v := json.RawMessage(`{"score": NaN, "best": Infinity, "worst": -Infinity}`)
	rev, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "T-1", Value: v}})
	if err != nil {
		t.Fatalf("a put of %s: %v", v, err)
	}
	if rec, _, err := f.c.Get(ctx, slug, "claims", "T-1"); err != nil || rec == nil || string(rec.Value) != string(v) || rec.Revision != rev {
		t.Fatalf("Get = %+v, %v; want %s at r%d", rec, err, v, rev)
	}
	_, err = f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "T-2", Value: json.RawMessage(`{"score": nan}`)}})
	var ie *client.InvalidArgumentError
	if !errors.As(err, &ie) || len(ie.Violations) != 1 || !strings.Contains(ie.Violations[0].Description, `byte 10 starts "nan"`) {
		t.Fatalf("a put of nan = %v; want ErrInvalidArgument naming byte 10", err)
	}
}
