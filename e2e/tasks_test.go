package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Jobs as MCP Tasks, driven by the official TypeScript client 2.x with the
// Tasks extension's requester (e2e/tsclient/tasks.mjs), over stdio and
// HTTP: one tools/call per job, followed with tasks/get.

// tasksReport is what tasks.mjs prints.
type tasksReport struct {
	Protocol   string          `json:"protocol"`
	Advertised json.RawMessage `json:"advertised"`
	Kind       string          `json:"kind"`
	TaskID     string          `json:"taskId"`
	Seconds    float64         `json:"seconds"`
	Seen       []struct {
		Status  string `json:"status"`
		Message string `json:"message"`
		PollMs  *int64 `json:"pollMs"`
	} `json:"seen"`
	Outcome          string    `json:"outcome"`
	IsError          bool      `json:"isError"`
	Result           resultOut `json:"result"`
	TextIsStructured bool      `json:"textIsStructured"`
	Text             string    `json:"text"` // the result's text content
	OutputValidation string    `json:"outputValidation"`
	Wire             struct {
		Requests      map[string]int `json:"requests"`
		Sent          int            `json:"sent"`
		Received      int            `json:"received"`
		BytesSent     int            `json:"bytesSent"`
		BytesReceived int            `json:"bytesReceived"`
	} `json:"wire"`
	// cancel
	After struct {
		Status        string `json:"status"`
		StatusMessage string `json:"statusMessage"`
	} `json:"after"`
	CancelSeconds float64 `json:"cancelSeconds"`
	Unknown       struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"unknown"`
	// submit
	Reference json.RawMessage `json:"reference"`
	PID       int             `json:"pid"`
	// plain
	Submitted submitOut `json:"submitted"`
}

func requireTasksClient(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join("tsclient", "node_modules", "@modelcontextprotocol", "ext-tasks")); err != nil {
		t.Fatalf("the TypeScript Tasks client is not installed: run ./scripts/test (or npm ci in e2e/tsclient): %v", err)
	}
}

// tasksClient runs tasks.mjs against target (the binary for stdio, an MCP
// URL for http) and decodes its report.
func tasksClient(t *testing.T, mode, target, dataDir string, args ...string) tasksReport {
	t.Helper()
	cmd := exec.CommandContext(testContext(t), "node", append([]string{"tasks.mjs", mode, target}, args...)...)
	cmd.Dir = "tsclient"
	cmd.Env = serverEnv(dataDir)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node tasks.mjs %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	var r tasksReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("report %q: %v\n%s", out, err, stderr)
	}
	t.Logf("tasks.mjs %s saw: %s", args[0], out)
	return r
}

// target starts what a mode's client talks to.
func tasksTarget(t *testing.T, mode, dataDir string) string {
	if mode == "http" {
		return httpServer(t, dataDir)
	}
	return binary
}

func TestTasks(t *testing.T) {
	requireTasksClient(t)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			dataDir := t.TempDir()
			target := tasksTarget(t, mode, dataDir)

			t.Run("short job", func(t *testing.T) {
				r := tasksClient(t, mode, target, dataDir, "run", "sleep 1; echo short")
				if r.Protocol != "2026-07-28" || string(r.Advertised) != "{}" || r.Kind != "task" || !strings.HasPrefix(r.TaskID, "job-") {
					t.Fatalf("not a task: %+v", r)
				}
				if r.Outcome != "completed" || r.IsError || r.Result.Status != "success" || r.Result.Output != "short\n" || !r.TextIsStructured {
					t.Fatalf("outcome %s isError %v result %+v", r.Outcome, r.IsError, r.Result)
				}
				if r.OutputValidation != "valid" {
					t.Errorf("the task's result does not validate against submit_job's output schema: %s", r.OutputValidation)
				}
				// One tools/call for the whole job; tasks/get at the server's pace.
				if r.Wire.Requests["tools/call"] != 1 || r.Wire.Requests["tasks/get"] < 1 || r.Wire.Requests["tasks/get"] > 8 {
					t.Errorf("requests %v", r.Wire.Requests)
				}
				working := false
				for _, s := range r.Seen {
					if s.Status == "working" {
						working = true
						if s.PollMs == nil || *s.PollMs < 500 {
							t.Errorf("a working task without a poll interval of at least 500 ms: %+v", s)
						}
					}
				}
				if !working || r.Seen[len(r.Seen)-1].Status != "completed" {
					t.Errorf("statuses seen %+v", r.Seen)
				}
			})

			t.Run("failing job", func(t *testing.T) {
				r := tasksClient(t, mode, target, dataDir, "run", "echo oops >&2; exit 4")
				if r.Outcome != "completed" || !r.IsError || r.Result.Status != "failed" || r.Result.ExitCode == nil || *r.Result.ExitCode != 4 ||
					r.Result.Stderr != "oops\n" || r.OutputValidation != "valid" {
					t.Fatalf("outcome %s isError %v result %+v validation %s", r.Outcome, r.IsError, r.Result, r.OutputValidation)
				}
			})

			t.Run("cancel through tasks/cancel", func(t *testing.T) {
				r := tasksClient(t, mode, target, dataDir, "cancel")
				if r.Kind != "task" || r.After.Status != "cancelled" || !strings.Contains(r.After.StatusMessage, "cancel") || r.CancelSeconds > 20 {
					t.Fatalf("after tasks/cancel: %+v", r)
				}
				if r.Unknown.Code != -32602 || !strings.Contains(r.Unknown.Message, "Task not found") {
					t.Errorf("unknown task id: %+v", r.Unknown)
				}
			})

			t.Run("a client without the extension", func(t *testing.T) {
				r := tasksClient(t, mode, target, dataDir, "plain", "echo plain")
				if r.Protocol != "2026-07-28" || !strings.HasPrefix(r.Submitted.JobID, "job-") || !justSubmitted(r.Submitted.Status) ||
					r.OutputValidation != "valid" || r.Result.Output != "plain\n" {
					t.Fatalf("%+v", r)
				}
			})
		})
	}
}

// TestTasksLongJob: a job longer than one wait_job (50 s) settles through
// its task with one tools/call, the polls growing apart as it runs.
func TestTasksLongJob(t *testing.T) {
	requireTasksClient(t)
	if testing.Short() {
		t.Skip("a 55 s job")
	}
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dataDir := t.TempDir()
			r := tasksClient(t, mode, tasksTarget(t, mode, dataDir), dataDir, "run", "sleep 55; echo long")
			if r.Kind != "task" || r.Outcome != "completed" || r.Result.Output != "long\n" || r.Seconds < 55 {
				t.Fatalf("%+v", r)
			}
			polls := r.Wire.Requests["tasks/get"]
			if r.Wire.Requests["tools/call"] != 1 || polls < 5 || polls > 30 {
				t.Errorf("requests %v: one tools/call and some tens of polls at most", r.Wire.Requests)
			}
			var last int64
			for _, s := range r.Seen {
				if s.PollMs != nil && *s.PollMs > last {
					last = *s.PollMs
				}
			}
			if last < 10000 {
				t.Errorf("poll intervals did not grow past 10 s in a 55 s job: %+v", r.Seen)
			}
		})
	}
}

// TestTasksRestart: the server dies (SIGKILL) while a task's job runs; the
// client resumes the task from its reference on a new server over the
// same data dir, and tasks/get on the same id answers, to the end.
func TestTasksRestart(t *testing.T) {
	requireTasksClient(t)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			dataDir := t.TempDir()
			target := binary
			var server *exec.Cmd
			if mode == "http" {
				var base string
				base, server = startHTTPCmd(t, dataDir, nil)
				target = base + "/mcp"
			}
			cmd := exec.CommandContext(testContext(t), "node", "tasks.mjs", mode, target, "submit", "sleep 4; echo survived")
			cmd.Dir = "tsclient"
			cmd.Env = serverEnv(dataDir)
			stderr := &syncBuffer{}
			cmd.Stderr = stderr
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(stdout).ReadBytes('\n')
			if err != nil {
				t.Fatalf("tasks.mjs submit: %v\n%s", err, stderr)
			}
			var sub tasksReport
			if err := json.Unmarshal(line, &sub); err != nil || sub.Kind != "task" || len(sub.Reference) == 0 {
				t.Fatalf("submit %s: %v", line, err)
			}
			// The server dies mid-task, without a chance to clean up.
			if mode == "stdio" { // the client's child
				p, err := os.FindProcess(sub.PID)
				if err != nil || sub.PID == 0 {
					t.Fatalf("server pid %d: %v", sub.PID, err)
				}
				server = &exec.Cmd{Process: p}
			}
			killServer(t, server)
			if mode == "http" {
				// Reaped, as a daemon's parent would: a zombie's engine
				// still counts as alive to the next server (engine.ownerAlive).
				server.Wait()
			}
			stdin.Close()
			io.Copy(io.Discard, stdout)
			cmd.Wait()

			if mode == "http" {
				base, _ := startHTTPCmd(t, dataDir, nil)
				target = base + "/mcp"
			}
			start := time.Now()
			r := tasksClient(t, mode, target, dataDir, "resume", string(sub.Reference))
			var ref struct {
				TaskID string `json:"taskId"`
			}
			json.Unmarshal(sub.Reference, &ref)
			if r.TaskID != ref.TaskID || r.Outcome != "completed" || r.Result.Status != "success" || r.Result.Output != "survived\n" {
				t.Fatalf("resumed %s: %+v", ref.TaskID, r)
			}
			t.Logf("resumed and settled in %v", time.Since(start))
		})
	}
}

// TestTasksKeptSandbox: a command in a kept sandbox is a task too (one
// tools/call), over stdio and HTTP; the sandbox was opened by the CLI, in
// another process, and the second command sees the first's file.
func TestTasksKeptSandbox(t *testing.T) {
	requireTasksClient(t)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			dataDir := t.TempDir()
			out, errOut, code := delegateCLI(t, dataDir, "sandboxes", "open")
			id := strings.TrimSpace(out)
			if code != 0 || !strings.HasPrefix(id, "sbx-") {
				t.Fatalf("sandboxes open (%d): %q %s", code, out, errOut)
			}
			target := tasksTarget(t, mode, dataDir)
			first := tasksClient(t, mode, target, dataDir, "insandbox", id, "echo one > f")
			second := tasksClient(t, mode, target, dataDir, "insandbox", id, "cat f")
			for _, r := range []tasksReport{first, second} {
				if r.Kind != "task" || r.Outcome != "completed" || r.Result.Status != "success" || r.Wire.Requests["tools/call"] != 1 {
					t.Fatalf("not one settled task: %+v", r)
				}
			}
			if second.Result.Output != "one\n" {
				t.Errorf("the second command's output: %q", second.Result.Output)
			}
			delegateCLI(t, dataDir, "sandboxes", "release", id)
		})
	}
}
