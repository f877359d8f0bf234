package bench

import (
	"os"
	"path/filepath"
)

// inhouseScript is the in-house fenced batch script as ../shared/bench-tick
// (ticksim.py INHOUSE_LUA) runs it, verbatim (testdata/inhouse_commit.lua,
// which the Python benchmarks read too), for every benchmark that sets
// fenced beside it (the count check's, the tick's cycle): a lease check,
// then per write an HGET of its field and a compare of the revision its
// head gives, then INCR, HSET, the stamp and XADD. A section read whole is
// checked by one 'check' write per record (an HGET-and-compare each).
var inhouseScript = func() string {
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "inhouse_commit.lua"))
	if err != nil {
		panic(err)
	}
	return string(b)
}()
