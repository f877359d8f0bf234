// Package auth owns who may call fenced and what they may do: the TLS
// configuration of the gRPC server (its certificate and, for mTLS, the CA
// that client certificates must chain to), and bearer tokens, each bound to
// slug patterns and to read, fenced or write access. Both are read from files
// (Kubernetes mounts Secrets as files) and reloaded when the files change; a
// file that no longer parses keeps what was loaded before.
//
// The token file is JSON:
//
//	{"tokens": [
//	  {"name": "tick-prod", "token_sha256": "<64 hex digits>", "slugs": ["rig-*", "prod-?"], "access": "fenced"},
//	  {"name": "hive-prod", "token_sha256": "<64 hex digits>", "slugs": ["rig-*"], "access": "write"},
//	  {"name": "dashboard", "token": "<the token itself>", "slugs": ["*"], "access": "read"}
//	]}
//
// The gRPC side (interceptors, the method table, status codes) is in
// grpc.go; everything else in this package is transport-free.
package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// Access is what a token may do: Read, Fenced or Write (each allows what
// the ones before it do).
type Access int

const (
	// Read allows Layout, Sections, StreamSections, ScanSection, Record,
	// Watch and Current.
	Read Access = 1
	// Fenced allows, besides every read, Acquire, Renew, Release and
	// FencedBatch, but a FencedBatch that puts or deletes only when it is
	// fenced (a lease fence or a claim fence): an unfenced one is refused
	// (ErrUnfencedWrite), as is Migrate. For a controller's token: no
	// write of its goes unfenced by accident.
	Fenced Access = 2
	// Write allows everything: unfenced batches and Migrate too.
	Write Access = 3
)

