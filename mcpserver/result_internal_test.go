package mcpserver

import (
	"strings"
	"testing"
)

// TestLineTail: a stream's end from a line's start, within the limit,
// and whether anything is left out. The tail is read a byte longer than
// the limit (the byte before tells whether what follows starts a line).
func TestLineTail(t *testing.T) {
	long := strings.Repeat("x", 20)
	tests := []struct {
		name   string
		b      string
		offset int64
		limit  int
		want   string
		cut    bool
	}{
		{"all of it", "a\nb\n", 0, 10, "a\nb\n", false},
		{"all of it, exactly the limit", "abc\n", 0, 4, "abc\n", false},
		{"cut inside a line: from the next", "aaa\nbbb\ncc\n", 5, 10, "bbb\ncc\n", true},
		{"cut at a line's start: all of it", "\nbbb\ncc\n", 9, 7, "bbb\ncc\n", true},
		{"only the limit's bytes", "0123456789\nab\ncd\n", 0, 6, "ab\ncd\n", true},
		{"one long line: its end", long + "\n", 100, 5, "xxxx\n", true},
		{"one long line without a newline", long, 100, 5, "xxxxx", true},
		{"a character not cut in two", "é" + strings.Repeat("é", 4), 100, 5, "éé", true},
		{"kept short of what was written", "ok\n", 7, 10, "ok\n", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, cut := lineTail([]byte(tc.b), tc.offset, tc.limit)
			if string(got) != tc.want || cut != tc.cut {
				t.Errorf("lineTail(%q, %d, %d) = %q, %v; want %q, %v", tc.b, tc.offset, tc.limit, got, cut, tc.want, tc.cut)
			}
		})
	}
}
