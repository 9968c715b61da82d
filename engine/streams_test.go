package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// tagged renders pieces of output as "[stream]data", in order.
func tagged(outs []delegate.Output) string {
	var b strings.Builder
	for _, o := range outs {
		fmt.Fprintf(&b, "[%s]%s", o.Stream, o.Data)
	}
	return b.String()
}

func (f *fixture) tagged(id string) string {
	f.t.Helper()
	outs, err := f.store.ReadOutput(context.Background(), id, 0, 1<<20)
	if err != nil {
		f.t.Fatal(err)
	}
	return tagged(outs)
}

// TestOutputStreams: stdout and stderr are kept apart in the order they
// were written; a result has the end of each; the log has both
// interleaved, each piece with its stream, also read from its end.
func TestOutputStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, engine.Config{})
	job := f.submit(script("x"))
	p := f.started()
	p.Write([]byte("out1\n"))
	p.WriteStderr([]byte("err1\n"))
	p.Write([]byte("out2\n"))
	p.Finish(sandbox.Exit{Code: 1})
	f.wait(f.eng, job.ID)
	if got := f.tagged(job.ID); got != "[stdout]out1\n[stderr]err1\n[stdout]out2\n" {
		t.Fatalf("stored %q", got)
	}
	r, err := f.eng.Result(ctx, job.ID, delegate.ResultOptions{})
	if err != nil || string(r.Output) != "out1\nout2\n" || string(r.Stderr) != "err1\n" || r.OutputOffset != 0 || r.StderrOffset != 0 ||
		r.OutputBytes != 15 || r.OutputTruncated || *r.ExitCode != 1 {
		t.Fatalf("result %+v (output %q, stderr %q), %v", r, r.Output, r.Stderr, err)
	}
	r, _ = f.eng.Result(ctx, job.ID, delegate.ResultOptions{OutputTail: 3})
	if string(r.Output) != "t2\n" || r.OutputOffset != 7 || string(r.Stderr) != "r1\n" || r.StderrOffset != 2 {
		t.Fatalf("tails of 3: %q at %d, %q at %d", r.Output, r.OutputOffset, r.Stderr, r.StderrOffset)
	}
	l, err := f.eng.Logs(ctx, job.ID, delegate.LogOptions{})
	if err != nil || string(l.Output) != "out1\nerr1\nout2\n" || tagged(l.Streams) != f.tagged(job.ID) || !l.Done || l.Offset != 0 {
		t.Fatalf("log %q %q done %v, %v", l.Output, tagged(l.Streams), l.Done, err)
	}
	l, err = f.eng.Logs(ctx, job.ID, delegate.LogOptions{Tail: true, MaxBytes: 7, Cursor: "ignored"})
	if err != nil || tagged(l.Streams) != "[stderr]1\n[stdout]out2\n" || l.Offset != 8 || l.NextCursor != "15" || !l.Done {
		t.Fatalf("tail of the log: %q at %d next %s, %v", tagged(l.Streams), l.Offset, l.NextCursor, err)
	}
}

// TestSecretRedactionPerStream: a secret split by the other stream's
// output is caught in its own stream, and the other stream's output is
// not held up behind what might be a secret.
func TestSecretRedactionPerStream(t *testing.T) {
	const secret = "tok-3f9a8b7c6d5e"
	t.Setenv("DELEGATE_SECRET_API_TOKEN", secret)
	f := newFixture(t, engine.Config{})
	m := script("x")
	m.Secrets = []string{"API_TOKEN"}
	m.StatusMode = delegate.StatusModeStreaming
	job := f.submit(m)
	p := f.started()
	p.Write([]byte("token tok-3f9a"))
	p.WriteStderr([]byte("noise\n"))
	eventually(t, "stderr stored while stdout holds a possible secret", func() bool {
		return f.tagged(job.ID) == "[stdout]token [stderr]noise\n"
	})
	p.Write([]byte("8b7c6d5e and " + secret[:5]))
	p.WriteStderr([]byte(secret[5:] + "\n")) // not a secret in either stream
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, job.ID)
	want := "[stdout]token [stderr]noise\n[stdout][REDACTED] and [stderr]" + secret[5:] + "\n[stdout]" + secret[:5]
	if got := f.tagged(job.ID); got != want {
		t.Fatalf("stored %q\nwant   %q", got, want)
	}
}

// TestOutputLimitBothStreams: the limit counts both streams together.
func TestOutputLimitBothStreams(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{OutputLimit: 10})
	job := f.submit(script("x"))
	p := f.started()
	p.Write([]byte("123456"))
	p.WriteStderr([]byte("abcdef"))
	p.Write([]byte("789"))
	p.Finish(sandbox.Exit{})
	j := f.wait(f.eng, job.ID)
	if got := f.tagged(job.ID); got != "[stdout]123456[stderr]abcd" || j.OutputBytes != 15 || !j.OutputTruncated {
		t.Fatalf("kept %q, counted %d, truncated %v", got, j.OutputBytes, j.OutputTruncated)
	}
	r, _ := f.eng.Result(context.Background(), job.ID, delegate.ResultOptions{})
	if string(r.Output) != "123456" || string(r.Stderr) != "abcd" {
		t.Fatalf("result %q %q", r.Output, r.Stderr)
	}
}

// TestClaudeStreamJSONOnStdout: Claude's stream-json is read from stdout
// only: what it says on stderr, even in the middle of a line, is not
// mistaken for it.
func TestClaudeStreamJSONOnStdout(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	job := f.submit(delegate.Manifest{AgentType: delegate.AgentClaude, Task: "fix it"})
	p := f.started()
	p.Write([]byte(`{"type":"result","subtype":"success","is_er`))
	p.WriteStderr([]byte("warning: something\n"))
	p.Write([]byte(`ror":false,"result":"Fixed."}` + "\n"))
	p.Finish(sandbox.Exit{})
	if j := f.wait(f.eng, job.ID); j.Result != "Fixed." {
		t.Fatalf("result %q", j.Result)
	}
}

// TestRecoveryKeepsStreams: an engine that re-attaches to a running job
// reads on where the last one stopped, in both streams, and a possible
// secret held at the end of the output when it stopped is read again,
// not lost.
func TestRecoveryKeepsStreams(t *testing.T) {
	const secret = "tok-3f9a8b7c6d5e"
	t.Setenv("DELEGATE_SECRET_API_TOKEN", secret)
	ctx := context.Background()
	f := newFixture(t, engine.Config{OwnerAlive: func(string) bool { return false }})
	m := script("long")
	m.Secrets = []string{"API_TOKEN"}
	job := f.submit(m)
	p := f.started()
	p.Write([]byte("before\n"))
	p.WriteStderr([]byte("err " + secret[:4]))
	// Read up to what is held: "before\nerr " (11 bytes).
	eventually(t, "the output read", func() bool {
		j, _ := f.eng.Get(ctx, job.ID)
		return j.Status == delegate.StatusRunning && j.OutputRead == 11
	})
	f.eng.Close()
	eng2 := f.start(f.backend)
	p.WriteStderr([]byte(secret[4:] + "\n"))
	p.Write([]byte("after\n"))
	p.Finish(sandbox.Exit{})
	f.wait(eng2, job.ID)
	if got, want := f.tagged(job.ID), "[stdout]before\n[stderr]err [REDACTED]\n[stdout]after\n"; got != want {
		t.Fatalf("stored %q, want %q", got, want)
	}
}