// String is the file format's name of a: "read", "fenced" or "write".
func (a Access) String() string {
	switch a {
	case Read:
		return "read"
	case Fenced:
		return "fenced"
	case Write:
		return "write"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// Errors of Tokens.Authorize, for errors.Is. The gRPC interceptors map
// ErrTokenMissing and ErrTokenUnknown to UNAUTHENTICATED, the others to
// PERMISSION_DENIED.
var (
	// ErrTokenMissing: the call carries no bearer token.
	ErrTokenMissing = errors.New("auth: no bearer token")
	// ErrTokenUnknown: the bearer token is not in the token file.
	ErrTokenUnknown = errors.New("auth: unknown bearer token")
	// ErrSlugDenied: the token's slug patterns do not match the swarm.
	ErrSlugDenied = errors.New("auth: token not permitted for this swarm")
	// ErrReadOnly: a read token was used for a write.
	ErrReadOnly = errors.New("auth: token permits reads only")
	// ErrUnfencedWrite: a fenced token was used for an unfenced batch that
	// writes, or for Migrate.
	ErrUnfencedWrite = errors.New("auth: token permits fenced writes only")
)

// Token is one entry of the token file, as loaded. The token itself is kept
// only as its SHA-256 digest.
type Token struct {
	// Name identifies the token in logs and error details; unique in a file.
	Name string
	// Slugs are path.Match patterns; the token may touch a swarm whose slug
	// matches one of them.
	Slugs []string
	// Access is Read, Fenced or Write.
	Access Access

	digest [sha256.Size]byte
}

// Permits reports whether t allows need on slug: nil, ErrSlugDenied,
// ErrReadOnly (a read token, for more) or ErrUnfencedWrite (a fenced
// token, for Write).
func (t *Token) Permits(slug string, need Access) error {
	if !t.matches(slug) {
		return ErrSlugDenied
	}
	switch {
	case need <= t.Access:
		return nil
	case t.Access == Read:
		return ErrReadOnly
	}
	return ErrUnfencedWrite
}

func (t *Token) matches(slug string) bool {
	for _, p := range t.Slugs {
		// Patterns were checked at load: Match cannot fail here.
		if ok, _ := path.Match(p, slug); ok {
			return true
		}
	}
	return false
}

// Tokens is one loaded token file: immutable, safe for concurrent use.
type Tokens struct {
	list []Token
}

// Len is the number of tokens.
func (ts *Tokens) Len() int { return len(ts.list) }

// Lookup returns the token whose digest is SHA-256(bearer), or
// ErrTokenMissing for an empty bearer and ErrTokenUnknown when none
// matches. Every stored digest is compared in constant time, and all of them
// are compared whatever the outcome, so the time taken says nothing about
// which tokens exist.
func (ts *Tokens) Lookup(bearer string) (*Token, error) {
	if bearer == "" {
		return nil, ErrTokenMissing
	}
	d := sha256.Sum256([]byte(bearer))
	found := -1
	for i := range ts.list {
		if subtle.ConstantTimeCompare(d[:], ts.list[i].digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return nil, ErrTokenUnknown
	}
	return &ts.list[found], nil
}

// Authorize looks bearer up and checks that it permits need on slug. It
// returns the token on success, else ErrTokenMissing, ErrTokenUnknown,
// ErrSlugDenied or ErrReadOnly (the last two with the token).
func (ts *Tokens) Authorize(bearer, slug string, need Access) (*Token, error) {
	t, err := ts.Lookup(bearer)
	if err != nil {
		return nil, err
	}
	return t, t.Permits(slug, need)
}

// Recheck checks a token loaded before against these tokens: the token of
// the same digest (ErrTokenUnknown when none) must permit need on slug
// (ErrSlugDenied, ErrReadOnly). It answers the token found.
func (ts *Tokens) Recheck(t *Token, slug string, need Access) (*Token, error) {
	for i := range ts.list {
		if subtle.ConstantTimeCompare(t.digest[:], ts.list[i].digest[:]) == 1 {
			return &ts.list[i], ts.list[i].Permits(slug, need)
		}
	}
	return nil, ErrTokenUnknown
}

// fileEntry is one token of the file format.
type fileEntry struct {
	Name        string   `json:"name"`
	Token       string   `json:"token"`
	TokenSHA256 string   `json:"token_sha256"`
	Slugs       []string `json:"slugs"`
	Access      string   `json:"access"`
}

type file struct {
	Tokens *[]fileEntry `json:"tokens"`
}

// Parse reads a token file (see the package comment). It is strict: unknown
// fields, a missing "tokens" list, an entry without a name, with both or
// neither of token and token_sha256, with a digest that is not 64 hex
// digits, without slugs, with a malformed pattern or with an access other
// than "read", "fenced" or "write", two entries of one name and two entries of one
// token are errors naming the entry. An empty list is valid: every call
// that needs a token is then refused.
func Parse(data []byte) (*Tokens, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f file
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("auth: token file: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("auth: token file: data after the JSON object")
	}
	if f.Tokens == nil {
		return nil, errors.New(`auth: token file: no "tokens" list`)
	}
	ts := &Tokens{list: make([]Token, 0, len(*f.Tokens))}
	names := map[string]bool{}
	digests := map[[sha256.Size]byte]string{}
	for i, e := range *f.Tokens {
		t, err := e.token()
		if err != nil {
			return nil, fmt.Errorf("auth: token file: tokens[%d] (%q): %w", i, e.Name, err)
		}
		if names[t.Name] {
			return nil, fmt.Errorf("auth: token file: tokens[%d]: name %q used twice", i, t.Name)
		}
		names[t.Name] = true
		if other, dup := digests[t.digest]; dup {
			return nil, fmt.Errorf("auth: token file: tokens[%d] (%q): same token as %q", i, t.Name, other)
		}
		digests[t.digest] = t.Name
		ts.list = append(ts.list, t)
	}
	return ts, nil
}

func (e fileEntry) token() (Token, error) {
	t := Token{Name: e.Name}
	if e.Name == "" {
		return t, errors.New("no name")
	}
	switch {
	case e.Token != "" && e.TokenSHA256 != "":
		return t, errors.New(`both "token" and "token_sha256": give one`)
	case e.Token != "":
		if strings.TrimFunc(e.Token, isTokenChar) != "" {
			return t, errors.New(`"token" may hold only visible ASCII characters, no spaces`)
		}
		t.digest = sha256.Sum256([]byte(e.Token))
	case e.TokenSHA256 != "":
		d, err := hex.DecodeString(e.TokenSHA256)
		if err != nil || len(d) != sha256.Size {
			return t, errors.New(`"token_sha256" must be 64 hex digits (sha256sum of the token)`)
		}
		copy(t.digest[:], d)
	default:
		return t, errors.New(`no "token" or "token_sha256"`)
	}
	if len(e.Slugs) == 0 {
		return t, errors.New(`no "slugs": give at least one pattern ("*" for every swarm)`)
	}
	for _, p := range e.Slugs {
		// path.Match reports a malformed pattern whatever the name.
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return t, fmt.Errorf("slug pattern %q is malformed (path.Match syntax: * ? [a-z] \\)", p)
		}
	}
	t.Slugs = e.Slugs
	switch e.Access {
	case "read":
		t.Access = Read
	case "fenced":
		t.Access = Fenced
	case "write":
		t.Access = Write
	default:
		return t, fmt.Errorf(`access %q: want "read", "fenced" or "write"`, e.Access)
	}
	return t, nil
}

// isTokenChar: visible ASCII, the characters an HTTP header value carries
// unchanged after "Bearer ".
func isTokenChar(r rune) bool { return r > ' ' && r < 0x7f }
