package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ControlPlaneOptions say what ControlPlane measures. Zero fields take
// the defaults of DefaultControlPlane.
type ControlPlaneOptions struct {
	// Binaries are the delegate binaries measured, each as its own
	// server over stdio: the first is "this build", a second (if any)
	// the build it is compared with. Rounds alternate between them.
	Binaries []string
	Rounds   int
	// Calls is the number of sequential submit_job and get_job_status
	// calls timed per round.
	Calls int
	// Jobs is the store's size when list_jobs and the memory are measured.
	Jobs int
	// CallbackJobs jobs run and send callbacks, each over CallbackConns
	// connections at CallbackRate a second in all: under the server's
	// per-job limits (50 a second, 8 connections), as jobs send them.
	CallbackJobs  int
	CallbackConns int
	CallbackRate  float64
	// CallbackTime is how long the callbacks are sent for.
	CallbackTime time.Duration
}

// DefaultControlPlane are ControlPlane's defaults.
var DefaultControlPlane = ControlPlaneOptions{
	Rounds: 5, Calls: 200, Jobs: 2000,
	CallbackJobs: 50, CallbackConns: 2, CallbackRate: 40, CallbackTime: 5 * time.Second,
}

// cpFigures are one round's figures of one binary.
type cpFigures map[string]float64

// cpMetric is a figure ControlPlane prints: its key, its unit and whether
// more is better (for the ratio's reading).
type cpMetric struct {
	key, label, unit string
	higherIsBetter   bool
}

var cpMetrics = []cpMetric{
	{"submit_p50", "submit_job p50 (sequential, stdio)", "ms", false},
	{"submit_p99", "submit_job p99", "ms", false},
	{"status_p50", "get_job_status p50", "ms", false},
	{"submit_conc", "submit_job, 16 at once", "/s", true},
	{"list_p50", "list_jobs p50 (default page, full store)", "ms", false},
	{"rss", "server RSS with the store full", "MiB", false},
	{"cb_accepted", "callbacks accepted (jobs under their limits)", "/s", true},
	{"cb_p50", "callback p50", "ms", false},
	{"cb_p99", "callback p99", "ms", false},
	{"cb_refused", "callbacks refused (should be 0)", "", false},
	{"throttled_p50", "answer p50 to a job over its rate (429; 0: none)", "ms", false},
}

// ControlPlane measures the server's control plane as an agent and its
// jobs use it: MCP calls over stdio, a store of many jobs, callbacks from
// running jobs, each under its limits, and the answer to a job that sends
// too many. With two binaries it runs them side by side, alternating
// round by round, and prints each figure's median and the ratio of this
// build to the other. The jobs are local sandboxes that sleep; the data
// dirs are temporary.
func ControlPlane(ctx context.Context, opts ControlPlaneOptions, out io.Writer) error {
	d := DefaultControlPlane
	if os.Getenv("DELEGATE_BENCH_SMALL") != "" {
		// The tests' size: every step, little of each.
		d = ControlPlaneOptions{Rounds: 1, Calls: 10, Jobs: 30, CallbackJobs: 2, CallbackConns: 2, CallbackRate: 20, CallbackTime: time.Second}
	}
	if len(opts.Binaries) == 0 || len(opts.Binaries) > 2 {
		return errors.New("control plane bench: one binary, or two to compare")
	}
	for _, f := range []struct {
		v   *int
		def int
	}{{&opts.Rounds, d.Rounds}, {&opts.Calls, d.Calls}, {&opts.Jobs, d.Jobs}, {&opts.CallbackJobs, d.CallbackJobs}, {&opts.CallbackConns, d.CallbackConns}} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	if opts.CallbackRate <= 0 {
		opts.CallbackRate = d.CallbackRate
	}
	if opts.CallbackTime <= 0 {
		opts.CallbackTime = d.CallbackTime
	}
	if opts.Jobs < opts.Calls+opts.CallbackJobs {
		opts.Jobs = opts.Calls + opts.CallbackJobs
	}
	all := make([][]cpFigures, len(opts.Binaries))
	for round := range opts.Rounds {
		for k := range opts.Binaries {
			i := (round + k) % len(opts.Binaries) // alternate which goes first
			f, err := controlPlaneRound(ctx, opts.Binaries[i], opts)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", opts.Binaries[i], round+1, err)
			}
			all[i] = append(all[i], f)
			fmt.Fprintf(os.Stderr, "round %d/%d %s: submit p50 %.3f ms, callbacks %.0f/s\n", round+1, opts.Rounds, opts.Binaries[i], f["submit_p50"], f["cb_accepted"])
		}
	}
	printControlPlane(out, opts, all)
	return nil
}

