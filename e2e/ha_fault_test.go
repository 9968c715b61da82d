//go:build fault

package e2e

// Several servers on one PostgreSQL store (issue 37, part 2): the built
// binary three times, `delegate serve --http` each with its own data dir,
// on one real PostgreSQL database and the Proxmox simulator, with short
// leases (DELEGATE_LEASE_TTL=3s: adoption within about 5 s). Each test
// kills, pauses or cuts one server and checks every job's end.

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testkit/pgproxy"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// haCluster is the store and the cluster several servers share.
type haCluster struct {
	url string // the PostgreSQL database
	sim *pvesim.Server
	env []string
}

// haServer is one `delegate serve --http` of the cluster.
type haServer struct {
	name   string
	base   string
	cmd    *exec.Cmd
	stderr *syncBuffer
}

func newHACluster(t *testing.T, env ...string) *haCluster {
	t.Helper()
	url := pgtest.Own(t, pgtest.Options{}).NewDatabase(t)
	sim, simEnv := simCluster(t, 1)
	return &haCluster{url: url, sim: sim, env: append(append(simEnv, "DELEGATE_LEASE_TTL=3s", "DELEGATE_MAX_CONCURRENT=24",
		"GOMAXPROCS=2"), env...)}
}

// start starts a server on the cluster (store: its database, or another
// URL of it, such as through a proxy).
func (c *haCluster) start(t *testing.T, name string, store string) *haServer {
	t.Helper()
	if store == "" {
		store = c.url
	}
	// Each its own host, as far as the servers know: a dead one is judged
	// by its lease, as across machines (on one host, its process gone
	// would be seen at once).
	base, cmd, stderr := startHTTPLogged(t, t.TempDir(), nil, append(c.env, "DELEGATE_STORE="+store, "DELEGATE_HOST_ID=host-"+name)...)
	return &haServer{name: name, base: base, cmd: cmd, stderr: stderr}
}

func (s *haServer) session(t *testing.T) *mcp.ClientSession {
	return httpSession(t, s.base+"/mcp", "")
}

// kill kills the server at once (SIGKILL) and reaps it.
func (s *haServer) kill(t *testing.T) {
	t.Helper()
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// metric reads one of the server's metrics (-1: not shown).
func (s *haServer) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(s.base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// adoptions counts the jobs servers adopted.
func adoptions(t *testing.T, servers ...*haServer) float64 {
	n := 0.0
	for _, s := range servers {
		n += max(s.metric(t, "delegate_adoptions_total"), 0)
	}
	return n
}

// submitJobs submits n jobs that each print 1 to 2*secs, one every half
// second.
func submitJobs(t *testing.T, cs *mcp.ClientSession, n int, secs int) []string {
	t.Helper()
	var ids []string
	for range n {
		task := fmt.Sprintf("for i in $(seq 1 %d); do echo $i; sleep 0.5; done", 2*secs)
		ids = append(ids, call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
			"agentType": "script", "task": task, "timeout": 120}}).JobID)
	}
	for _, id := range ids {
		waitStatus(t, cs, id, "running")
	}
	return ids
}

// checkJobs waits on cs for every job of submitJobs to end and checks
// that each succeeded with its whole output, once.
func checkJobs(t *testing.T, cs *mcp.ClientSession, ids []string, secs int) {
	t.Helper()
	var want strings.Builder
	for i := range 2 * secs {
		fmt.Fprintf(&want, "%d\n", i+1)
	}
	for _, id := range ids {
		st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id, "timeout_seconds": 40})
		res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": id})
		if st.Status != "success" || res.Output != want.String() {
			t.Errorf("job %s: %s %q, output %q (want %q)", id, st.Status, st.Error, res.Output, want.String())
		}
	}
}

