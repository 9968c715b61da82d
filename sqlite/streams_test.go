package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
)

// stdout is a chunk of output all from stdout.
func stdout(s string) []delegate.Output {
	return []delegate.Output{{Stream: delegate.StreamStdout, Data: []byte(s)}}
}

// tagged and pieces are the internal tests' (export_test.go).
var tagged, pieces = sqlite.Tagged, sqlite.Pieces

// TestOutputStreams: chunks mixing both streams are read back in order,
// each byte with its stream, from any offset; each stream's tail skips
// the other's.
func TestOutputStreams(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "jobs.db"))
	if err := s.CreateJob(ctx, newJob("j")); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]delegate.Output{pieces("out1\n", "E:err1\n"), pieces("E:err2\n"), pieces("out2\n"), pieces("o", "E:e", "o")} {
		if err := s.AppendOutput(ctx, "j", c, 0); err != nil {
			t.Fatal(err)
		}
	}
	all := "[stdout]out1\n[stderr]err1\nerr2\n[stdout]out2\no[stderr]e[stdout]o" // 23 bytes
	for _, c := range []struct {
		off  int64
		max  int
		want string
	}{
		{0, 100, all},
		{2, 6, "[stdout]t1\n[stderr]err"},
		{5, 6, "[stderr]err1\ne"},
		{17, 10, "[stdout]t2\no[stderr]e[stdout]o"},
		{22, 3, "[stdout]o"},
		{23, 3, ""},
	} {
		got, err := s.ReadOutput(ctx, "j", c.off, c.max)
		if err != nil || tagged(got) != c.want {
			t.Errorf("ReadOutput(%d, %d) = %q, %v; want %q", c.off, c.max, tagged(got), err, c.want)
		}
	}
	for _, c := range []struct {
		stream delegate.Stream
		max    int
		want   string
		kept   int64
	}{
		{delegate.StreamStdout, 100, "out1\nout2\noo", 12},
		{delegate.StreamStdout, 8, "\nout2\noo", 12}, // across rows
		{delegate.StreamStdout, 3, "\noo", 12},
		{delegate.StreamStderr, 100, "err1\nerr2\ne", 11},
		{delegate.StreamStderr, 7, "\nerr2\ne", 11},
		{delegate.StreamStderr, 0, "", 11},
	} {
		got, kept, err := s.StreamTail(ctx, "j", c.stream, c.max)
		if err != nil || string(got) != c.want || kept != c.kept {
			t.Errorf("StreamTail(%s, %d) = %q, %d, %v; want %q, %d", c.stream, c.max, got, kept, err, c.want, c.kept)
		}
	}
	if _, _, err := s.StreamTail(ctx, "nope", delegate.StreamStderr, 10); err == nil {
		t.Error("tail of an unknown job")
	}
}