func printControlPlane(out io.Writer, opts ControlPlaneOptions, all [][]cpFigures) {
	fmt.Fprintf(out, "delegate bench --control-plane: %d rounds alternating, medians (min–max); %d jobs in the store, %d running jobs × %d connections at %g callbacks/s each\n",
		opts.Rounds, opts.Jobs, opts.CallbackJobs, opts.CallbackConns, opts.CallbackRate)
	for i, b := range opts.Binaries {
		fmt.Fprintf(out, "  [%c] %s\n", 'A'+i, b)
	}
	header := fmt.Sprintf("%-46s %22s", "", "A")
	if len(all) == 2 {
		header += fmt.Sprintf(" %22s %7s", "B", "A/B")
	}
	fmt.Fprintln(out, header)
	for _, m := range cpMetrics {
		line := fmt.Sprintf("%-46s", m.label)
		var meds []float64
		for _, rounds := range all {
			var v []float64
			for _, f := range rounds {
				v = append(v, f[m.key])
			}
			slices.Sort(v)
			med := v[len(v)/2]
			meds = append(meds, med)
			line += fmt.Sprintf(" %22s", fmt.Sprintf("%s %s (%s–%s)", num(med), m.unit, num(v[0]), num(v[len(v)-1])))
		}
		if len(meds) == 2 {
			if meds[1] != 0 {
				line += fmt.Sprintf(" %6.2fx", meds[0]/meds[1])
			} else {
				line += fmt.Sprintf(" %7s", "-")
			}
		}
		fmt.Fprintln(out, line)
	}
}

