package auth_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/certtest"
)

// waitLimit bounds every poll for a reload: a failure bound, never a
// measurement.
const waitLimit = 15 * time.Second

// reloadEvery is the reload interval of these tests.
const reloadEvery = 10 * time.Millisecond

// logs collects log records for assertions.
type logs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, b.String())
	return nil
}

// count is how many records contain s.
func (l *logs) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.msgs, "\n")
}

// eventually polls cond until it holds, failing the test after waitLimit.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// replace writes data to path the way Kubernetes updates a mounted Secret:
// a new file renamed over the old one.
func replace(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func oneToken(name, token, access string) string {
	return `{"tokens":[{"name":"` + name + `","token":"` + token + `","slugs":["*"],"access":"` + access + `"}]}`
}

func TestTokensReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	replace(t, path, oneToken("a", "token-a", "read"))
	l := &logs{}
	a, err := auth.LoadTokens(path, slog.New(l), auth.WithReloadInterval(reloadEvery))
	if err != nil {
		t.Fatalf("LoadTokens(%s): %v", path, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Watch(ctx)

	works := func(token string) bool {
		_, err := a.Tokens().Authorize(token, "s", auth.Read)
		return err == nil
	}
	if !works("token-a") {
		t.Fatalf("token-a refused right after LoadTokens")
	}

	t.Run("replaced file", func(t *testing.T) {
		replace(t, path, oneToken("b", "token-b", "read"))
		eventually(t, "token-b accepted after the file was replaced", func() bool { return works("token-b") })
		if works("token-a") {
			t.Errorf("token-a still accepted after the file dropped it")
		}
	})
	t.Run("rewritten in place, same size", func(t *testing.T) {
		// Same length as before: only the content tells the change.
		if err := os.WriteFile(path, []byte(oneToken("c", "token-c", "read")), 0o600); err != nil {
			t.Fatal(err)
		}
		eventually(t, "token-c accepted after an in-place rewrite", func() bool { return works("token-c") })
	})
	t.Run("broken file keeps the old tokens", func(t *testing.T) {
		// The in-place rewrite above may have been read between its
		// truncation and its write: an empty file, logged unusable once.
		// Only this file's lines count here.
		before := l.count("token file unusable")
		replace(t, path, `{"tokens":[{"name":"d","token":"token-d"`) // truncated
		eventually(t, "error logged for the broken file", func() bool { return l.count("token file unusable") > before })
		if !works("token-c") {
			t.Errorf("token-c refused after a broken file was written; the old tokens must stay")
		}
		if works("token-d") {
			t.Errorf("token-d of the broken file accepted")
		}
		// Logged once, not every poll.
		time.Sleep(20 * reloadEvery)
		if n := l.count("token file unusable") - before; n != 1 {
			t.Errorf("broken file logged %d times, want once:\n%s", n, l)
		}
	})
	t.Run("invalid entry keeps the old tokens", func(t *testing.T) {
		replace(t, path, oneToken("e", "token-e", "admin"))
		eventually(t, "error logged for the invalid entry", func() bool { return l.count(`access "admin"`) >= 1 })
		if !works("token-c") || works("token-e") {
			t.Errorf("after an invalid file: token-c works = %v (want true), token-e works = %v (want false)", works("token-c"), works("token-e"))
		}
	})
	t.Run("missing file keeps the old tokens", func(t *testing.T) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		eventually(t, "error logged for the missing file", func() bool { return l.count("no such file") >= 1 })
		if !works("token-c") {
			t.Errorf("token-c refused while the file is missing")
		}
	})
	t.Run("fixed file is loaded", func(t *testing.T) {
		replace(t, path, oneToken("f", "token-f", "write"))
		eventually(t, "token-f accepted after the file was fixed", func() bool { return works("token-f") })
		if l.count("token file reloaded") < 3 {
			t.Errorf("reloads not logged:\n%s", l)
		}
	})
}

func TestLoadTokensErrors(t *testing.T) {
	dir := t.TempDir()
	broken := certtest.WriteFile(t, dir, "broken.json", []byte(`{"tokens": [}`))
	for _, path := range []string{filepath.Join(dir, "missing.json"), broken} {
		if _, err := auth.LoadTokens(path, nil); err == nil {
			t.Errorf("LoadTokens(%s) = nil error, want one", path)
		}
	}
}
