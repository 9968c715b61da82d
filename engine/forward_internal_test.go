package engine

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
)

// TestAcceptForward: the holder of a kept sandbox takes a forwarded
// command only when it is signed with the store's secret, meant for this
// server (not a predecessor), sent within the window on the store's clock
// and not seen before; the principal it names must have the scopes a
// command in a sandbox needs, and the command is submitted as that
// principal, with the sender's job id. A request without the key of this
// server is turned away before its body is read.
func TestAcceptForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := testkit.OpenStore(t)
	l := newLeaser(Leases{TTL: time.Minute, HostID: "host-a"}, store, discardLogger, "here/1/2/3", "local", func(string) bool { return true })
	if err := l.register(ctx); err != nil {
		t.Fatal(err)
	}
	f := newForwarder(l, store, discardLogger)
	type took struct {
		principal *delegate.Principal
		fwd       *forwardRequest
		m         delegate.Manifest
	}
	var got []took
	f.submitAs = func(ctx context.Context, m delegate.Manifest, _ delegate.SubmitOptions) (*delegate.Job, error) {
		got = append(got, took{delegate.PrincipalOf(ctx), forwardedOf(ctx), m})
		return &delegate.Job{ID: forwardedOf(ctx).JobID}, nil
	}
	accept := func(key, sig string, body []byte) (*delegate.Job, error) {
		return f.AcceptForward(ctx, key, sig, bytes.NewReader(body))
	}
	if _, err := accept("", "", []byte("{}")); !errors.Is(err, delegate.ErrUnauthenticated) {
		t.Fatalf("without the store's secret: %v", err)
	}
	secret := []byte("the store's secret")
	f.fwdSecret.Store(&secret)
	alice := &delegate.Principal{Name: "alice", Scopes: []delegate.Scope{delegate.ScopeJobs, delegate.ScopeSandboxes}}
	request := func(change func(*forwardRequest)) []byte {
		r := forwardRequest{ID: newJobID(), JobID: newJobID(), From: "there/4/5/6", To: "here/1/2/3", At: l.now(), Principal: alice,
			Manifest: delegate.Manifest{Task: "make test", Sandbox: "sb-1"}}
		if change != nil {
			change(&r)
		}
		b, _ := json.Marshal(r)
		return b
	}
	sign := func(b []byte) string { return hex.EncodeToString(f.mac(b)) }
	key := f.key("here/1/2/3", l.now())
	good := request(nil)
	job, err := accept(key, sign(good), good)
	if err != nil || len(got) != 1 || got[0].principal.Name != "alice" || got[0].fwd == nil || got[0].fwd.JobID != job.ID ||
		got[0].m.Task != "make test" || got[0].m.Sandbox != "sb-1" {
		t.Fatalf("a good request: %v, %+v", err, got)
	}
	other := []byte("another secret")
	// Without the key (or the key of another server), the body is not
	// even read.
	// Nor with one made longer ago than the window (overheard).
	for _, k := range []string{"", "00", flipLast(key), f.key("here/1/2/0", l.now()), f.key("here/1/2/3", l.now().Add(-2*forwardWindow)),
		f.key("here/1/2/3", l.now().Add(2*forwardWindow))} {
		body := &countingReader{r: bytes.NewReader(request(nil))}
		if _, err := f.AcceptForward(ctx, k, sign(request(nil)), body); !errors.Is(err, delegate.ErrUnauthenticated) || body.n != 0 {
			t.Errorf("key %q: %v, %d bytes read", k, err, body.n)
		}
	}
	for _, c := range []struct {
		name string
		body []byte
		sig  func([]byte) string
		kind error
		want string
	}{
		{"replayed", good, sign, delegate.ErrConflict, "was taken already"},
		{"unsigned", request(nil), func([]byte) string { return "" }, delegate.ErrUnauthenticated, "signature"},
		{"signed with another secret", request(nil), func(b []byte) string {
			g := newForwarder(l, store, discardLogger)
			g.fwdSecret.Store(&other)
			return hex.EncodeToString(g.mac(b))
		}, delegate.ErrUnauthenticated, "signature"},
		{"changed after it was signed", []byte(strings.Replace(string(good), "make test", "rm -rf /", 1)), func([]byte) string { return sign(good) },
			delegate.ErrUnauthenticated, "signature"},
		{"for a predecessor", request(func(r *forwardRequest) { r.To = "here/1/2/0" }), sign, delegate.ErrConflict, "was meant for server here/1/2/0"},
		{"stale", request(func(r *forwardRequest) { r.At = r.At.Add(-2 * forwardWindow) }), sign, delegate.ErrUnauthenticated, "on the store's clock"},
		{"from the future", request(func(r *forwardRequest) { r.At = r.At.Add(2 * forwardWindow) }), sign, delegate.ErrUnauthenticated, "on the store's clock"},
		{"a bad job id", request(func(r *forwardRequest) { r.JobID = "job-../../x" }), sign, delegate.ErrInvalid, "is not one"},
		{"a principal without the sandboxes scope", request(func(r *forwardRequest) {
			r.Principal = &delegate.Principal{Name: "bob", Scopes: []delegate.Scope{delegate.ScopeJobs}}
		}), sign, delegate.ErrForbidden, "bob's token"},
	} {
		_, err := accept(key, c.sig(c.body), c.body)
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.kind, c.want)
		}
	}
	if len(got) != 1 {
		t.Errorf("%d submitted, want the good one only", len(got))
	}
	// A refusal crosses back by its kind: the sender's error wraps the
	// same sentinel, in the holder's words.
	fe := &forwardError{server: "here/1/2/3", msg: "manifest.sandbox: no", kind: delegate.ParseKind(delegate.KindInvalid.String()).Sentinel()}
	if delegate.ErrorKind(fe) != delegate.KindInvalid || !strings.Contains(fe.Error(), "manifest.sandbox: no") {
		t.Errorf("a refusal of kind invalid: %v is %v", fe, delegate.ErrorKind(fe))
	}
}

// flipLast is s with its last character changed.
func flipLast(s string) string {
	if strings.HasSuffix(s, "0") {
		return s[:len(s)-1] + "1"
	}
	return s[:len(s)-1] + "0"
}

// countingReader counts what is read of r.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
