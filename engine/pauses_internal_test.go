package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// TestHeartbeatNotCountedWhileAway: time the server itself did not run
// (here: its heartbeat checker did not tick for longer than the threshold,
// as under SIGSTOP) is not counted against a silent job: the first tick
// after it judges nothing, the next ones count only the silence outside
// it; a job silent for the threshold outside it still fails.
func TestHeartbeatNotCountedWhileAway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := testkit.OpenStore(t)
	backend := sandboxtest.NewFake()
	backend.Caps.Supervised = false // its only signs of life: status lines
	const threshold = time.Second
	e := New(store, backend, Config{HeartbeatThreshold: threshold, PollInterval: 20 * time.Millisecond,
		Defaults: delegate.Defaults{Timeout: 60, CPU: 1, Memory: "64M", Disk: "16M"}, ArtifactDir: t.TempDir()})
	t.Cleanup(func() { e.Close() })
	m := e.maint // not started: this test is the checker's only caller
	// The test plays the clocks: the boot clock (which counts while the
	// server is stopped) and the wall clock, both moved by hand, so that
	// the server's time away and the job's silence take no real time.
	var boot, ahead time.Duration
	m.away.boot = func() time.Duration { return time.Hour + boot }
	wall := func() time.Time { return time.Now().Add(ahead) }
	pass := func(d time.Duration) { boot += d; ahead += d }
	check := func() { m.judgeHeartbeats(ctx, wall(), wall) }
	m.away.tick(wall(), 0)

	j, err := e.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := <-backend.Started
	defer p.Finish(sandbox.Exit{})
	status := func() *delegate.Job {
		t.Helper()
		got, err := e.Get(ctx, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	testkit.Eventually(t, 10*time.Second, "the job running", func() bool { return status().Status == delegate.StatusRunning })

	// The server is away for more than the threshold.
	pass(threshold + time.Second)
	check()
	if got := status(); got.Status != delegate.StatusRunning {
		t.Fatalf("the first check after the server was away: %s (%s)", got.Status, got.Error)
	}
	check()
	if got := status(); got.Status != delegate.StatusRunning {
		t.Fatalf("a check right after: %s (%s); the silence while away was counted", got.Status, got.Error)
	}
	// Silent with the server there, tick after tick: it fails once the
	// silence outside the time away reaches the threshold, not before.
	ticks := 0
	for status().Status == delegate.StatusRunning && ticks < 100 {
		pass(m.heartbeatEvery())
		check()
		ticks++
	}
	if got := status(); got.Status != delegate.StatusFailed || !strings.Contains(got.Error, "lost heartbeat") {
		t.Errorf("silent with the server running: %s (%s), want failed, lost heartbeat", got.Status, got.Error)
	}
	// The time away counted is the gap less the checker's own period,
	// which the silence then includes: one period more than the ticks.
	if silent := time.Duration(ticks+1) * m.heartbeatEvery(); silent < threshold || silent > threshold+m.heartbeatEvery() {
		t.Errorf("failed after %s of silence outside the time away, want the threshold %s (within a tick)", silent, threshold)
	}
}
