package engine

import (
	"fmt"
	"path"
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

// basePath is the PATH every job starts with (a backend may add the
// tools its sandboxes have).
const basePath = sandbox.DefaultPath

// maxEnvString is the most bytes one environment string (NAME=value and
// its NUL) may have: Linux's MAX_ARG_STRLEN, 32 pages; execve refuses
// more ("Argument list too long").
const maxEnvString = 32 * 4096

// commandBuilder is the part that builds a job's command: its argv, its
// inputs and its environment (its secrets, its token, its network's
// proxy), from the server's settings and the backend's capabilities.
type commandBuilder struct {
	cfg Config
	ref *backendRef
}

// backend is the engine's backend.
func (r *commandBuilder) backend() sandbox.Backend { return r.ref.get() }

// scriptArgs runs the "script" input with /bin/sh: a fixed command line,
// so that no job text shows in a process list. Where the backend puts
// every command's inputs at one path (Capabilities.InputsDir), the
// script is named directly, sparing a shell's start.
func (r *commandBuilder) scriptArgs() []string {
	if dir := r.backend().Capabilities().InputsDir; dir != "" {
		return []string{"/bin/sh", path.Join(dir, "script")}
	}
	return []string{"/bin/sh", "-c", `exec /bin/sh "$DELEGATE_INPUTS/script"`}
}

// command builds the argv, inputs and environment for a job. The command
// line is fixed: the task and the script, untrusted text, travel as
// inputs (files only the job's user reads) and environment values, never
// in Args, which every user of the sandbox's host can read; nothing is
// spliced into a shell line.
//
// ws is the manifest whose workspace source and caches the sandbox has:
// the job's own, or for a command in a kept sandbox that of the job that
// made it (nil: none). jn is the job's network through the egress proxy
// (nil: none).
func (r *commandBuilder) command(job *delegate.Job, token string, ws *delegate.Manifest, jn *jobNetwork) (sandbox.Command, error) {
	m := job.Manifest
	var args []string
	var stdin string
	inputs := map[string][]byte{}
	switch m.AgentType {
	case delegate.AgentScript:
		script := m.Task
		if m.Agent != nil && m.Agent.Command != "" {
			script = m.Agent.Command
		}
		args, inputs["script"] = r.scriptArgs(), []byte(script)
	case delegate.AgentCustom:
		// The command is the submitter's own code; the task reaches it as
		// data in $DELEGATE_TASK.
		args, inputs["script"] = r.scriptArgs(), []byte(m.Agent.Command)
	case delegate.AgentClaude:
		// The prompt on standard input, which claude -p reads.
		args, inputs["prompt"], stdin = ClaudeArgs(m), []byte(m.Task), "prompt"
	default:
		return sandbox.Command{}, fmt.Errorf("agentType %q: %w", m.AgentType, delegate.ErrInvalid)
	}
	if m.Stdin != "" && stdin == "" {
		// The submitter's standard input, as an input like the script:
		// data the process reads, never on a command line.
		data, err := m.DecodedStdin()
		if err != nil {
			return sandbox.Command{}, err
		}
		inputs["stdin"], stdin = data, "stdin"
	}
	env := map[string]string{
		"PATH":    basePath,
		"HOME":    delegate.Workspace,
		"TMPDIR":  "/tmp",
		"LANG":    "C.UTF-8",
		"TERM":    "dumb",
		"USER":    "sandbox",
		"LOGNAME": "sandbox",
		// Python's bytecode cache is judged by a source's size and mtime
		// in whole seconds: an agent that rewrites a file to the same size
		// within a second ran the old code. A job may set it to "".
		"PYTHONDONTWRITEBYTECODE": "1",
	}
	if ws != nil {
		workspaceEnv(env, ws.Workspace, ws.Caches)
	}
	for k, v := range m.Env {
		env[k] = v
	}
	for _, name := range m.Secrets {
		v, ok := r.cfg.Secret(name)
		if !ok {
			return sandbox.Command{}, fmt.Errorf("secret %q is no longer set on the server", name)
		}
		if _, bound := r.cfg.SecretBindings[name]; bound {
			// The proxy injects it for its host: never in the sandbox,
			// whose environment gets a placeholder (networkEnv) — or
			// nothing, when its network cannot carry it.
			continue
		}
		env[name] = v
	}
	env["DELEGATE_JOB_ID"] = job.ID
	if len("DELEGATE_TASK=")+len(m.Task) < maxEnvString {
		env["DELEGATE_TASK"] = m.Task
	} else {
		// Too large for one environment string: no process could start
		// with it. The task is the file $DELEGATE_INPUTS/task instead.
		inputs["task"] = []byte(m.Task)
	}
	env["DELEGATE_JOB_TOKEN"] = token
	env["DELEGATE_ANSWERS"] = AnswersDir // questions.go
	if r.cfg.CallbackURL != "" {
		env["DELEGATE_CALLBACK_URL"] = strings.TrimSuffix(r.cfg.CallbackURL, "/") + "/callback/" + job.ID
	}
	if f := r.backend().Capabilities().StatusFile; f != "" {
		env["DELEGATE_STATUS_FILE"] = f
	}
	r.networkEnv(env, jn, job.ID)
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
		Args: args, Env: list, Dir: delegate.Workspace, Inputs: inputs, Stdin: stdin, OutputLimit: r.cfg.OutputLimit,
		Deadline: time.Now().Add(time.Duration(m.TimeoutSeconds())*time.Second + deadlineGrace),
	}, nil
}

// ClaudeArgs is the Claude CLI command line for a job: fixed words and
// the model's name, without the task, which claude -p reads from its
// standard input (the "prompt" input). stream-json with -p needs
// --verbose; permissions are skipped because the sandbox is the boundary.
func ClaudeArgs(m delegate.Manifest) []string {
	args := []string{"claude", "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions"}
	if m.Agent != nil && m.Agent.ClaudeModel != "" {
		args = append(args, "--model", m.Agent.ClaudeModel)
	}
	return args
}

// networkEnv adds to a job's environment what its network needs: the
// proxy's address, the trust bundle when the proxy stands in for hosts,
// a placeholder for each secret the proxy injects, and the callback URL
// as the sandbox reaches it.
func (r *commandBuilder) networkEnv(env map[string]string, jn *jobNetwork, jobID string) {
	if jn == nil {
		return
	}
	router, ok := r.backend().(sandbox.EgressRouter)
	if !ok {
		return
	}
	route := router.EgressRoute(jn.token)
	for _, k := range []string{"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"} {
		env[k] = route.ProxyURL
	}
	env["no_proxy"], env["NO_PROXY"] = route.NoProxy, route.NoProxy
	if len(jn.caCert) > 0 && route.TrustFile != "" {
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS", "PIP_CERT"} {
			env[k] = route.TrustFile
		}
	}
	for _, s := range jn.inject {
		env[s] = Placeholder
	}
	if route.CallbackURL != "" && r.cfg.CallbackURL != "" {
		env["DELEGATE_CALLBACK_URL"] = strings.TrimSuffix(route.CallbackURL, "/") + "/callback/" + jobID
	}
}
