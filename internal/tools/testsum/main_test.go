package main

import (
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	clock := time.Unix(0, 0)
	now := func() time.Time { clock = clock.Add(time.Second); return clock }
	tests := []struct {
		name, in string
		want     []string
		rc       int
	}{
		{"all pass", `{"Action":"run","Package":"a","Test":"T1"}
{"Action":"output","Package":"a","Test":"T1","Output":"noise\n"}
{"Action":"pass","Package":"a","Test":"T1","Elapsed":0.1}
{"Action":"skip","Package":"a","Test":"T2"}
{"Action":"pass","Package":"a","Elapsed":0.5}
{"Action":"pass","Package":"b","Elapsed":0}
`, []string{"ok   a", "1 passed, 0 failed, 1 skipped", "1 tests passed, 0 failed, 1 skipped; 1 packages ok, 0 failed"}, 0},
		{"a failure shows its output", `{"Action":"output","Package":"a","Test":"T1","Output":"    x_test.go:9: boom\n"}
{"Action":"fail","Package":"a","Test":"T1","Elapsed":0.2}
{"Action":"fail","Package":"a","Elapsed":0.3}
`, []string{"--- FAIL a T1", "x_test.go:9: boom", "FAIL a", "0 tests passed, 1 failed"}, 1},
		{"a build failure", `# a
a.go:1: syntax error
{"Action":"output","Package":"a","Output":"FAIL\ta [build failed]\n"}
{"Action":"fail","Package":"a","Elapsed":0}
`, []string{"a.go:1: syntax error", "FAIL a", "1 failed"}, 1},
		{"cut off", `{"Action":"run","Package":"a","Test":"T1"}
`, []string{"FAIL a: did not finish"}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			rc := run(strings.NewReader(tc.in), &out, now, nil)
			if rc != tc.rc {
				t.Errorf("rc %d, want %d", rc, tc.rc)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// TestProgress: a run quiet for 30 s prints what is running and how many
// tests passed so far; one that printed a line since does not.
func TestProgress(t *testing.T) {
	var clock atomic.Int64 // seconds
	now := func() time.Time { return time.Unix(clock.Load(), 0) }
	r, w := io.Pipe()
	tick := make(chan time.Time)
	var out syncBuilder
	done := make(chan int)
	go func() { done <- run(r, &out, now, tick) }()
	io.WriteString(w, `{"Action":"run","Package":"a","Test":"T1"}
{"Action":"pass","Package":"a","Test":"T1","Elapsed":0.1}
{"Action":"run","Package":"a","Test":"TSlow"}
{"Action":"run","Package":"b","Test":"T9"}
`)
	tick <- time.Time{} // not quiet yet: nothing printed
	if s := out.String(); s != "" {
		t.Fatalf("printed before 30 s of quiet: %q", s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "running: a (TSlow), b (T9); 1 tests passed so far") {
		if time.Now().After(deadline) {
			t.Fatalf("no progress line after quiet: %q", out.String())
		}
		clock.Add(31) // each round is a quiet half-minute (the lines may not all be read yet)
		tick <- time.Time{}
	}
	io.WriteString(w, `{"Action":"pass","Package":"a","Test":"TSlow","Elapsed":40}
{"Action":"pass","Package":"a","Elapsed":41}
{"Action":"pass","Package":"b","Test":"T9","Elapsed":40}
{"Action":"pass","Package":"b","Elapsed":41}
`)
	w.Close()
	if rc := <-done; rc != 0 {
		t.Errorf("rc %d:\n%s", rc, out.String())
	}
	if !strings.Contains(out.String(), "3 tests passed, 0 failed") {
		t.Errorf("totals wrong:\n%s", out.String())
	}
}

// syncBuilder is a strings.Builder safe to read while run writes it.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
