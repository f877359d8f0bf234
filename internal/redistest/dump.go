package redistest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Dump renders every key of the server with its type and whole content
// (hash fields sorted, string values, stream entries), one key a line in
// key order: compare two Dumps to assert that nothing changed.
func (s *Server) Dump(t testing.TB) string {
	t.Helper()
	keys := s.DoArray(t, "KEYS", "*")
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		typ := s.Do(t, "TYPE", k)
		var content []string
		switch typ {
		case "hash":
			kv := s.DoArray(t, "HGETALL", k)
			for i := 0; i+1 < len(kv); i += 2 {
				content = append(content, kv[i]+"="+kv[i+1])
			}
			slices.Sort(content)
		case "string":
			content = []string{s.Do(t, "GET", k)}
		case "stream":
			content = s.DoArray(t, "XRANGE", k, "-", "+")
		}
		fmt.Fprintf(&b, "%s (%s): %s\n", k, typ, strings.Join(content, " | "))
	}
	return b.String()
}
