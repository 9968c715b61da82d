package engine

import (
	"strings"
	"testing"
)

func TestRedactorStream(t *testing.T) {
	t.Parallel()
	secret := "hunter2-very-secret"
	r := newRedactor([]string{secret, "ab", "hunter2"})
	text := "start " + secret + " middle hunter2 and " + secret + secret + " end ab"
	// Feed the text in every chunk size, as output arrives in pieces.
	for size := 1; size <= len(text); size++ {
		var out strings.Builder
		pending := []byte{}
		for i := 0; i < len(text); i += size {
			pending = append(pending, text[i:min(len(text), i+size)]...)
			emitted, used := r.stream(pending, false)
			out.Write(emitted)
			pending = pending[used:]
		}
		emitted, _ := r.stream(pending, true)
		out.Write(emitted)
		got := out.String()
		want := "start [REDACTED] middle [REDACTED] and [REDACTED][REDACTED] end ab"
		if got != want {
			t.Fatalf("chunk size %d: %q", size, got)
		}
	}
	if newRedactor(nil).active() || newRedactor([]string{"abc"}).active() {
		t.Fatal("short or no secrets should not redact")
	}
}
