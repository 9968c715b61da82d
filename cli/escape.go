package cli

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// safe renders text a job controls (its progress and status lines, its
// error, timeline messages) for one of the CLI's own lines on a terminal:
// control characters are written as escapes (\x1b, \n, \u009b), and so
// are invalid UTF-8 bytes and the Unicode controls that reorder or hide
// text, so that a job can neither drive the operator's terminal nor forge
// a line of delegate's. A job's output is not passed through here: it is
// written byte for byte.
func safe(s string) string {
	i := strings.IndexFunc(s, unsafeRune)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// unsafeRune: C0 and C1 controls, DEL, invalid UTF-8, and format
// characters (bidirectional overrides and isolates, zero-width ones).
func unsafeRune(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError || unicode.Is(unicode.Cf, r)
}
