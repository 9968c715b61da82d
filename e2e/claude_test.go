package e2e

import (
	"encoding/base64"
	"strings"
	"testing"
)

// standInClaude behaves like the Claude CLI in -p stream-json mode, and
// reports the argv it was given, one argument per line, then the prompt
// it read from its standard input.
const standInClaude = `#!/bin/sh
i=0
for a in "$@"; do i=$((i+1)); printf 'argv[%d]=%s\n' "$i" "$a"; done
printf 'stdin=%s\n' "$(cat)"
echo '{"type":"system","subtype":"init","session_id":"s1","tools":[]}'
echo '{"type":"result","subtype":"success","is_error":false,"result":"done"}'
`

// TestClaudeAgentStandIn: agentType claude runs "claude" from PATH with
// the task on its standard input, never in its arguments (which every
// user of the host can read) nor through a shell.
func TestClaudeAgentStandIn(t *testing.T) {
	cs, _, _ := stdioSession(t, t.TempDir(), "")
	task := `fix "the bug"; $(touch /workspace/pwned) && echo pwned ` + "`id`\nsecond line"
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType":  "claude",
		"task":       task,
		"agent":      map[string]any{"claudeModel": "claude-sonnet-4-5"},
		"files":      []map[string]any{{"path": "bin/claude", "mode": "0755", "content": base64.StdEncoding.EncodeToString([]byte(standInClaude))}},
		"env":        map[string]string{"PATH": "/workspace/bin:/usr/bin:/bin"},
		"statusMode": "detailed",
		// network: egress by default for claude (user-mode networking).
	}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID})
	res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	want := strings.Join([]string{
		"argv[1]=-p",
		"argv[2]=--output-format", "argv[3]=stream-json", "argv[4]=--verbose", "argv[5]=--dangerously-skip-permissions",
		"argv[6]=--model", "argv[7]=claude-sonnet-4-5",
		"stdin=" + task,
		`{"type":"system","subtype":"init","session_id":"s1","tools":[]}`,
		`{"type":"result","subtype":"success","is_error":false,"result":"done"}`,
	}, "\n") + "\n"
	if res.Status != "success" || res.Output != want {
		t.Fatalf("status %s error %q\noutput:\n%s\nwant:\n%s", res.Status, res.Error, res.Output, want)
	}
	// The stream-json became progress and the job's result.
	full := call[struct {
		Result string `json:"result"`
	}](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	st := call[struct {
		Timeline []struct {
			Message string `json:"message"`
		} `json:"timeline"`
	}](t, cs, "get_job_status", map[string]any{"job_id": sub.JobID})
	if full.Result != "done" || len(st.Timeline) != 2 || st.Timeline[0].Message != "claude started" || st.Timeline[1].Message != "claude finished" {
		t.Fatalf("result %q timeline %+v", full.Result, st.Timeline)
	}
}
