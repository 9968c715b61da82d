package workspace

import (
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"testing"
)

// TestTarFieldsAsBefore: octal, paxTime and inGit, written without
// allocating, give what their first forms (strconv, fmt, strings.Split)
// gave, for random values and the edges.
func TestTarFieldsAsBefore(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for i := range 20000 {
		width := []int{8, 12}[i%2]
		max := int64(1)<<(3*(width-1)) - 1
		v := []int64{0, 1, max, rng.Int63n(max + 1)}[i%4]
		want := make([]byte, width)
		s := strconv.FormatInt(v, 8)
		for j := range width - 1 {
			want[j] = '0'
		}
		copy(want[width-1-len(s):width-1], s)
		got := make([]byte, width)
		octal(got, v)
		if string(got) != string(want) {
			t.Fatalf("octal(%d) = %q, want %q", v, got, want)
		}
	}
	for i := range 20000 {
		ns := []int64{0, -1, 1, math.MinInt64, math.MaxInt64, -1e9, 1e9 - 1, rng.Int63() - rng.Int63()}[i%8]
		sec, frac := ns/1e9, ns%1e9
		if frac < 0 {
			sec--
			frac += 1e9
		}
		if got, want := paxTime(ns), fmt.Sprintf("%d.%09d", sec, frac); got != want {
			t.Fatalf("paxTime(%d) = %q, want %q", ns, got, want)
		}
	}
	split := func(p string) bool {
		for _, c := range strings.Split(p, "/") {
			if gitName(c) {
				return true
			}
		}
		return false
	}
	for _, p := range []string{"", "a", ".git", "a/.git", "a/.git/b", "A/.GIT.", "x//.git", ".git/", "/.git", "git~1/x", "g/i/t", ".gi\u200ct", "src/go.mod", "a/b/c"} {
		if inGit(p) != split(p) {
			t.Errorf("inGit(%q) = %v, want %v", p, inGit(p), split(p))
		}
	}
}
