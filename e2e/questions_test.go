package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// A job that waits for a person's answer, through the built binary: asked
// in a status line from inside a real local sandbox (no network), carried
// to an MCP client as its task's input_required, answered by
// @modelcontextprotocol/ext-tasks' onInputRequest through tasks/update,
// and read by the job from $DELEGATE_ANSWERS.

// askScript asks one question and prints its answer file.
const askScript = `echo '{"type":"question","id":"color","message":"Which colour?","requestedSchema":{"type":"object","properties":{"color":{"type":"string","enum":["red","blue"]},"note":{"type":"string"}},"required":["color"]}}' > "$DELEGATE_STATUS_FILE"
while [ ! -s "$DELEGATE_ANSWERS/color.json" ]; do sleep 0.1; done
cat "$DELEGATE_ANSWERS/color.json"`

// questionReport is what tasks.mjs prints for ask and unanswered.
type questionReport struct {
	Kind    string `json:"kind"`
	TaskID  string `json:"taskId"`
	Outcome string `json:"outcome"`
	IsError bool   `json:"isError"`
	Asked   []struct {
		Kind            string          `json:"kind"`
		InputID         string          `json:"inputId"`
		TaskID          string          `json:"taskId"`
		Message         string          `json:"message"`
		RequestedSchema json.RawMessage `json:"requestedSchema"`
	} `json:"asked"`
	Seen []struct {
		Status        string          `json:"status"`
		Message       string          `json:"message"`
		InputRequests json.RawMessage `json:"inputRequests"`
	} `json:"seen"`
	Result resultOut `json:"result"`
	Wire   struct {
		Requests map[string]int `json:"requests"`
	} `json:"wire"`
}

func questionClient(t *testing.T, mode, target, dataDir string, args ...string) questionReport {
	t.Helper()
	cmd := exec.CommandContext(testContext(t), "node", append([]string{"tasks.mjs", mode, target}, args...)...)
	cmd.Dir = "tsclient"
	cmd.Env = serverEnv(dataDir)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node tasks.mjs %s: %v\n%s", args[0], err, stderr)
	}
	var r questionReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("report %q: %v\n%s", out, err, stderr)
	}
	t.Logf("tasks.mjs %s saw: %s", args[0], out)
	return r
}

// TestTasksQuestion: a job asks; the Tasks client's onInputRequest answers
// the elicitation; the job prints the answer. Another job's question goes
// unanswered: its task stays input_required until the job's own timeout
// ends it.
func TestTasksQuestion(t *testing.T) {
	requireTasksClient(t)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dataDir := t.TempDir()
			target := tasksTarget(t, mode, dataDir)

			r := questionClient(t, mode, target, dataDir, "ask", askScript)
			if r.Kind != "task" || r.Outcome != "completed" || r.IsError || r.Result.Status != "success" {
				t.Fatalf("%+v", r)
			}
			if len(r.Asked) != 1 || r.Asked[0].Kind != "elicitation" || r.Asked[0].InputID != "color" || r.Asked[0].TaskID != r.TaskID ||
				r.Asked[0].Message != "Which colour?" || !strings.Contains(string(r.Asked[0].RequestedSchema), `"enum":["red","blue"]`) {
				t.Fatalf("asked %+v", r.Asked)
			}
			var answer struct {
				ID, Action string
				Content    map[string]any
			}
			if err := json.Unmarshal([]byte(r.Result.Output), &answer); err != nil || answer.ID != "color" || answer.Action != "accept" ||
				answer.Content["color"] != "blue" || answer.Content["note"] != "answered note" {
				t.Fatalf("the job printed %q: %v", r.Result.Output, err)
			}
			if r.Wire.Requests["tools/call"] != 1 || r.Wire.Requests["tasks/update"] != 1 {
				t.Errorf("requests %v: one tools/call, one tasks/update", r.Wire.Requests)
			}

			u := questionClient(t, mode, target, dataDir, "unanswered", askScript, "3")
			statuses := []string{}
			for _, s := range u.Seen {
				statuses = append(statuses, s.Status)
			}
			asked := false
			for _, s := range u.Seen {
				if s.Status == "input_required" {
					asked = strings.Contains(s.Message, "waiting for an answer: Which colour?") && strings.Contains(string(s.InputRequests), `"color":{"method":"elicitation/create"`)
				}
			}
			if !asked || u.Outcome != "completed" || !u.IsError || u.Result.Status != "timeout" || !strings.Contains(u.Result.Error, "timed out after 3s") {
				t.Fatalf("unanswered: statuses %v, outcome %s, result %+v", statuses, u.Outcome, u.Result)
			}
			// The question closed with the job.
			out, _, code := delegateCLI(t, dataDir, "jobs", "questions", u.TaskID, "--all", "--json")
			var qs []struct{ ID, State string }
			if err := json.Unmarshal([]byte(out), &qs); code != 0 || err != nil || len(qs) != 1 || qs[0].ID != "color" || qs[0].State != "closed" {
				t.Fatalf("questions after the timeout (%d): %s %v", code, out, err)
			}
		})
	}
}