// TestFaultServersKill: the server running 20 jobs, which keeps the warm
// pool too, is killed (SIGKILL). The two others adopt its jobs, each
// exactly once, and every job ends success with its whole output within
// 30 s of the kill; one of them keeps the warm pool within 30 s.
func TestFaultServersKill(t *testing.T) {
	c := newHACluster(t, "PROXMOX_POOL_SIZE=1", "DEFAULT_CPU=1")
	a := c.start(t, "a", "")
	testkit.Eventually(t, 30*time.Second, "a keeps the pool", func() bool { return a.metric(t, "delegate_pool_keeper") == 1 })
	b, d := c.start(t, "b", ""), c.start(t, "d", "")
	ids := submitJobs(t, a.session(t), 20, 6)
	a.kill(t)
	killed := time.Now()
	testkit.Eventually(t, 30*time.Second, "a's jobs adopted", func() bool { return adoptions(t, b, d) == 20 })
	t.Logf("a's 20 running jobs adopted %s after its death (lease 3 s)", time.Since(killed).Round(100*time.Millisecond))
	checkJobs(t, b.session(t), ids, 6)
	took := time.Since(killed)
	if took > 30*time.Second {
		t.Errorf("the jobs ended %s after the kill, want within 30 s", took.Round(time.Millisecond))
	}
	if n := adoptions(t, b, d); n != 20 {
		t.Errorf("%v adoptions, want 20 (each job once)", n)
	}
	testkit.Eventually(t, max(time.Second, 30*time.Second-time.Since(killed)), "the pool kept again", func() bool {
		return b.metric(t, "delegate_pool_keeper")+d.metric(t, "delegate_pool_keeper") == 1
	})
	t.Logf("20 jobs adopted and ended %s after the kill; pool kept again %s after it",
		took.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}

// TestFaultServersPause: a server running jobs is stopped (SIGSTOP) past
// its lease; the others adopt its jobs; continued (SIGCONT), it writes
// nothing more of them: its writes are refused (fenced) or it finds its
// lease lost first, says so in its log and its metrics, and every job
// ends once, as its adopter saw it; then it registers again and takes
// new jobs.
func TestFaultServersPause(t *testing.T) {
	c := newHACluster(t)
	a := c.start(t, "a", "")
	b, d := c.start(t, "b", ""), c.start(t, "d", "")
	ids := submitJobs(t, a.session(t), 6, 8)
	a.cmd.Process.Signal(syscall.SIGSTOP)
	testkit.Eventually(t, 20*time.Second, "a's jobs adopted", func() bool { return adoptions(t, b, d) == 6 })
	a.cmd.Process.Signal(syscall.SIGCONT)
	testkit.Eventually(t, 10*time.Second, "a knows it lost its jobs", func() bool {
		return strings.Contains(a.stderr.String(), "lease lost") && a.metric(t, "delegate_fenced_writes_total") >= 1
	})
	log := a.stderr.String()
	fenced := a.metric(t, "delegate_fenced_writes_total")
	// Its first refused write says "write fenced" where a write came
	// before the renewal that found the lease gone; after it, each says
	// that the server gave the job up ("(fenced: conflict)").
	if !strings.Contains(log, "lease lost") || fenced < 1 || !strings.Contains(log, "write fenced") && !strings.Contains(log, "(fenced: ") {
		t.Errorf("a's log after it woke (fenced writes %v):\n%s", fenced, log)
	}
	t.Logf("the woken server: %v writes fenced", fenced)
	checkJobs(t, b.session(t), ids, 8)
	if strings.Contains(a.stderr.String(), `msg="job finished"`) {
		t.Errorf("the woken server finished a job:\n%s", a.stderr)
	}
	// Its jobs all adopted, it registers again (a new lease; nothing of
	// its own left to take back) and runs new jobs.
	testkit.Eventually(t, 20*time.Second, "a registered again", func() bool {
		return a.metric(t, "delegate_lease_live") == 1 && strings.Contains(a.stderr.String(), "lease regained")
	})
	cs := a.session(t)
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo again"}})
	if st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": job.JobID}); st.Status != "success" {
		t.Errorf("a job on a after it registered again: %+v", st)
	}
}

// TestFaultServerCutFromStore: a server whose connection to the store is
// cut (through a TCP proxy the test closes) stops trusting its lease
// within it, stops claiming and gives up its jobs; the others adopt and
// finish them.
func TestFaultServerCutFromStore(t *testing.T) {
	c := newHACluster(t)
	proxy := pgproxy.New(t, c.url)
	a := c.start(t, "a", proxy.URL)
	b := c.start(t, "b", "")
	ids := submitJobs(t, a.session(t), 4, 8)
	proxy.Cut()
	testkit.Eventually(t, 10*time.Second, "a gives its lease up", func() bool {
		return a.metric(t, "delegate_lease_live") == 0 && strings.Contains(a.stderr.String(), "lease lost")
	})
	if log := a.stderr.String(); !strings.Contains(log, "lease lost") || !strings.Contains(log, "renew lease") {
		t.Errorf("a's log:\n%s", log)
	}
	checkJobs(t, b.session(t), ids, 8)
	if n := adoptions(t, b); n != 4 {
		t.Errorf("%v adoptions, want 4", n)
	}
}

// TestFaultStoreOutage: the database out of both servers' reach for
// longer than their leases (their connections through a proxy the test
// cuts, new ones refused, as when PostgreSQL is stopped or the network
// fails). Each says its lease is lost and takes no new job; the jobs'
// VMs run on. Back, each registers again and takes back its jobs, or
// adopts the other's: every job ends success with its whole output, once.
func TestFaultStoreOutage(t *testing.T) {
	c := newHACluster(t)
	proxy := pgproxy.New(t, c.url)
	a, b := c.start(t, "a", proxy.URL), c.start(t, "b", proxy.URL)
	ca := a.session(t)
	ids := append(submitJobs(t, ca, 3, 8), submitJobs(t, b.session(t), 3, 8)...)
	proxy.Cut()
	testkit.Eventually(t, 15*time.Second, "both servers give their leases up", func() bool {
		return a.metric(t, "delegate_lease_live") == 0 && b.metric(t, "delegate_lease_live") == 0
	})
	if msg := callErr(t, ca, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "true"}}); !strings.Contains(msg, "lease") {
		t.Errorf("a submission during the outage: %s", msg)
	}
	// Past both leases' end on the database's clock (the test's own way to it).
	testkit.Eventually(t, 15*time.Second, "both leases ended in the database", func() bool {
		out, _, code := delegateCLIEnv(t, t.TempDir(), []string{"DELEGATE_STORE=" + c.url}, "servers")
		return code == 0 && strings.Count(out, "\n") == 3 && !strings.Contains(out, "live (renewed")
	})
	proxy.Restore()
	testkit.Eventually(t, 30*time.Second, "both registered again", func() bool {
		return a.metric(t, "delegate_lease_live") == 1 && b.metric(t, "delegate_lease_live") == 1 &&
			strings.Contains(a.stderr.String(), "lease regained") && strings.Contains(b.stderr.String(), "lease regained")
	})
	checkJobs(t, ca, ids, 8)
	for _, id := range ids {
		if n := strings.Count(a.stderr.String()+b.stderr.String(), `msg="job finished" job=`+id); n != 1 {
			t.Errorf("job %s ended %d times", id, n)
		}
	}
}

