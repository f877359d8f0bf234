package engine

import (
	"fmt"

	"github.com/agentihooks/fenced/internal/batch"
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

// GrantsLive reads the grants of names (HMGET of claim-grants, nil for
// none) at Redis's clock nowMs into the claims live then. A grant that is
// not a lease record is not live (its records are absent), as commit.lua
// has it.
func GrantsLive(names []string, grants []rueidis.RedisMessage, nowMs int64) batch.LiveClaims {
	live := batch.LiveClaims{}
	for i, name := range names {
		if i >= len(grants) || grants[i].IsNil() {
			continue
		}
		raw, err := grants[i].ToString()
		if err != nil {
			continue
		}
		if l, ok := batch.ParseLease(raw); ok && l.ExpiresAtMs > nowMs {
			live[name] = l.Epoch
		}
	}
	return live
}

// ExecGrants reads the EXEC of { TIME, HMGET claim-grants met... } into
// the claims live at that clock. Errors: ErrMalformedReply.
func ExecGrants(met []string, exec []rueidis.RedisMessage) (batch.LiveClaims, error) {
	if len(exec) != 2 {
		return nil, fmt.Errorf("%w: claims: %d replies", ErrMalformedReply, len(exec))
	}
	clock, err := exec[0].AsStrSlice()
	if err != nil || len(clock) != 2 {
		return nil, fmt.Errorf("%w: claims: clock", ErrMalformedReply)
	}
	sec, err1 := ParseInt(clock[0])
	usec, err2 := ParseInt(clock[1])
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("%w: claims: clock", ErrMalformedReply)
	}
	vals, err := exec[1].ToArray()
	if err != nil || len(vals) != len(met) {
		return nil, fmt.Errorf("%w: claims: grants", ErrMalformedReply)
	}
	return GrantsLive(met, vals, sec*1000+usec/1000), nil
}