// twoQuestions asks, waits, asks again, and prints both answers.
const twoQuestions = `ask() { printf '{"type":"question","id":"%s","message":"%s"%s}\n' "$1" "$2" "$3" > "$DELEGATE_STATUS_FILE"
  while [ ! -s "$DELEGATE_ANSWERS/$1.json" ]; do sleep 0.1; done; cat "$DELEGATE_ANSWERS/$1.json"; }
ask color "Which colour?" ',"requestedSchema":{"type":"object","properties":{"color":{"type":"string"}},"required":["color"]}'
ask size "How many?" ',"requestedSchema":{"type":"object","properties":{"n":{"type":"integer","minimum":1}}}'`

type waitQuestions struct {
	Status    string `json:"status"`
	Done      bool   `json:"done"`
	Questions []struct {
		ID              string          `json:"id"`
		Message         string          `json:"message"`
		RequestedSchema json.RawMessage `json:"requested_schema"`
	} `json:"questions"`
}

// TestQuestionSurvivesKill: an open question is stored before it is
// acknowledged: the server dies (SIGKILL) while a job waits for its
// answer; on the next server the question is still open, answered from
// the command line (another process), and reaches the job; its next
// question goes through the plain tools (wait_job, answer_job) of a
// client without Tasks.
func TestQuestionSurvivesKill(t *testing.T) {
	dataDir := t.TempDir()
	cs, cmd, _ := stdioSession(t, dataDir, "")
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": twoQuestions, "timeout": 120}})
	w := call[waitQuestions](t, cs, "wait_job", map[string]any{"job_id": job.JobID, "timeout_seconds": 30})
	if w.Done || w.Status != "running" || len(w.Questions) != 1 || w.Questions[0].ID != "color" || w.Questions[0].Message != "Which colour?" {
		t.Fatalf("wait_job: %+v", w)
	}

	killServer(t, cmd)
	cs2, _, _ := stdioSession(t, dataDir, "")
	out, stderr, code := delegateCLI(t, dataDir, "jobs", "questions", job.JobID)
	if code != 0 || !strings.Contains(out, "color  open") || !strings.Contains(out, "delegate jobs answer "+job.JobID+" color color=…") {
		t.Fatalf("jobs questions after the kill (%d): %s %s", code, out, stderr)
	}
	if out, stderr, code := delegateCLI(t, dataDir, "jobs", "answer", job.JobID, "color", "color=teal"); code != 0 || out != job.JobID+" color: accept\n" {
		t.Fatalf("jobs answer (%d): %q %q", code, out, stderr)
	}

	w = call[waitQuestions](t, cs2, "wait_job", map[string]any{"job_id": job.JobID, "timeout_seconds": 30})
	if w.Done || len(w.Questions) != 1 || w.Questions[0].ID != "size" || !strings.Contains(string(w.Questions[0].RequestedSchema), `"minimum":1`) {
		t.Fatalf("wait_job after the first answer: %+v", w)
	}
	if msg := callErr(t, cs2, "answer_job", map[string]any{"job_id": job.JobID, "answers": map[string]any{"size": map[string]any{"action": "accept", "content": map[string]any{"n": 0}}}}); !strings.Contains(msg, "answers.size.content.n: must be at least 1") {
		t.Fatalf("an answer outside the form: %s", msg)
	}
	a := call[struct{ Answered []string }](t, cs2, "answer_job", map[string]any{"job_id": job.JobID, "answers": map[string]any{"size": map[string]any{"action": "accept", "content": map[string]any{"n": 3}}}})
	if len(a.Answered) != 1 || a.Answered[0] != "size" {
		t.Fatalf("answer_job: %+v", a)
	}
	w = call[waitQuestions](t, cs2, "wait_job", map[string]any{"job_id": job.JobID, "timeout_seconds": 30})
	res := call[resultOut](t, cs2, "get_job_result", map[string]any{"job_id": job.JobID})
	lines := strings.Split(strings.TrimSpace(res.Output), "\n")
	if !w.Done || res.Status != "success" || len(lines) != 2 || !strings.Contains(lines[0], `"content":{"color":"teal"}`) || !strings.Contains(lines[1], `"content":{"n":3}`) {
		t.Fatalf("result %+v", res)
	}
}
