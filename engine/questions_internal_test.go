package engine

import (
	"slices"
	"strings"
	"testing"
)

// TestQuestionScanner: the question lines of a stream of status lines are
// found however the stream is cut into reads, among floods of other
// lines, and a last line without its newline is found at the end.
func TestQuestionScanner(t *testing.T) {
	t.Parallel()
	q1 := `{"type":"question","id":"a","message":"A?"}`
	q2 := `  {"type": "question", "id":"b","message":"B?"}`
	noise := strings.Repeat("step\n", 1000)
	stream := noise + q1 + "\n" + `plain text naming "question" is no question` + "\n" + noise + q2
	want := []string{q1, q2}
	for _, size := range []int{1, 7, 64, 4096, len(stream)} {
		var s questionScanner
		var got []string
		for off := 0; off < len(stream); off += size {
			s.scan([]byte(stream[off:min(off+size, len(stream))]), false, func(line []byte) { got = append(got, string(line)) })
		}
		s.scan(nil, true, func(line []byte) { got = append(got, string(line)) })
		if !slices.Equal(got, want) {
			t.Errorf("reads of %d bytes: found %q, want %q", size, got, want)
		}
	}
}
