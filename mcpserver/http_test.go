package mcpserver

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// TestLimitBodies: what reaches the SDK's HTTP handler, and what is
// answered before it with a JSON-RPC error (which the SDK clients read
// from the body of an HTTP error).
func TestLimitBodies(t *testing.T) {
	const limit = 1 << 20
	var got []byte
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		if r.ContentLength != int64(len(got)) {
			t.Errorf("Content-Length %d for a body of %d", r.ContentLength, len(got))
		}
		w.WriteHeader(http.StatusAccepted)
	})
	srv := httptest.NewServer(limitBodies(next, Limits{MaxMessage: limit}, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	big := strings.Repeat("a", limit)
	tests := []struct {
		name    string
		body    io.Reader
		status  int
		id      string
		code    int64
		message string
	}{
		{"fits", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":"` + big[:limit-80] + `"}}`), http.StatusAccepted, "", 0, ""},
		{"too large", strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"x":"` + big + `"}}`),
			http.StatusRequestEntityTooLarge, "2", jsonrpc.CodeInvalidRequest, "request too large: 1048640 bytes, over delegate's limit of 1048576 bytes"},
		{"too large, id last", strings.NewReader(`{"jsonrpc":"2.0","method":"tools/call","params":{"x":"` + big + `"},"id":"last"}`),
			http.StatusRequestEntityTooLarge, `"last"`, jsonrpc.CodeInvalidRequest, "request too large"},
		{"too large, no length", io.MultiReader(strings.NewReader(`{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"x":"`), strings.NewReader(big), strings.NewReader(`"}}`)),
			http.StatusRequestEntityTooLarge, `"c"`, jsonrpc.CodeInvalidRequest, "more than 1048576 bytes, over delegate's limit of 1048576 bytes (1 MiB"},
		{"duplicate key", strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","name":"b"}}`),
			http.StatusBadRequest, "3", jsonrpc.CodeInvalidParams, "params.name: duplicate key"},
		{"not JSON", strings.NewReader(`{"jsonrpc":`), http.StatusBadRequest, "null", jsonrpc.CodeParseError, "not valid JSON"},
		{"batch with a duplicate", strings.NewReader(`[{"jsonrpc":"2.0","id":4,"method":"ping","id":5}]`), http.StatusBadRequest, "null", jsonrpc.CodeInvalidRequest, "[0].id: duplicate key"},
		{"batch", strings.NewReader(`[{"jsonrpc":"2.0","id":4,"method":"ping"}]`), http.StatusAccepted, "", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			var sent bytes.Buffer
			var body io.Reader = struct{ io.Reader }{io.TeeReader(tc.body, &sent)} // no length: chunked
			if _, ok := tc.body.(*strings.Reader); ok {
				io.Copy(&sent, tc.body)
				body = bytes.NewReader(sent.Bytes()) // with a Content-Length
			}
			req, _ := http.NewRequest(http.MethodPost, srv.URL, body)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, data, tc.status)
			}
			if tc.code == 0 {
				if !bytes.Equal(got, sent.Bytes()) {
					t.Errorf("the handler got %d bytes of %d sent", len(got), sent.Len())
				}
				return
			}
			if got != nil {
				t.Error("the handler was called")
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var r struct {
				JSONRPC string
				ID      json.RawMessage
				Error   jsonrpc.Error
			}
			if err := json.Unmarshal(data, &r); err != nil || r.JSONRPC != "2.0" || r.Error.Code != tc.code || !strings.Contains(r.Error.Message, tc.message) {
				t.Fatalf("body %s is not a JSON-RPC error %d saying %q (%v)", data, tc.code, tc.message, err)
			}
			if tc.id != "" && string(r.ID) != tc.id {
				t.Errorf("id %s, want %s", r.ID, tc.id)
			}
			if string(r.ID) != "null" {
				// With an id, the Go SDK's client reads it as the error of the call.
				if msg, err := jsonrpc.DecodeMessage(data); err != nil || msg.(*jsonrpc.Response).Error == nil {
					t.Errorf("the SDK reads %s as %v, %v", data, msg, err)
				}
			}
		})
	}
}

// TestLimitBodiesInFlight: bodies past the bound wait until earlier ones
// are handled.
func TestLimitBodiesInFlight(t *testing.T) {
	release := make(chan struct{})
	var handling atomic.Int32
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handling.Add(1)
		<-release
		w.WriteHeader(http.StatusAccepted)
	})
	srv := httptest.NewServer(limitBodies(next, Limits{MaxMessage: 1 << 20, InFlight: 1 << 20}, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	body := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + strings.Repeat("a", 600<<10) + `"}}`
	done := make(chan int, 2)
	post := func() {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}
	go post()
	testkit.Eventually(t, 10*time.Second, "the first request handled", func() bool { return handling.Load() == 1 })
	go post()
	// What no event announces: a second request that should not be
	// handled. A moment for it to be, if the bound let it.
	time.Sleep(300 * time.Millisecond)
	if n := handling.Load(); n != 1 {
		t.Fatalf("%d requests of 600 KiB handled at once under a 1 MiB bound", n)
	}
	close(release)
	for range 2 {
		select {
		case code := <-done:
			if code != http.StatusAccepted {
				t.Errorf("status %d", code)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a request never finished")
		}
	}
}
