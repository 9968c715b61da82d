package sqlite

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
)

// tagged renders pieces of output as "[stream]data", in order.
func tagged(outs []delegate.Output) string {
	var b strings.Builder
	for _, o := range outs {
		fmt.Fprintf(&b, "[%s]%s", o.Stream, o.Data)
	}
	return b.String()
}

// pieces makes output pieces, stdout unless a piece starts with "E:".
func pieces(spec ...string) []delegate.Output {
	var outs []delegate.Output
	for _, p := range spec {
		s := delegate.StreamStdout
		if d, ok := strings.CutPrefix(p, "E:"); ok {
			s, p = delegate.StreamStderr, d
		}
		outs = append(outs, delegate.Output{Stream: s, Data: []byte(p)})
	}
	return outs
}

func TestChunkEncoding(t *testing.T) {
	for _, chunk := range [][]delegate.Output{
		pieces("out"),
		pieces("E:err"),
		pieces("a", "E:b", "", "c", "c", "E:"+strings.Repeat("x", 300)),
		{{Stream: delegate.StreamCombined, Data: []byte("old")}},
	} {
		data, stream, runs, stderr := encodeChunk(chunk)
		got, err := decodeChunk(data, stream, runs)
		var want []delegate.Output
		var wantErr int64
		for _, o := range chunk {
			want = delegate.AppendOutput(want, o.Stream, o.Data)
			if o.Stream == delegate.StreamStderr {
				wantErr += int64(len(o.Data))
			}
		}
		if err != nil || tagged(got) != tagged(want) || stderr != wantErr || (runs != nil) != (len(want) > 1) {
			t.Errorf("%q: decoded %q (stream %d, runs %x, stderr %d), %v", tagged(chunk), tagged(got), stream, runs, stderr, err)
		}
	}
	for _, bad := range []struct {
		data, runs string
	}{{"abc", "\x09"}, {"abc", "\x05\x05"}, {"abc", "\xff"}, {"abc", "\x0f"}} {
		if _, err := decodeChunk([]byte(bad.data), streamBoth, []byte(bad.runs)); err == nil {
			t.Errorf("runs %x for %q decoded", bad.runs, bad.data)
		}
	}
}

// TestMigrateOutputStreams: output kept by schema 3 (one stream, not told
// apart) reads as it did, as StreamCombined, and counts as stdout in the
// tails; output appended after the migration has its streams; the tail of
// stderr is read through its index.
func TestMigrateOutputStreams(t *testing.T) {
	ctx := context.Background()
	s, _ := openMigrated(t, 3, `
		INSERT INTO jobs (seq, id, status, created_at, updated_at) VALUES (1, 'old', 'running', 1, 1);
		INSERT INTO job_manifests (seq, manifest) VALUES (1, '{"agentType":"script","task":"x"}');
		INSERT INTO job_output (job_id, offset, data) VALUES ('old', 0, CAST('both ' AS BLOB)), ('old', 5, CAST('together' AS BLOB));`)
	got, err := s.ReadOutput(ctx, "old", 0, 100)
	if err != nil || tagged(got) != "[combined]both together" {
		t.Fatalf("old output: %q, %v", tagged(got), err)
	}
	if tail, kept, err := s.StreamTail(ctx, "old", delegate.StreamStdout, 6); err != nil || string(tail) != "gether" || kept != 13 {
		t.Errorf("stdout tail of old output: %q %d %v", tail, kept, err)
	}
	if tail, kept, err := s.StreamTail(ctx, "old", delegate.StreamStderr, 6); err != nil || len(tail) != 0 || kept != 0 {
		t.Errorf("stderr tail of old output: %q %d %v", tail, kept, err)
	}
	if err := s.AppendOutput(ctx, "old", pieces("\nout", "E:err"), 0); err != nil {
		t.Fatal(err)
	}
	got, err = s.ReadOutput(ctx, "old", 9, 100)
	if err != nil || tagged(got) != "[combined]ther[stdout]\nout[stderr]err" {
		t.Errorf("old and new output: %q, %v", tagged(got), err)
	}
	if tail, kept, err := s.StreamTail(ctx, "old", delegate.StreamStdout, 100); err != nil || string(tail) != "both together\nout" || kept != 17 {
		t.Errorf("stdout tail: %q %d %v", tail, kept, err)
	}
	var plan strings.Builder
	rows, err := s.rdb.Query(`EXPLAIN QUERY PLAN SELECT data, stream, runs FROM job_output WHERE job_id = ? AND stream >= 2 ORDER BY offset DESC`, "old")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, parent, unused int
		var detail string
		rows.Scan(&id, &parent, &unused, &detail)
		plan.WriteString(detail + "; ")
	}
	rows.Close()
	if !strings.Contains(plan.String(), "job_output_stderr") || strings.Contains(plan.String(), "TEMP B-TREE") {
		t.Errorf("the stderr tail is not read through its index: %s", plan.String())
	}
}
