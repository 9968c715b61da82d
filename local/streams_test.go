//go:build linux

package local

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// writeStreams writes pieces as a shim does: the bytes to the output, a
// record at each change of stream. It returns the output.
func writeStreams(t *testing.T, dir string, pieces []sandbox.Output) []byte {
	t.Helper()
	var out, recs []byte
	cur := sandbox.Combined
	for _, p := range pieces {
		if p.Stream != cur {
			r := encodeStreamRecord(int64(len(out)), p.Stream)
			recs = append(recs, r[:]...)
			cur = p.Stream
		}
		out = append(out, p.Data...)
	}
	if err := os.WriteFile(filepath.Join(dir, fileStreams), recs, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSplitStreams: any part of the output is cut into the pieces of its
// streams, also with more records than one read of the file holds; a
// record being written is not seen; without the file it is Combined.
func TestSplitStreams(t *testing.T) {
	dir := t.TempDir()
	var pieces []sandbox.Output
	for i := range 1500 { // 1500 records: three reads of 512
		s := sandbox.Stdout
		if i%2 == 1 {
			s = sandbox.Stderr
		}
		pieces = append(pieces, sandbox.Output{Stream: s, Data: []byte(strings.Repeat(string(rune('a'+i%26)), 1+i%3))})
	}
	out := writeStreams(t, dir, pieces)
	path := filepath.Join(dir, fileStreams)
	for _, c := range [][2]int{{0, len(out)}, {1, 7}, {2999, 5}, {len(out) - 1, 1}, {100, 1000}} {
		off, n := c[0], min(c[1], len(out)-c[0])
		got, err := splitStreams(path, int64(off), out[off:off+n])
		if err != nil {
			t.Fatal(err)
		}
		// The same bytes, each with its stream.
		var want []sandbox.Output
		pos := 0
		for _, p := range pieces {
			from, to := max(pos, off), min(pos+len(p.Data), off+n)
			if from < to {
				want = sandbox.Append(want, p.Stream, p.Data[from-pos:to-pos])
			}
			pos += len(p.Data)
		}
		if tagged(got) != tagged(want) {
			t.Errorf("split(%d, %d) = %.200q…, want %.200q…", off, n, tagged(got), tagged(want))
		}
	}
	// Half a record (being written) is not read.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	rec := encodeStreamRecord(int64(len(out)), sandbox.Stdout)
	f.Write(rec[:3])
	f.Close()
	if got, err := splitStreams(path, int64(len(out)-2), out[len(out)-2:]); err != nil || len(got) != 1 || got[0].Stream != pieces[len(pieces)-1].Stream {
		t.Errorf("with half a record: %q, %v", tagged(got), err)
	}
	// No record file: a shim from before the streams were told apart.
	got, err := splitStreams(filepath.Join(dir, "none"), 5, []byte("both"))
	if err != nil || len(got) != 1 || got[0].Stream != sandbox.Combined || !bytes.Equal(got[0].Data, []byte("both")) {
		t.Errorf("without records: %q, %v", tagged(got), err)
	}
}

func TestStreamRecord(t *testing.T) {
	for _, c := range []struct {
		off int64
		s   sandbox.Stream
	}{{0, sandbox.Stdout}, {1, sandbox.Stderr}, {1<<40 + 3, sandbox.Stderr}} {
		r := encodeStreamRecord(c.off, c.s)
		if off, s := decodeStreamRecord(r[:]); off != c.off || s != c.s {
			t.Errorf("record of %d %s reads %d %s", c.off, c.s, off, s)
		}
	}
}
