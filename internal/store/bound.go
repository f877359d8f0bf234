package store

import (
	"fmt"

	"github.com/redis/rueidis"
)

// Records bound to a claim (docs/design/12-claims.md §12.4). A bound
// record is live while its claim's grant has the record's ClaimEpoch and
// expires after Redis's now; one that is not is absent to every fenced read
// (here) and write (commit.lua). Each read decides it from one reading of
// the grants of the claims it met and Redis's clock, taken with the
// records: the read scripts' claims element (read_claims.lua), or on the
// MULTI and chunked paths of Sections the same commands under the same
// MULTI or WATCH.

// liveClaims is what a read found of the claims it met: each one's live
// grant's epoch (absent: no live grant). A nil liveClaims is a read that
// met none, or that found claim-grants empty: every bound record is absent.
type liveClaims map[string]int64

// live tells whether rec is present to a fenced read: not bound, or bound
// to a live grant of its epoch.
func (c liveClaims) live(rec Record) bool {
	if rec.Claim == "" {
		return true
	}
	epoch, ok := c[rec.Claim]
	return ok && rec.ClaimEpoch > 0 && epoch == rec.ClaimEpoch
}

// drop deletes from records those that are not live.
func (c liveClaims) drop(records map[string]Record) {
	for key, rec := range records {
		if !c.live(rec) {
			delete(records, key)
		}
	}
}

// grantsLive reads the grants of names (HMGET of claim-grants, nil for
// none) at Redis's clock nowMs into the claims live then. A grant that is
// not a lease record is not live (its records are absent), as commit.lua
// has it.
func grantsLive(names []string, grants []rueidis.RedisMessage, nowMs int64) liveClaims {
	live := liveClaims{}
	for i, name := range names {
		if i >= len(grants) || grants[i].IsNil() {
			continue
		}
		raw, err := grants[i].ToString()
		if err != nil {
			continue
		}
		if l, ok := parseLease(raw); ok && l.ExpiresAtMs > nowMs {
			live[name] = l.Epoch
		}
	}
	return live
}

// parseClaimState reads the read scripts' claims element, { now_ms, name,
// grant or nil, ... } (read_claims.lua claim_state). Errors:
// ErrMalformedReply.
func parseClaimState(m rueidis.RedisMessage) (liveClaims, error) {
	arr, err := m.ToArray()
	if err != nil || len(arr) < 1 || len(arr)%2 != 1 {
		return nil, fmt.Errorf("%w: claims", ErrMalformedReply)
	}
	text, err := arr[0].ToString()
	if err != nil {
		return nil, fmt.Errorf("%w: claims: clock", ErrMalformedReply)
	}
	now, err := parseInt(text)
	if err != nil {
		return nil, fmt.Errorf("%w: claims: clock", ErrMalformedReply)
	}
	names := make([]string, 0, len(arr)/2)
	grants := make([]rueidis.RedisMessage, 0, len(arr)/2)
	for j := 1; j < len(arr); j += 2 {
		name, err := arr[j].ToString()
		if err != nil {
			return nil, fmt.Errorf("%w: claims: name", ErrMalformedReply)
		}
		names = append(names, name)
		grants = append(grants, arr[j+1])
	}
	return grantsLive(names, grants, now), nil
}

// boundClaims are the claims the bound records among records are bound to,
// once each, appended to names (seen: those already there).
func boundClaims(records map[string]Record, names []string, seen map[string]bool) []string {
	for _, rec := range records {
		if rec.Claim != "" && !seen[rec.Claim] {
			seen[rec.Claim] = true
			names = append(names, rec.Claim)
		}
	}
	return names
}
