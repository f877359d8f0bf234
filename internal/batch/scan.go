package batch

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Page sizes of ScanSection, in records. Each page is one script, during
// which Redis serves nobody else: at 1000 records (about 2 ms of Redis time
// for 200-byte values) other swarms' p99 write latency rose 6.6x in the
// scan benchmark, at 100 it rose 1.9x.
const (
	DefaultPageSize = 200
	MaxPageSize     = 10000
)

// Scan is a checked ScanSection request: where the page starts (a scan
// position, see ParseScanPosition; "" to start) and how many records it
// may hold (1 to MaxPageSize).
type Scan struct {
	Position string
	PageSize int
}

// CheckScan validates a ScanSection request: the slug, the section (a
// configured one or MetaSection), page_size (0 for DefaultPageSize, else 1 to
// MaxPageSize) and page_token (empty, or a token EncodePageToken issued for
// this slug and section). It returns the page to read, or a
// *ValidationError naming every bad field.
func (l Limits) CheckScan(slug, section string, pageSize int32, pageToken string) (Scan, error) {
	var vs violations
	l.checkSectionRef(&vs, slug, section)
	size := int(pageSize)
	switch {
	case size == 0:
		size = DefaultPageSize
	case size < 0 || size > MaxPageSize:
		vs.add("page_size", "must be 0 (default %d) to %d, got %d", DefaultPageSize, MaxPageSize, size)
	}
	position, ok := decodePageToken(pageToken, slug, section)
	if !ok {
		vs.add("page_token", "not a next_page_token of a scan of this slug and section")
	}
	if err := vs.err(); err != nil {
		return Scan{}, err
	}
	return Scan{Position: position, PageSize: size}, nil
}

// EncodePageToken is the next_page_token of a page of the scan of (slug,
// section) that ended at position (the store's Page.Next). Tokens are
// opaque to clients: base64url of "v2", the slug, the section and the
// position, NUL-separated, so that a token is only accepted for the scan
// that issued it. The position is last: a record key may hold NUL. "v1"
// tokens (a bare cursor) are still accepted by CheckScan.
func EncodePageToken(slug, section, position string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("v2\x00" + slug + "\x00" + section + "\x00" + position))
}

func decodePageToken(token, slug, section string) (position string, ok bool) {
	if token == "" {
		return "", true
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return "", false
	}
	parts := strings.SplitN(string(raw), "\x00", 4)
	if len(parts) != 4 || parts[1] != slug || parts[2] != section || parts[3] == "" {
		return "", false
	}
	switch parts[0] {
	case "v1":
		if _, err := strconv.ParseUint(parts[3], 10, 64); err != nil {
			return "", false
		}
	case "v2":
		if _, _, _, ok := ParseScanPosition(parts[3]); !ok {
			return "", false
		}
	default:
		return "", false
	}
	return parts[3], true
}

// WholeSectionFingerprint stands for the fingerprint in a scan position cut
// inside an HSCAN reply that held the whole section (the store resumes after
// the position's key whatever changed before it).
const WholeSectionFingerprint = "whole"

// ParseScanPosition splits a scan position (see internal/store's
// ScanSection) into its HSCAN cursor and, where the last page was cut
// inside an HSCAN batch, the fingerprint (16 lowercase hex digits) of the
// batch's keys up to after, the last key returned. "" starts a scan (cursor
// "0"). ok is false for anything ScanSection could not have handed out.
func ParseScanPosition(p string) (cursor, fingerprint, after string, ok bool) {
	if p == "" {
		return "0", "", "", true
	}
	parts := strings.SplitN(p, ":", 3)
	if _, err := strconv.ParseUint(parts[0], 10, 64); err != nil {
		return "", "", "", false
	}
	switch len(parts) {
	case 1:
		return parts[0], "", "", true
	case 3:
		if (parts[1] != WholeSectionFingerprint && (len(parts[1]) != 16 || strings.Trim(parts[1], "0123456789abcdef") != "")) ||
			parts[2] == "" || len(parts[2]) > MaxKeyBytes || !utf8.ValidString(parts[2]) {
			return "", "", "", false
		}
		return parts[0], parts[1], parts[2], true
	}
	return "", "", "", false
}

// KeysFingerprint is 16 hex digits of the SHA-256 of keys, each
// length-prefixed: the fingerprint of a scan position cut inside a batch
// of keys (ParseScanPosition).
func KeysFingerprint(keys []string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, k := range keys {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(k)))])
		h.Write([]byte(k))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// PageRecordOverhead is the most bytes a record's map entry adds to its
// key and value in a Record or ScanSection answer (tags, lengths, the
// revision's varint).
const PageRecordOverhead = 32

// RecordLimit is the longest stored record a Record or ScanSection answer
// of at most maxBytes holds under key: maxBytes less the key and the
// answer's framing.
func RecordLimit(maxBytes int, key string) int { return maxBytes - len(key) - PageRecordOverhead }

// PageEnd cuts the page keys[from:to] by bytes: it answers the end of the
// longest prefix whose keys and sizes (size(key): a value's length, or an
// upper bound of it), with PageRecordOverhead bytes each, stay within
// maxBytes, and at least one record.
func PageEnd(keys []string, from, to, maxBytes int, size func(string) int) int {
	total := 0
	for i, key := range keys[from:to] {
		total += len(key) + size(key) + PageRecordOverhead
		if i > 0 && total > maxBytes {
			return from + i
		}
	}
	return to
}