// TestFaultServersFollowJob: an MCP client following a job on server A
// while A dies opens a session to B and follows the same job there: the
// Tasks client resumes the task (tasks/get) and wait_job answers.
func TestFaultServersFollowJob(t *testing.T) {
	requireTasksClient(t)
	c := newHACluster(t)
	a := c.start(t, "a", "")
	b := c.start(t, "b", "")
	cmd := exec.CommandContext(testContext(t), "node", "tasks.mjs", "http", a.base+"/mcp", "submit", "sleep 5; echo followed")
	cmd.Dir = "tsclient"
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		t.Fatalf("tasks.mjs submit: %v\n%s", err, stderr)
	}
	ref := taskRef(t, line)
	a.kill(t)
	stdin.Close()
	io.Copy(io.Discard, stdout)
	cmd.Wait()

	r := tasksClient(t, "http", b.base+"/mcp", t.TempDir(), "resume", ref.raw)
	if r.TaskID != ref.id || r.Outcome != "completed" || r.Result.Status != "success" || r.Result.Output != "followed\n" {
		t.Fatalf("resumed %s on b: %+v", ref.id, r)
	}
	cs := b.session(t)
	if st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": ref.id}); st.Status != "success" {
		t.Errorf("wait_job on b: %+v", st)
	}
}

// TestFaultServersShareResults: a job that server a runs, with
// artifacts, is read whole through server b, whose data dir (and so its
// artifact directory) is its own, with no directory shared between the
// two: its end (wait_job woken on b), its result and output, its
// artifacts' list and their content, checked against their sha256.
func TestFaultServersShareResults(t *testing.T) {
	c := newHACluster(t)
	a := c.start(t, "a", "")
	b := c.start(t, "b", "")
	ca, cb := a.session(t), b.session(t)
	sub := call[submitOut](t, ca, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "artifacts": []string{"out/**"},
		"task": "mkdir -p out/deep; echo made; echo 'a report' > out/report.txt; head -c 3000 /dev/urandom > out/deep/blob.bin"}})
	if st := call[statusOut](t, cb, "wait_job", map[string]any{"job_id": sub.JobID}); st.Status != "success" {
		t.Fatalf("wait_job on b: %+v", st)
	}
	res := call[struct {
		Status    string `json:"status"`
		Output    string `json:"output"`
		Artifacts []struct {
			Name   string `json:"name"`
			Size   int64  `json:"size"`
			SHA256 string `json:"sha256"`
		} `json:"artifacts"`
	}](t, cb, "get_job_result", map[string]any{"job_id": sub.JobID})
	sums := map[string]string{}
	for _, art := range res.Artifacts {
		sums[art.Name] = art.SHA256
	}
	if res.Status != "success" || res.Output != "made\n" || len(sums) != 2 || sums["out/deep/blob.bin"] == "" {
		t.Fatalf("get_job_result on b: %+v", res)
	}
	for name, size := range map[string]int{"out/report.txt": 9, "out/deep/blob.bin": 3000} {
		r, err := cb.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: "job://" + sub.JobID + "/artifacts/" + name})
		if err != nil {
			t.Fatalf("artifact %s read on b: %v", name, err)
		}
		data := r.Contents[0].Blob
		if data == nil {
			data = []byte(r.Contents[0].Text)
		}
		sum := sha256.Sum256(data)
		if len(data) != size || hex.EncodeToString(sum[:]) != sums[name] {
			t.Errorf("artifact %s read on b: %d bytes, sha256 %x (want %d, %s)", name, len(data), sum, size, sums[name])
		}
	}
}

// task is a task's reference as tasks.mjs printed it.
type task struct{ id, raw string }

var taskIDRe = regexp.MustCompile(`"taskId":"([^"]+)"`)

func taskRef(t *testing.T, line []byte) task {
	t.Helper()
	var sub tasksReport
	if err := json.Unmarshal(line, &sub); err != nil || len(sub.Reference) == 0 {
		t.Fatalf("submit %s: %v", line, err)
	}
	m := taskIDRe.FindSubmatch(sub.Reference)
	if m == nil {
		t.Fatalf("no task id in %s", sub.Reference)
	}
	return task{id: string(m[1]), raw: string(sub.Reference)}
}
