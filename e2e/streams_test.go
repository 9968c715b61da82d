package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestRunStreams: through the built binary, a job's stdout and stderr stay
// apart end to end: delegate run puts each on its own stream, byte for
// byte; jobs result and get_job_result have both; the log (jobs logs,
// get_job_logs, job://{id}/log) has them interleaved in the order written.
func TestRunStreams(t *testing.T) {
	dataDir := t.TempDir()
	out, errOut, code := delegateCLI(t, dataDir, "run", "-q", "--script", "echo out; echo err >&2")
	if out != "out\n" || errOut != "err\n" || code != 0 {
		t.Fatalf("run: stdout %q, stderr %q, exit %d", out, errOut, code)
	}
	first := newestJob(t, dataDir)

	// Any bytes, and the order of the log: a pause before each change of
	// stream lets the sandbox read each write in turn.
	out, errOut, code = delegateCLI(t, dataDir, "run", "-q", "--script",
		`printf 'a\000b\377'; sleep 0.3; printf '\001E\n' >&2; sleep 0.3; echo last; exit 3`)
	if out != "a\x00b\xfflast\n" || !strings.HasPrefix(errOut, "\x01E\n") || code != 3 || !strings.Contains(errOut, "exit code 3") {
		t.Fatalf("run: stdout %q, stderr %q, exit %d", out, errOut, code)
	}
	second := newestJob(t, dataDir)

	out, errOut, code = delegateCLI(t, dataDir, "jobs", "result", first)
	if out != "out\n" || !strings.HasPrefix(errOut, "err\ndelegate: "+first+" success") || code != 0 {
		t.Errorf("jobs result: stdout %q, stderr %q, exit %d", out, errOut, code)
	}
	out, _, _ = delegateCLI(t, dataDir, "jobs", "result", "--json", first)
	var res resultOut
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Output != "out\n" || res.Stderr != "err\n" || res.OutputBytes != 8 {
		t.Errorf("jobs result --json: %+v %v\n%s", res, err, out)
	}
	if out, _, code := delegateCLI(t, dataDir, "jobs", "logs", second); out != "a\x00b\xff\x01E\nlast\n" || code != 0 {
		t.Errorf("jobs logs: %q %d", out, code)
	}

	// The MCP tools and the log resource, from a server on the same data.
	cs, _, _ := stdioSession(t, dataDir, "")
	r := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": first})
	if r.Output != "out\n" || r.Stderr != "err\n" || r.Status != "success" {
		t.Errorf("get_job_result: %+v", r)
	}
	r = call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": second})
	if r.Output != "a\x00b\uFFFDlast\n" || r.Stderr != "\x01E\n" || r.ExitCode == nil || *r.ExitCode != 3 {
		t.Errorf("get_job_result: %+v", r)
	}
	l := call[logsOut](t, cs, "get_job_logs", map[string]any{"job_id": first})
	if l.Output != "out\nerr\n" || !l.Done {
		t.Errorf("get_job_logs: %+v", l)
	}
	rr, err := cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: "job://" + second + "/log"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "a\x00b\uFFFD\x01E\nlast\n" {
		t.Errorf("job://%s/log: %+v %v", second, rr, err)
	}
}

// TestProxmoxRunStreams: on the Proxmox backend (the simulator, whose
// guests run commands for real), a job's stdout and stderr stay apart
// too: delegate run, get_job_result and the interleaved log.
func TestProxmoxRunStreams(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simCluster(t, 1)
	dataDir := t.TempDir()
	out, errOut, code := delegateCLIEnv(t, dataDir, env, "run", "-q", "--script", "echo out; echo err >&2; sleep 0.3; echo more; exit 2")
	if out != "out\nmore\n" || !strings.HasPrefix(errOut, "err\n") || code != 2 {
		t.Fatalf("run: stdout %q, stderr %q, exit %d", out, errOut, code)
	}
	id := newestJob(t, dataDir)
	cs, _, _ := stdioSession(t, dataDir, "", env...)
	r := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": id})
	if r.Output != "out\nmore\n" || r.Stderr != "err\n" || r.ExitCode == nil || *r.ExitCode != 2 {
		t.Errorf("get_job_result: %+v", r)
	}
	if l := call[logsOut](t, cs, "get_job_logs", map[string]any{"job_id": id}); l.Output != "out\nerr\nmore\n" || !l.Done {
		t.Errorf("get_job_logs: %+v", l)
	}
	noVMsLeft(t, sim)
}
