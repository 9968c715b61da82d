package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpapi"
)

// oneTransfer is a transfer "t1" for job-a, GET, token "tok", claimed once.
type oneTransfer struct{ claimed int }

func (o *oneTransfer) Claim(id, method, token string) (string, http.HandlerFunc, error) {
	if id != "t1" || method != http.MethodGet || token != "tok" || o.claimed > 0 {
		return "", nil, fmt.Errorf("transfer %s: %w", id, delegate.ErrUnauthenticated)
	}
	o.claimed++
	return "job-a", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the archive") }, nil
}

// TestTransfers: GET and PUT /transfer/{id} are served by the
// Transfers with the request's bearer token; a missing token, or one
// the transfer refuses, is 401 with the connection closed, the same for
// an unknown transfer and a used one; without Transfers, 404.
func TestTransfers(t *testing.T) {
	tr := &oneTransfer{}
	h := httpapi.Handler(httpapi.Services{Callbacks: strictService(), Transfers: tr}, httpapi.Options{})
	do := func(method, path, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(""))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	for _, c := range []struct{ method, path, token string }{
		{"GET", "/transfer/t1", ""},
		{"GET", "/transfer/t1", "bad"},
		{"PUT", "/transfer/t1", "tok"},
		{"GET", "/transfer/t2", "tok"},
	} {
		if w := do(c.method, c.path, c.token); w.Code != http.StatusUnauthorized || w.Header().Get("Connection") != "close" {
			t.Errorf("%+v: %d %q", c, w.Code, w.Body)
		}
	}
	if w := do("GET", "/transfer/t1", "tok"); w.Code != http.StatusOK || w.Body.String() != "the archive" {
		t.Errorf("the transfer: %d %q", w.Code, w.Body)
	}
	if w := do("GET", "/transfer/t1", "tok"); w.Code != http.StatusUnauthorized {
		t.Errorf("claimed twice: %d %q", w.Code, w.Body)
	}
	if w := do("DELETE", "/transfer/t1", "tok"); w.Code == http.StatusOK {
		t.Errorf("DELETE: %d", w.Code)
	}
	plain := httpapi.Handler(httpapi.Services{Callbacks: strictService()}, httpapi.Options{})
	w := httptest.NewRecorder()
	plain.ServeHTTP(w, httptest.NewRequest("GET", "/transfer/t1", nil))
	if w.Code != http.StatusNotFound {
		t.Errorf("without Transfers: %d", w.Code)
	}
}
