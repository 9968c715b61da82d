package httpapi_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/mock"
)

// serverEnv makes the test binary a callback server (runCallbackServer)
// instead of running tests, so that its memory can be measured alone.
const serverEnv = "DELEGATE_HTTPAPI_TEST_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) != "" {
		os.Exit(runCallbackServer())
	}
	os.Exit(m.Run())
}

// strictService takes the token "dlg_good" for every job and refuses any
// other; Callback answers running.
func strictService() *mock.CallbackService {
	return &mock.CallbackService{
		AuthenticateFn: func(ctx context.Context, id, token string) error {
			if token != "dlg_good" {
				return delegate.ErrUnauthenticated
			}
			return nil
		},
		CallbackFn: func(ctx context.Context, id, token string, r delegate.Report) (*delegate.Job, error) {
			if token != "dlg_good" {
				panic("a report with a bad token reached Callback")
			}
			return &delegate.Job{ID: id, Status: delegate.StatusRunning}, nil
		},
	}
}

// runCallbackServer serves a CallbackServer on 127.0.0.1, prints its
// address, and runs until its stdin closes.
func runCallbackServer() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	srv := httpapi.CallbackServer(servicesOf(strictService()), httpapi.Options{})
	go srv.Serve(l)
	fmt.Println(l.Addr())
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// startCallbackServer serves a CallbackServer in this process.
func startCallbackServer(t *testing.T, svc delegate.CallbackService, opts httpapi.Options) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpapi.CallbackServer(servicesOf(svc), opts)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// header is a callback's request head announcing a body of n bytes.
func header(token string, n int) string {
	return fmt.Sprintf("POST /callback/job-1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", token, n)
}

// TestCallbackBadTokenAnsweredBeforeBody: a request with a bad token is
// answered 401 from its headers, without its body being read, and its
// connection is closed. Before, the server waited for (and read) up to
// 1 MiB of body first.
func TestCallbackBadTokenAnsweredBeforeBody(t *testing.T) {
	addr := startCallbackServer(t, strictService(), httpapi.Options{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, header("dlg_wrong", 1<<20)); err != nil {
		t.Fatal(err)
	}
	// No body is sent: only an answer from the headers can come before
	// this deadline (the body's own idle timeout is 30 s).
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer before the body was sent: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || !resp.Close {
		t.Errorf("answer %d, close %v; want 401 and the connection closed", resp.StatusCode, resp.Close)
	}
}

// TestCallbackUnauthenticatedConnectionsCapped: past the cap, the oldest
// connection that has sent no valid token is closed; a job still gets
// through on a new one.
func TestCallbackUnauthenticatedConnectionsCapped(t *testing.T) {
	const max = 8
	addr := startCallbackServer(t, strictService(), httpapi.Options{MaxUnauthenticated: max})
	var conns []net.Conn
	for range 40 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	open := func() (n int, newest bool) {
		for i, c := range conns {
			c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				n++
				newest = newest || i == len(conns)-1
			}
		}
		return n, newest
	}
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d of 40 idle connections open, the newest among them", max), func() bool {
		n, newest := open()
		return n == max && newest
	})
	resp, err := http.Post("http://"+addr+"/callback/job-1/heartbeat", "application/json", nil)
	if err == nil {
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != 401 {
		t.Errorf("a new request: %v %v", resp, err)
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/callback/job-1/status", strings.NewReader(`{"progress":"x"}`))
	req.Header.Set("Authorization", "Bearer dlg_good")
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a job's callback with the cap full of strangers: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestCallbackRateAndConnsPerJob: one job's callbacks past the burst get
// 429 with Retry-After; past its connections' cap an answer closes the
// connection.
func TestCallbackRateAndConnsPerJob(t *testing.T) {
	addr := startCallbackServer(t, strictService(), httpapi.Options{Rate: 1, Burst: 3, MaxConnsPerJob: 2})
	post := func(c *http.Client) *http.Response {
		req, _ := http.NewRequest("POST", "http://"+addr+"/callback/job-1/heartbeat", nil)
		req.Header.Set("Authorization", "Bearer dlg_good")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	var codes []int
	var closes []bool
	for range 4 {
		// A client of its own each time: a new connection each time.
		resp := post(&http.Client{Transport: &http.Transport{}})
		codes = append(codes, resp.StatusCode)
		closes = append(closes, resp.Close)
	}
	if fmt.Sprint(codes) != "[200 200 200 429]" {
		t.Errorf("codes %v, want three 200 and a 429", codes)
	}
	if fmt.Sprint(closes) != "[false false true true]" {
		t.Errorf("answers closing their connection: %v, want the third and fourth (2 per job)", closes)
	}
}

// TestCallbackMemoryUnderBadTokens: 200 connections sending a 1 MiB body
// each with a wrong token do not grow the server's memory (measured as
// its resident set, in a process of its own) by more than a small bound.
// Before, each body was read first: the server held them all.
func TestCallbackMemoryUnderBadTokens(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), serverEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr = strings.TrimSpace(addr)
	rss := func() int64 {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				return kb << 10
			}
		}
		t.Fatal("no VmRSS")
		return 0
	}
	// A good request first, so that what serving costs at all is in the
	// baseline.
	req, _ := http.NewRequest("POST", "http://"+addr+"/callback/job-1/status", strings.NewReader(`{"progress":"x"}`))
	req.Header.Set("Authorization", "Bearer dlg_good")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a good request: %v %v", resp, err)
	}
	before := rss()

	const conns, size = 200, 1 << 20
	body := make([]byte, 64<<10)
	for i := range body {
		body[i] = 'x'
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	var held []net.Conn
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				mu.Lock()
				codes["dial: "+err.Error()]++
				mu.Unlock()
				return
			}
			mu.Lock()
			held = append(held, c) // kept open until measured
			mu.Unlock()
			// All of the body but its last byte: a server that reads
			// bodies before it checks tokens holds each, waiting.
			io.WriteString(c, header("dlg_wrong", size))
			for sent := 0; sent < size-1; {
				n := min(len(body), size-1-sent)
				c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write(body[:n]); err != nil {
					break // closed by the server: what a stranger gets
				}
				sent += n
			}
		}()
	}
	wg.Wait()
	// The kernel may still hold what was sent in the sockets' buffers:
	// the most the server holds while it reads them.
	after := rss()
	// The test is of time passing: the memory's peak over two seconds.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		after = max(after, rss())
	}
	for _, c := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(time.Second))
			code := "no answer"
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				code = strconv.Itoa(resp.StatusCode)
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
			c.Close()
		}()
	}
	wg.Wait()
	grew := after - before
	t.Logf("server resident set: %.1f MB before, %.1f MB after %d connections sent %d MiB with a wrong token (+%.1f MB); answers %v",
		float64(before)/1e6, float64(after)/1e6, conns, conns*size>>20, float64(grew)/1e6, codes)
	if grew > 40<<20 {
		t.Errorf("the server grew by %.1f MB, want under 40", float64(grew)/1e6)
	}
	if codes["401"] == 0 {
		t.Errorf("no 401 among the answers: %v", codes)
	}
}
