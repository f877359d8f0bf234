package client_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/client"
)

// TestScanSectionStepsPastAForeignRecordOverTheLimit: a 5 MiB record
// written into claims beside 30 of fenced's by a writer outside fenced
// (HSET). Get of it and a plain ScanSection meeting it answer
// ErrSnapshotTooLarge, a *TooLargeError naming claims, its key and stored
// size, the scan's with a NextPageToken; ScanFrom(that token) scans on
// past it. With SkipTooLarge the scan steps past it by itself, reporting
// it once, and fn sees each of the other 30 records once (page sizes 1
// and 1000). Before, the scan stopped on an undecoded RESOURCE_EXHAUSTED
// and could not start anywhere but the section's start.
func TestScanSectionStepsPastAForeignRecordOverTheLimit(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	var ws []client.Write
	for i := range 30 {
		ws = append(ws, client.Write{Kind: client.Put, Section: "claims", Key: fmt.Sprintf("c-%02d", i), Value: json.RawMessage(`{"by":"x"}`)})
	}
	if _, err := f.c.Batch(ctx, slug, client.Unfenced, ws); err != nil {
		t.Fatal(err)
	}
	huge := `{"r":1,"v":"` + strings.Repeat("x", 5<<20) + `"}`
	f.redis.Do(t, "HSET", key(slug, "claims"), "c-15-big", huge)
	f.redis.SettleHash(t, key(slug, "claims"))
	named := func(te *client.TooLargeError) bool {
		return te.Section == "claims" && te.Key == "c-15-big" && te.Bytes == int64(len(huge)) && te.MaxBytes > 0 && te.MaxBytes < te.Bytes
	}

	_, _, err := f.c.Get(ctx, slug, "claims", "c-15-big")
	var te *client.TooLargeError
	if !errors.Is(err, client.ErrSnapshotTooLarge) || !errors.As(err, &te) || !named(te) {
		t.Fatalf("Get of the 5 MiB record = %v (%+v); want *TooLargeError naming claims/c-15-big, %d bytes", err, te, len(huge))
	}

	for _, size := range []int{1, 1000} {
		// Without SkipTooLarge: the scan stops on the record; ScanFrom its
		// token goes on.
		seen := map[string]int{}
		count := func(k string, _ client.Record) error { seen[k]++; return nil }
		var from string
		for restarts := 0; ; restarts++ {
			var opts []client.ScanOption
			if from != "" {
				opts = append(opts, client.ScanFrom(from))
			}
			_, _, err := f.c.ScanSection(ctx, slug, "claims", size, count, opts...)
			if err == nil {
				break
			}
			if te = nil; !errors.As(err, &te) || !named(te) || te.NextPageToken == "" || restarts > 0 {
				t.Fatalf("page size %d: ScanSection (restart %d) = %v (%+v); want one *TooLargeError naming claims/c-15-big with a next page token", size, restarts, err, te)
			}
			from = te.NextPageToken
		}
		check := func(how string) {
			if len(seen) != 30 {
				t.Errorf("page size %d, %s: read %d records, want the other 30", size, how, len(seen))
			}
			for k, n := range seen {
				if n != 1 || k == "c-15-big" {
					t.Errorf("page size %d, %s: %s read %d times", size, how, k, n)
				}
			}
		}
		check("ScanFrom")

		seen = map[string]int{}
		var skipped []string
		first, last, err := f.c.ScanSection(ctx, slug, "claims", size, count, client.SkipTooLarge(func(te *client.TooLargeError) error {
			if !named(te) {
				t.Errorf("skipped %+v, want claims/c-15-big", te)
			}
			skipped = append(skipped, te.Section+"/"+te.Key+" "+strconv.FormatInt(te.Bytes, 10))
			return nil
		}))
		if err != nil || first == 0 || first != last || len(skipped) != 1 {
			t.Errorf("page size %d: ScanSection(SkipTooLarge) = %d/%d, %v, skipped %q; want the section revision twice, nil, the record once", size, first, last, err, skipped)
		}
		check("SkipTooLarge")

		stop := errors.New("stop at the big one")
		_, _, err = f.c.ScanSection(ctx, slug, "claims", size, func(string, client.Record) error { return nil },
			client.SkipTooLarge(func(*client.TooLargeError) error { return stop }))
		if !errors.Is(err, stop) {
			t.Errorf("page size %d: ScanSection whose skipped callback fails = %v, want %v", size, err, stop)
		}
	}
}
