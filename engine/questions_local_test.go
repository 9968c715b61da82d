//go:build linux

package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// askScript asks in one line of shell, with no network, and waits for the
// answer file.
const askScript = `echo '{"type":"question","id":"color","message":"Which colour?","requestedSchema":{"type":"object","properties":{"color":{"type":"string"}}}}' > "$DELEGATE_STATUS_FILE"
while [ ! -s "$DELEGATE_ANSWERS/color.json" ]; do sleep 0.05; done
cat "$DELEGATE_ANSWERS/color.json"`

// TestLocalQuestion: a job in a real local sandbox asks through its status
// channel and gets the answer as a file of its workspace, written from
// outside the sandbox by the engine.
func TestLocalQuestion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newLocal(t)
	eng := f.engine(t, f.backend(t))
	job, err := eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: askScript}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, eng, job.ID, delegate.StatusRunning)
	eventuallyWithin(t, 20*time.Second, "the question", func() bool {
		qs, err := eng.Questions(ctx, job.ID)
		return err == nil && len(qs) > 0
	})
	if _, err := eng.Answer(ctx, job.ID, "color", delegate.Answer{Action: delegate.AnswerAccept, Content: map[string]any{"color": "teal"}}); err != nil {
		t.Fatal(err)
	}
	j := waitEnd(t, eng, job.ID)
	res, err := eng.Result(ctx, job.ID, delegate.ResultOptions{})
	if err != nil || j.Status != delegate.StatusSuccess || !strings.HasPrefix(string(res.Output), `{"id":"color","action":"accept","content":{"color":"teal"},"answered_at":`) {
		t.Fatalf("job %s %q: output %q stderr %q %v", j.Status, j.Error, res.Output, res.Stderr, err)
	}
}
