package proxmox

import (
	"fmt"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

func render(outs []sandbox.Output) string {
	var b strings.Builder
	for _, o := range outs {
		fmt.Fprintf(&b, "[%s]%s", o.Stream, o.Data)
	}
	return b.String()
}

// TestStreamRecs: records read in pieces (a line cut in two) split the
// output by stream; with the records not all read, the output is cut
// where the last known one starts; records behind the reads are dropped,
// and a read from before them is noticed.
func TestStreamRecs(t *testing.T) {
	t.Parallel()
	data := "out\nerr\nmore out" // stdout 0-3, stderr 4-7, stdout 8-15
	var r streamRecs
	if err := r.add([]byte("0 1\n4 2\n8")); err != nil {
		t.Fatal(err)
	}
	if r.read != 8 || len(r.recs) != 2 {
		t.Fatalf("read %d, %d records", r.read, len(r.recs))
	}
	// Not all records known: cut where the last one known starts.
	if got := render(r.split(0, []byte(data), false)); got != "[stdout]out\n" {
		t.Errorf("incomplete records: %q", got)
	}
	if err := r.add([]byte(" 1\n")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off  int
		want string
	}{
		{0, "[stdout]out\n[stderr]err\n[stdout]more out"},
		{2, "[stdout]t\n[stderr]err\n[stdout]more out"},
		{5, "[stderr]rr\n[stdout]more out"},
		{9, "[stdout]ore out"},
	} {
		if got := render(r.split(int64(c.off), []byte(data[c.off:]), true)); got != c.want {
			t.Errorf("split from %d: %q, want %q", c.off, got, c.want)
		}
	}
	// Reads have moved to 9: the records before the one covering it are
	// gone, and from says so.
	if len(r.recs) != 1 || r.from != 8 {
		t.Errorf("after reads at 9: %+v", r)
	}
	for _, bad := range []string{"x 1\n", "3 3\n", "-1 1\n", "2 1\n"} {
		r := streamRecs{recs: []streamRec{{5, sandbox.Stdout}}}
		if err := r.add([]byte(bad)); err == nil {
			t.Errorf("record %q taken", bad)
		}
	}
}
