package proxmox

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// TestTransferClaims: a transfer's token opens that transfer, once, for
// its method alone, and not once it ended; a claim says the job.
func TestTransferClaims(t *testing.T) {
	x, off, err := newTransfers("http://10.0.0.7:8765/", time.Second, slog.New(slog.DiscardHandler))
	if err != nil || x == nil {
		t.Fatal(off, err)
	}
	serve := func(http.ResponseWriter, *http.Request) {}
	tr, link, header := x.begin("job-a", http.MethodGet, serve)
	if !strings.HasPrefix(link, "http://10.0.0.7:8765/transfer/") || strings.Contains(link, "Bearer") {
		t.Errorf("link %s", link)
	}
	token := strings.TrimSuffix(strings.TrimPrefix(string(header), "Authorization: Bearer "), "\n")
	id := strings.TrimPrefix(link, "http://10.0.0.7:8765/transfer/")
	for _, c := range []struct{ id, method, token string }{
		{id, http.MethodGet, token + "x"},
		{id, http.MethodPut, token},
		{"0" + id[1:], http.MethodGet, token},
		{id, http.MethodGet, ""},
	} {
		if _, _, err := x.Claim(c.id, c.method, c.token); !errors.Is(err, delegate.ErrUnauthenticated) {
			t.Errorf("claim %+v: %v", c, err)
		}
	}
	job, h, err := x.Claim(id, http.MethodGet, token)
	if err != nil || job != "job-a" || h == nil {
		t.Fatalf("claim: %q %v", job, err)
	}
	select {
	case <-tr.claimed:
	default:
		t.Error("the claim was not told")
	}
	if _, _, err := x.Claim(id, http.MethodGet, token); err == nil {
		t.Error("claimed twice")
	}
	if !x.end(tr) {
		t.Error("end does not know it was claimed")
	}
	tr2, link2, header2 := x.begin("job-b", http.MethodPut, serve)
	if x.end(tr2) {
		t.Error("an unclaimed transfer ended as claimed")
	}
	tok2 := strings.TrimSuffix(strings.TrimPrefix(string(header2), "Authorization: Bearer "), "\n")
	if _, _, err := x.Claim(strings.TrimPrefix(link2, "http://10.0.0.7:8765/transfer/"), http.MethodPut, tok2); err == nil {
		t.Error("an ended transfer was claimed")
	}
}
