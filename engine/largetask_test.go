package engine_test

import (
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestLargeTaskInput: a task too large for one environment string (Linux
// refuses more than 128 KiB in one: no process could start with it) is
// not in $DELEGATE_TASK but the input file "task"; a smaller one is in
// $DELEGATE_TASK only.
func TestLargeTaskInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	for _, size := range []int{128<<10 - len("DELEGATE_TASK=") - 1, 128<<10 - len("DELEGATE_TASK="), delegate.MaxTaskBytes} {
		task := strings.Repeat("x", size)
		job := f.submit(delegate.Manifest{AgentType: delegate.AgentCustom, Task: task, Agent: &delegate.AgentConfig{Command: "./run"}})
		p := f.started()
		inEnv := false
		for _, kv := range p.Cmd.Env {
			if v, ok := strings.CutPrefix(kv, "DELEGATE_TASK="); ok {
				inEnv = v == task
			}
		}
		fits := size < 128<<10-len("DELEGATE_TASK=")
		if inEnv != fits || (string(p.Cmd.Inputs["task"]) == task) == fits {
			t.Errorf("a task of %d bytes: in the env %v, input %d bytes", size, inEnv, len(p.Cmd.Inputs["task"]))
		}
		p.Finish(sandbox.Exit{})
		f.wait(f.eng, job.ID)
	}
}
