package main

import (
	"strings"
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
			rc := run(strings.NewReader(tc.in), &out, now)
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
