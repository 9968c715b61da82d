package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpapi"
)

// forwardTaker takes a body "ok" signed "sig" with key "key"; refuses
// the rest by what they say.
type forwardTaker struct{}

func (forwardTaker) AcceptForward(_ context.Context, key, sig string, r io.Reader) (*delegate.Job, error) {
	if key != "key" {
		return nil, fmt.Errorf("a forwarded command: its key is not this server's (%w)", delegate.ErrUnauthenticated)
	}
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("a forwarded command's request could not be read whole: %v: %w", err, delegate.ErrInvalid)
	}
	switch {
	case sig != "sig":
		return nil, fmt.Errorf("a forwarded command: its signature is not the store's secret's (%w)", delegate.ErrUnauthenticated)
	case string(body) == "ok":
		return &delegate.Job{ID: "job-a"}, nil
	case string(body) == "busy":
		return nil, &delegate.FieldError{Field: "manifest.sandbox", Rule: "sandbox sbx-1 runs 8 commands"}
	}
	return nil, fmt.Errorf("the store broke")
}

// TestForwardHandler: a forwarded command's answer is the job's id, or
// the refusal's kind (which the sending server turns back into an error
// of that kind) and words, with the kind's status; an error of no kind is
// a 500 whose words are still the server's.
func TestForwardHandler(t *testing.T) {
	srv := httptest.NewServer(httpapi.ForwardHandler(forwardTaker{}, nil))
	defer srv.Close()
	for _, c := range []struct {
		body, sig string
		code      int
		want      delegate.ForwardAnswer
	}{
		{"ok", "sig", http.StatusOK, delegate.ForwardAnswer{JobID: "job-a"}},
		{"ok", "forged", http.StatusUnauthorized, delegate.ForwardAnswer{Kind: "unauthenticated",
			Error: "a forwarded command: its signature is not the store's secret's (missing or unknown job token)"}},
		{"busy", "sig", http.StatusBadRequest, delegate.ForwardAnswer{Kind: "invalid", Error: "manifest.sandbox: sandbox sbx-1 runs 8 commands"}},
		{"broken", "sig", http.StatusInternalServerError, delegate.ForwardAnswer{Kind: "internal", Error: "the store broke"}},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+delegate.ForwardPath, strings.NewReader(c.body))
		req.Header.Set(delegate.ForwardSignatureHeader, c.sig)
		req.Header.Set(delegate.ForwardKeyHeader, "key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got delegate.ForwardAnswer
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.code || got != c.want {
			t.Errorf("%s signed %s: %d %+v (%v), want %d %+v", c.body, c.sig, resp.StatusCode, got, err, c.code, c.want)
		}
	}
}
