package httpapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/mock"
)

// bodyServer reads each request's body and reports what happened.
type bodyRead struct {
	n   int
	sum [32]byte
	err error
	at  time.Duration
}

func bodyServer(t *testing.T, idle, total time.Duration) (string, chan bodyRead) {
	t.Helper()
	reads := make(chan bodyRead, 4)
	h := httpapi.BodyTimeout(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		b, err := io.ReadAll(r.Body)
		reads <- bodyRead{n: len(b), sum: sha256.Sum256(b), err: err, at: time.Since(start)}
		if err != nil {
			return
		}
		// Then answer slowly, for longer than both limits: the response
		// is not bounded, and the request is not cancelled under it.
		for i := range 4 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(total / 2):
			}
			fmt.Fprintf(w, "part %d\n", i)
			http.NewResponseController(w).Flush()
		}
	}), idle, total)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadHeaderTimeout = time.Second
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), reads
}

func TestBodyTimeoutPassesAWholeBodyAndAStreamedAnswer(t *testing.T) {
	addr, reads := bodyServer(t, 200*time.Millisecond, 400*time.Millisecond)
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
	resp, err := http.Post("http://"+addr, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := <-reads
	if got.err != nil || got.n != len(body) || got.sum != sha256.Sum256(body) {
		t.Fatalf("server read %d bytes, err %v", got.n, got.err)
	}
	answer, err := io.ReadAll(resp.Body)
	if err != nil || strings.Count(string(answer), "part") != 4 {
		t.Fatalf("the answer streamed past the body limits was cut: %q, %v", answer, err)
	}
}

// rawRequest sends a request's header and then the body in pieces, as a
// slow or malicious client would.
func rawRequest(t *testing.T, addr string, length int, pieces func(w io.Writer) error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", length)
	go pieces(conn)
}

func TestBodyTimeoutCutsAStalledBody(t *testing.T) {
	addr, reads := bodyServer(t, 100*time.Millisecond, 5*time.Second)
	rawRequest(t, addr, 100, func(w io.Writer) error {
		_, err := w.Write([]byte("only ten b"))
		return err // and then nothing
	})
	select {
	case got := <-reads:
		if got.err == nil || got.n != 10 {
			t.Fatalf("read %d bytes, err %v; want the 10 sent and a timeout", got.n, got.err)
		}
		if got.at > 2*time.Second {
			t.Errorf("cut after %s, idle limit 100ms", got.at)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("a stalled body was not cut")
	}
}

func TestBodyTimeoutCutsATrickle(t *testing.T) {
	addr, reads := bodyServer(t, 200*time.Millisecond, 500*time.Millisecond)
	rawRequest(t, addr, 1000, func(w io.Writer) error {
		for range 1000 { // a byte every 50 ms: never idle, never done
			if _, err := w.Write([]byte("x")); err != nil {
				return err
			}
			// The test is of time passing: a client that trickles.
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	})
	select {
	case got := <-reads:
		if got.err == nil {
			t.Fatalf("a trickled body was read whole (%d bytes)", got.n)
		}
		if got.at < 400*time.Millisecond || got.at > 3*time.Second {
			t.Errorf("cut after %s, total limit 500ms", got.at)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a trickled body was not cut")
	}
}

func TestLoopbackOnly(t *testing.T) {
	h := httpapi.LoopbackOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	srv := httptest.NewServer(h) // on 127.0.0.1
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		host string
		code int
	}{
		{"", 200}, // the URL's own 127.0.0.1:port
		{"localhost:8080", 200},
		{"localhost", 200},
		{"[::1]:8080", 200},
		{"app.localhost", 200},
		{"evil.example:8080", 403},
		{"10.0.0.5", 403},
	} {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		if tc.host != "" {
			req.Host = tc.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("Host %q: %d, want %d", tc.host, resp.StatusCode, tc.code)
		}
	}
}

func TestCallbackAnswersAreCounted(t *testing.T) {
	var codes []int
	svc := &mock.CallbackService{CallbackFn: func(ctx context.Context, id, token string, r delegate.Report) (*delegate.Job, error) {
		return &delegate.Job{ID: id, Status: delegate.StatusRunning}, nil
	}, AuthenticateFn: func(ctx context.Context, id, token string) error {
		if token != "dlg_good" {
			return delegate.ErrUnauthenticated
		}
		return nil
	}}
	h := httpapi.Handler(servicesOf(svc), httpapi.Options{Answered: func(code int) { codes = append(codes, code) }})
	for _, tc := range []struct{ token, body string }{
		{"dlg_good", `{"progress":"x"}`},
		{"dlg_bad", `{"progress":"x"}`},
		{"", `{"progress":"x"}`},
		{"dlg_good", `not json`},
	} {
		req := httptest.NewRequest("POST", "/callback/job-1/status", strings.NewReader(tc.body))
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/health", nil)) // not a callback
	want := []int{200, 401, 401, 400}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("counted %v, want %v", codes, want)
	}
}
