//go:build linux

package local

import (
	"context"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// TestStatusChannel: a job with no network reports through the status
// file in one line of shell; the lines come back through ReadEvents, and
// the channel is capped.
func TestStatusChannel(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	p := start(t, sb, "/bin/sh", "-c", `echo "step 1" > `+StatusFile+`; echo '{"progress":"step 2","percent":50}' > `+StatusFile+`
		ls -l `+StatusFile+` | cut -c1; echo done`)
	exit, out := finish(t, p)
	if exit.Code != 0 || out != "p\ndone\n" {
		t.Fatalf("exit %+v output %q", exit, out)
	}
	ev, err := p.ReadEvents(context.Background(), 0, 1<<20)
	if err != nil || string(ev) != "step 1\n{\"progress\":\"step 2\",\"percent\":50}\n" {
		t.Fatalf("events %q %v", ev, err)
	}
	if rest, _ := p.ReadEvents(context.Background(), int64(len(ev)), 100); len(rest) != 0 {
		t.Fatalf("events after the end: %q", rest)
	}

	// A flood is capped, and does not block or break the job: the events
	// file keeps the first whole lines up to its cap, and past it the
	// latest line is kept, with how many lines came after the cap.
	sb = create(t, b, defaultSpec())
	p = start(t, sb, "/bin/sh", "-c", `yes flood | head -n 300000 > `+StatusFile+`; echo "the end" > `+StatusFile+`; echo ok`)
	exit, out = finish(t, p)
	if exit.Code != 0 || out != "ok\n" {
		t.Fatalf("flood: exit %+v output %q", exit, out)
	}
	ev, _ = p.ReadEvents(context.Background(), 0, 4<<20)
	kept := maxEventsBytes / len("flood\n")
	if len(ev) != kept*len("flood\n") || strings.ReplaceAll(string(ev), "flood\n", "") != "" {
		t.Fatalf("flood kept %d bytes (want %d whole lines)", len(ev), kept)
	}
	le, ok := p.(sandbox.LatestEvent)
	if !ok {
		t.Fatal("the local process does not keep the latest line")
	}
	line, count, err := le.LatestEvent(context.Background())
	if err != nil || line != "the end" || count != int64(300000-kept+1) {
		t.Fatalf("latest line %q, %d lines past the cap (want %d), %v", line, count, 300000-kept+1, err)
	}

	// A "line" without end is cut, not kept whole.
	sb = create(t, b, defaultSpec())
	p = start(t, sb, "/bin/sh", "-c", `head -c 3000000 /dev/zero | tr '\0' x > `+StatusFile+`; echo ok`)
	exit, out = finish(t, p)
	if exit.Code != 0 || out != "ok\n" {
		t.Fatalf("long line: exit %+v output %q", exit, out)
	}
	ev, _ = p.ReadEvents(context.Background(), 0, 4<<20)
	if len(ev) != maxStatusLine || strings.Trim(string(ev), "x") != "" {
		t.Fatalf("a 3 MB line kept as %d bytes", len(ev))
	}
	if caps := b.Capabilities(); caps.StatusFile != StatusFile || !caps.Supervised {
		t.Fatalf("capabilities %+v", caps)
	}
}
