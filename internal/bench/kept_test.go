package bench

import (
	"errors"
	"strings"
	"testing"
)

// TestAlternate: each kind is timed n times, in blocks that alternate,
// each block led by an untimed run; an error stops it.
func TestAlternate(t *testing.T) {
	for _, n := range []int{1, blockRuns, blockRuns + 1, 12} {
		var calls strings.Builder
		ra, rb, err := alternate(n,
			func() error { calls.WriteByte('a'); return nil },
			func() error { calls.WriteByte('b'); return nil })
		if err != nil {
			t.Fatal(err)
		}
		if len(ra.times) != n || len(rb.times) != n {
			t.Errorf("n=%d: timed %d and %d runs", n, len(ra.times), len(rb.times))
		}
		// The order: per round, one untimed and up to blockRuns timed runs
		// of a, then of b.
		var want strings.Builder
		for left := n; left > 0; left -= blockRuns {
			k := min(left, blockRuns)
			want.WriteString(strings.Repeat("a", k+1) + strings.Repeat("b", k+1))
		}
		if calls.String() != want.String() {
			t.Errorf("n=%d: calls %s, want %s", n, calls.String(), want.String())
		}
	}
	boom := errors.New("boom")
	calls := 0
	if _, _, err := alternate(10, func() error { return nil }, func() error {
		if calls++; calls == 3 {
			return boom
		}
		return nil
	}); !errors.Is(err, boom) {
		t.Errorf("err = %v, want boom", err)
	}
}
