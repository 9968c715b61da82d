package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// deadlineGrace is how much later than the engine's own timeout the
// backend's backstop deadline fires, so that a watched job always ends by
// the engine's timer.
const deadlineGrace = 5 * time.Second

// basePath is the PATH every job starts with.
const basePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// command builds the argv and environment for a job. The task and every
// other untrusted string travel as whole argv elements or environment
// values: nothing is spliced into a shell line.
func (r *runner) command(job *delegate.Job, token string) (sandbox.Command, error) {
	m := job.Manifest
	var args []string
	switch m.AgentType {
	case delegate.AgentScript:
		script := m.Task
		if m.Agent != nil && m.Agent.Command != "" {
			script = m.Agent.Command
		}
		args = []string{"/bin/sh", "-c", script}
	case delegate.AgentCustom:
		// The command is the submitter's own code; the task reaches it as
		// data in $DELEGATE_TASK.
		args = []string{"/bin/sh", "-c", m.Agent.Command}
	case delegate.AgentClaude:
		args = ClaudeArgs(m)
	default:
		return sandbox.Command{}, fmt.Errorf("agentType %q: %w", m.AgentType, delegate.ErrInvalid)
	}
	env := map[string]string{
		"PATH":    basePath,
		"HOME":    delegate.Workspace,
		"TMPDIR":  "/tmp",
		"LANG":    "C.UTF-8",
		"TERM":    "dumb",
		"USER":    "sandbox",
		"LOGNAME": "sandbox",
	}
	for k, v := range m.Env {
		env[k] = v
	}
	for _, name := range m.Secrets {
		v, ok := r.cfg.Secret(name)
		if !ok {
			return sandbox.Command{}, fmt.Errorf("secret %q is no longer set on the server", name)
		}
		env[name] = v
	}
	env["DELEGATE_JOB_ID"] = job.ID
	env["DELEGATE_TASK"] = m.Task
	env["DELEGATE_JOB_TOKEN"] = token
	if r.cfg.CallbackURL != "" {
		env["DELEGATE_CALLBACK_URL"] = strings.TrimSuffix(r.cfg.CallbackURL, "/") + "/callback/" + job.ID
	}
	if f := r.backend().Capabilities().StatusFile; f != "" {
		env["DELEGATE_STATUS_FILE"] = f
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	list := make([]string, 0, len(keys))
	for _, k := range keys {
		list = append(list, k+"="+env[k])
	}
	return sandbox.Command{
		Args: args, Env: list, Dir: delegate.Workspace, OutputLimit: r.cfg.OutputLimit,
		Deadline: time.Now().Add(time.Duration(m.TimeoutSeconds())*time.Second + deadlineGrace),
	}, nil
}

// ClaudeArgs is the Claude CLI command line for a job: the task is one
// argument, never parsed by a shell. stream-json with -p needs --verbose;
// permissions are skipped because the sandbox is the boundary.
func ClaudeArgs(m delegate.Manifest) []string {
	args := []string{"claude", "-p", m.Task, "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions"}
	if m.Agent != nil && m.Agent.ClaudeModel != "" {
		args = append(args, "--model", m.Agent.ClaudeModel)
	}
	return args
}
