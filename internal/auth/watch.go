package auth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"time"
)

// DefaultReloadInterval is how often watched files are read for changes.
const DefaultReloadInterval = time.Second

// files is a set of files read together, remembering a digest of their
// content as last seen. Comparing content rather than mtime and size misses
// no change on a file system with coarse timestamps, and sees through the
// symlink swap by which Kubernetes updates a mounted Secret; the files are a
// few KiB, so reading them once a second costs nothing.
type files struct {
	paths []string
	seen  [sha256.Size]byte
}

// read returns the content of every file and whether it differs from what
// was seen last; it then remembers it as seen, so that a broken file is
// reported once, not every poll.
func (f *files) read() (contents [][]byte, changed bool, err error) {
	h := sha256.New()
	for _, p := range f.paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, false, err
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
		contents = append(contents, b)
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	changed = d != f.seen
	f.seen = d
	return contents, changed, nil
}

// poll calls check every interval until ctx is done.
func poll(ctx context.Context, every time.Duration, check func()) {
	if every <= 0 {
		every = DefaultReloadInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}
