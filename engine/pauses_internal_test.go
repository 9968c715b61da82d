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
	m.away.tick(time.Now(), 0)

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
	time.Sleep(threshold + time.Second)
	m.checkHeartbeats(ctx)
	if got := status(); got.Status != delegate.StatusRunning {
		t.Fatalf("the first check after the server was away: %s (%s)", got.Status, got.Error)
	}
	m.checkHeartbeats(ctx)
	if got := status(); got.Status != delegate.StatusRunning {
		t.Fatalf("a check right after: %s (%s); the silence while away was counted", got.Status, got.Error)
	}
	// Silent with the server there: it fails.
	deadline := time.Now().Add(30 * time.Second)
	for status().Status == delegate.StatusRunning && time.Now().Before(deadline) {
		time.Sleep(m.heartbeatEvery()) // the checker's tick, which this test plays: time passing is what it tests
		m.checkHeartbeats(ctx)
	}
	if got := status(); got.Status != delegate.StatusFailed || !strings.Contains(got.Error, "lost heartbeat") {
		t.Errorf("silent with the server running: %s (%s), want failed, lost heartbeat", got.Status, got.Error)
	}
}