// num prints a figure with three significant digits, and whole numbers
// from 1,000 up as they are.
func num(v float64) string {
	if v >= 1000 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// cpServer is one binary's server in a round.
type cpServer struct {
	cs      *mcp.ClientSession
	cmd     *exec.Cmd
	cbBase  string
	dataDir string
}

func startServer(ctx context.Context, binary string, runningJobs int) (*cpServer, error) {
	dir, err := os.MkdirTemp("", "delegate-bench-cp-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "serve")
	cmd.Env = append(os.Environ(),
		"DELEGATE_DATA_DIR="+dir,
		"CALLBACK_HOST=127.0.0.1", "CALLBACK_PORT="+strconv.Itoa(port),
		// The running jobs hold every run slot: the timed jobs stay queued,
		// so that what is measured is the control plane alone.
		"DELEGATE_MAX_CONCURRENT="+strconv.Itoa(runningJobs),
		"DELEGATE_LOG_LEVEL=warn")
	cmd.Stderr = io.Discard
	client := mcp.NewClient(&mcp.Implementation{Name: "delegate-bench", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s serve: %w", binary, err)
	}
	return &cpServer{cs: cs, cmd: cmd, cbBase: fmt.Sprintf("http://127.0.0.1:%d", port), dataDir: dir}, nil
}

func (s *cpServer) close() {
	s.cs.Close()
	os.RemoveAll(s.dataDir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// call calls a tool and decodes its structured result into out (if not
// nil); a tool error is an error.
func (s *cpServer) call(ctx context.Context, tool string, args any, out any) error {
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	if res.IsError {
		var text string
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				text += t.Text
			}
		}
		return fmt.Errorf("%s: %s", tool, text)
	}
	if out == nil {
		return nil
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

type cpJob struct {
	id, token string
}

var tokenLine = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`TOKEN=(\S+)`) })

func controlPlaneRound(ctx context.Context, binary string, opts ControlPlaneOptions) (cpFigures, error) {
	s, err := startServer(ctx, binary, opts.CallbackJobs)
	if err != nil {
		return nil, err
	}
	defer s.close()
	f := cpFigures{}

	// The running jobs, each saying its callback token. They end before
	// the server does: a server that stops leaves its running sandboxes
	// for the next to adopt.
	running, err := s.startTokenJobs(ctx, opts.CallbackJobs)
	defer s.end(context.WithoutCancel(ctx), running)
	if err != nil {
		return nil, err
	}

	// The queued jobs are cancelled before the running ones (deferred
	// calls run last first): a running job's end would start one.
	var queuedIDs []string
	var idsMu sync.Mutex
	defer func() { s.cancelAll(context.WithoutCancel(ctx), queuedIDs) }()
	queued := map[string]any{"manifest": map[string]any{"task": "sleep 86400", "agentType": "script", "timeout": 86400}}
	var submitTimes, statusTimes []time.Duration
	var ids []string
	for range opts.Calls {
		start := time.Now()
		var out struct {
			JobID string `json:"job_id"`
		}
		if err := s.call(ctx, "submit_job", queued, &out); err != nil {
			return nil, err
		}
		submitTimes = append(submitTimes, time.Since(start))
		ids = append(ids, out.JobID)
		queuedIDs = append(queuedIDs, out.JobID)
	}
	for _, id := range ids {
		start := time.Now()
		if err := s.call(ctx, "get_job_status", map[string]any{"job_id": id}, nil); err != nil {
			return nil, err
		}
		statusTimes = append(statusTimes, time.Since(start))
	}
	f["submit_p50"], f["submit_p99"] = msAt(submitTimes, 50), msAt(submitTimes, 99)
	f["status_p50"] = msAt(statusTimes, 50)

	// The rest of the store, 16 submissions at once.
	rest := opts.Jobs - opts.Calls - opts.CallbackJobs
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(rest) {
				var out struct {
					JobID string `json:"job_id"`
				}
				if err := s.call(ctx, "submit_job", queued, &out); err != nil {
					errs <- err
					return
				}
				idsMu.Lock()
				queuedIDs = append(queuedIDs, out.JobID)
				idsMu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	f["submit_conc"] = float64(rest) / time.Since(start).Seconds()

	var listTimes []time.Duration
	for range 30 {
		start := time.Now()
		if err := s.call(ctx, "list_jobs", map[string]any{}, nil); err != nil {
			return nil, err
		}
		listTimes = append(listTimes, time.Since(start))
	}
	f["list_p50"] = msAt(listTimes, 50)
	rss, err := rssMiB(s.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	f["rss"] = rss

	cb := sendCallbacks(ctx, s.cbBase, running, opts.CallbackConns, opts.CallbackRate, opts.CallbackTime)
	f["cb_accepted"] = float64(cb.accepted) / opts.CallbackTime.Seconds()
	f["cb_p50"], f["cb_p99"] = msAt(cb.times, 50), msAt(cb.times, 99)
	f["cb_refused"] = float64(cb.refused)
	if cb.err != nil {
		return nil, cb.err
	}
	th, err := overRate(ctx, s.cbBase, running[0], 2*time.Second)
	if err != nil {
		return nil, err
	}
	f["throttled_p50"] = msAt(th, 50)
	return f, nil
}

// cancelAll cancels jobs, 16 at a time.
func (s *cpServer) cancelAll(ctx context.Context, ids []string) {
	work := make(chan string)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				s.call(ctx, "cancel_job", map[string]any{"job_id": id}, nil)
			}
		}()
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
}

// end cancels jobs and waits until each has ended.
func (s *cpServer) end(ctx context.Context, jobs []cpJob) {
	for _, j := range jobs {
		s.call(ctx, "cancel_job", map[string]any{"job_id": j.id}, nil)
	}
	for _, j := range jobs {
		for range 10 {
			var w struct {
				Done bool `json:"done"`
			}
			if err := s.call(ctx, "wait_job", map[string]any{"job_id": j.id, "timeout_seconds": 30}, &w); err != nil || w.Done {
				break
			}
		}
	}
}

// startTokenJobs starts n jobs that print their callback token and
// sleep, and returns them once each has said its token.
func (s *cpServer) startTokenJobs(ctx context.Context, n int) ([]cpJob, error) {
	var jobs []cpJob
	m := map[string]any{"manifest": map[string]any{"task": `echo "TOKEN=$DELEGATE_JOB_TOKEN"; exec sleep 86400`, "agentType": "script",
		"statusMode": "streaming", "timeout": 86400, "resources": map[string]any{"memory": "64M", "disk": "16M"}}}
	for range n {
		var out struct {
			JobID string `json:"job_id"`
		}
		if err := s.call(ctx, "submit_job", m, &out); err != nil {
			return jobs, err
		}
		jobs = append(jobs, cpJob{id: out.JobID})
	}
	deadline := time.Now().Add(2 * time.Minute)
	for i := range jobs {
		for jobs[i].token == "" {
			var logs struct {
				Output string `json:"output"`
			}
			if err := s.call(ctx, "get_job_logs", map[string]any{"job_id": jobs[i].id}, &logs); err != nil {
				return jobs, err
			}
			if m := tokenLine().FindStringSubmatch(logs.Output); m != nil {
				jobs[i].token = m[1]
				break
			}
			if time.Now().After(deadline) {
				return jobs, fmt.Errorf("job %s did not print its token in 2 minutes", jobs[i].id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return jobs, nil
}

type cbResult struct {
	accepted, refused int
	times             []time.Duration
	err               error
}

// sendCallbacks has each job send status callbacks over conns
// connections of its own, at rate a second in all, for d.
func sendCallbacks(ctx context.Context, base string, jobs []cpJob, conns int, rate float64, d time.Duration) cbResult {
	var (
		mu  sync.Mutex
		res cbResult
		wg  sync.WaitGroup
	)
	end := time.Now().Add(d)
	interval := time.Duration(float64(time.Second) * float64(conns) / rate)
	for _, j := range jobs {
		client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: conns, MaxIdleConnsPerHost: conns}}
		for c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Spread the connections' sends over the interval.
				next := time.Now().Add(interval * time.Duration(c) / time.Duration(conns))
				var times []time.Duration
				accepted, refused := 0, 0
				var firstErr error
				for n := 0; ; n++ {
					if next.After(end) {
						break
					}
					time.Sleep(time.Until(next))
					next = next.Add(interval)
					start := time.Now()
					code, err := postCallback(ctx, client, base, j, fmt.Sprintf(`{"status":"running","progress":"step %d"}`, n))
					if err != nil {
						firstErr = err
						break
					}
					times = append(times, time.Since(start))
					if code/100 == 2 {
						accepted++
					} else {
						refused++
					}
				}
				mu.Lock()
				res.accepted += accepted
				res.refused += refused
				res.times = append(res.times, times...)
				if res.err == nil {
					res.err = firstErr
				}
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return res
}

// overRate has one job send callbacks as fast as one connection allows
// for d, and returns how long each refused (429) answer took.
func overRate(ctx context.Context, base string, j cpJob, d time.Duration) ([]time.Duration, error) {
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	var refused []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); {
		start := time.Now()
		code, err := postCallback(ctx, client, base, j, `{"status":"running"}`)
		if err != nil {
			return nil, err
		}
		if code == http.StatusTooManyRequests {
			refused = append(refused, time.Since(start))
		}
	}
	return refused, nil // none: a build without a per-job rate limit
}

func postCallback(ctx context.Context, client *http.Client, base string, j cpJob, body string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/callback/"+j.id+"/status", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+j.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func msAt(times []time.Duration, pct int) float64 {
	if len(times) == 0 {
		return 0
	}
	slices.Sort(times)
	return ms(times[min(len(times)-1, len(times)*pct/100)])
}

// rssMiB is a process's resident set from /proc.
func rssMiB(pid int) (float64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, errors.New("no VmRSS in /proc/PID/status")
}
