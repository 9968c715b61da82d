package local

import (
	"context"
	"testing"
)

// TestPeekEnd: a process that only reads the jobs (no backend) reads how
// a command ended, as its shim recorded it, for the first command of a
// sandbox and for one of many; nothing for one still running, an unknown
// one, or names that are not one path element.
func TestPeekEnd(t *testing.T) {
	canRun(t)
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	p := start(t, sb, "/bin/sh", "-c", "echo hi; exit 7")
	exit, err := p.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, ok := PeekEnd(b.dir, sb.ID(), p.ID())
	if !ok || got.Code != 7 || got.OutputBytes != 3 || !got.EndedAt.Equal(exit.EndedAt) || got.EndedAt.IsZero() {
		t.Errorf("PeekEnd = %+v, %v; want what Wait said: %+v", got, ok, exit)
	}
	for _, tc := range [][2]string{{sb.ID(), "ex-none"}, {"sb-none", p.ID()}, {"..", p.ID()}, {sb.ID() + "/..", p.ID()}, {sb.ID(), "../x"}} {
		if e, ok := PeekEnd(b.dir, tc[0], tc[1]); ok {
			t.Errorf("PeekEnd(%q, %q) = %+v, want nothing", tc[0], tc[1], e)
		}
	}
}
