package engine

import (
	"bytes"
	"sort"
)

// Redacted replaces a secret's value wherever it would be stored.
const Redacted = "[REDACTED]"

// minSecretLen: shorter values are not redacted, because replacing every
// "a" or "1" in the output would destroy it and hide nothing.
const minSecretLen = 4

// redactor removes secret values from a stream. A value split across two
// chunks is still caught: the end of a chunk that could be the start of a
// secret (at most len(longest)-1 bytes) is held back until more arrives
// or the stream ends. The rest goes on at once.
type redactor struct {
	secrets [][]byte // longest first, so a secret containing another wins
	hold    int
}

func newRedactor(values []string) *redactor {
	r := &redactor{}
	for _, v := range values {
		if len(v) >= minSecretLen {
			r.secrets = append(r.secrets, []byte(v))
		}
	}
	sort.Slice(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
	if len(r.secrets) > 0 {
		r.hold = len(r.secrets[0]) - 1
	}
	return r
}

func (r *redactor) active() bool { return r != nil && len(r.secrets) > 0 }

// replace redacts a complete piece of text.
func (r *redactor) replace(b []byte) []byte {
	if !r.active() {
		return b
	}
	for _, s := range r.secrets {
		b = bytes.ReplaceAll(b, s, []byte(Redacted))
	}
	return b
}

func (r *redactor) string(s string) string {
	if !r.active() {
		return s
	}
	return string(r.replace([]byte(s)))
}

// stream redacts buf (new bytes after whatever was held back) and returns
// what can be emitted now and how many input bytes that consumed; the rest
// must be passed again, with more, next time. At the end (final) nothing
// is held back.
func (r *redactor) stream(buf []byte, final bool) (out []byte, consumed int) {
	if !r.active() {
		return buf, len(buf)
	}
	cut := len(buf)
	if !final {
		cut = len(buf) - r.partial(buf)
		// Do not cut inside an occurrence that straddles the cut.
		for _, s := range r.secrets {
			from := max(0, cut-len(s)+1)
			if i := bytes.Index(buf[from:min(len(buf), cut+len(s)-1)], s); i >= 0 && from+i < cut {
				cut = from + i
			}
		}
	}
	return r.replace(append([]byte(nil), buf[:cut]...)), cut
}

// partial is the length of the longest end of b that is the start of a
// secret but not all of it: more bytes could make it one.
func (r *redactor) partial(b []byte) int {
	for i := max(0, len(b)-r.hold); i < len(b); i++ { // the longest first
		for _, s := range r.secrets {
			if len(s) > len(b)-i && s[0] == b[i] && bytes.HasPrefix(s, b[i:]) {
				return len(b) - i
			}
		}
	}
	return 0
}
