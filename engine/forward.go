package engine

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delegate-dev/delegate"
)

// forwarder sends a command for a local kept sandbox that a server of
// another host holds to that server (delegate.ForwardService says how),
// and takes the ones other servers send here. Only the submission
// crosses: the job is stored by the holder, in the store every server
// reads, so its output, its status, wait_job and its end reach the client
// through the server it asked, and a cancel_job there reaches the holder
// as any cancel of a job another server drives does (the store's
// notification of the job's end).
//
// The servers trust each other by a secret kept in the store (made by the
// first server that needs it): a request is signed with it, names the
// server it is meant for (a restarted server is another incarnation, and
// refuses what was meant for its predecessor), and the time it was sent on
// the store's clock, which each server knows its offset from; a request
// older than forwardWindow, or seen before, is refused, so that one
// overheard cannot be replayed. Who may send is whoever reads the store,
// which could do anything a server does anyway.
type forwarder struct {
	// (Its fields' names are its own: the engine embeds it.)
	holders   *leaser
	jobStore  delegate.Store
	fwdLog    *slog.Logger
	fwdClient *http.Client
	// submitAs is the engine's Submit, which a forwarded request goes
	// through as the principal that sent it.
	submitAs func(context.Context, delegate.Manifest, delegate.SubmitOptions) (*delegate.Job, error)

	fwdSecret atomic.Pointer[[]byte] // the store's; nil: nothing is forwarded, or taken

	seenMu   sync.Mutex
	seenReqs map[string]time.Time // requests taken, and until when each could be replayed (the store's clock)
}

var _ delegate.ForwardService = (*forwarder)(nil)

const (
	// forwardWindow: a forwarded request sent longer ago than this (on
	// the store's clock) is refused, and the ones taken are remembered
	// this long.
	forwardWindow = time.Minute
	// forwardTimeout bounds one forwarded submission (the holder stores
	// the job and answers; it does not wait for the command), and so
	// does the lease's length: a holder that cannot answer within it is
	// as good as gone.
	forwardTimeout = time.Minute
	// forwardSecret is the secret's name in the store.
	forwardSecret = "forward-secret"
)

// forwardRequest is what a server sends the holder of a kept sandbox.
type forwardRequest struct {
	ID    string `json:"id"`
	JobID string `json:"job_id"` // chosen by the sender: it finds the job if the answer is lost
	From  string `json:"from"`
	To    string `json:"to"`
	// At is when it was sent, on the store's clock.
	At time.Time `json:"at"`
	// Principal is the original request's (nil: the server's own
	// operator, as on stdio).
	Principal      *delegate.Principal `json:"principal,omitempty"`
	Manifest       delegate.Manifest   `json:"manifest"`
	IdempotencyKey string              `json:"idempotency_key,omitempty"`
}

// clusterValues is a store that keeps values every server of it shares
// (PostgreSQL's).
type clusterValues interface {
	ClusterValue(ctx context.Context, name string, fresh func() string) (string, error)
}

func newForwarder(l *leaser, store delegate.Store, log *slog.Logger) *forwarder {
	timeout := forwardTimeout
	if l != nil {
		timeout = min(timeout, l.cfg.TTL)
	}
	return &forwarder{holders: l, jobStore: store, fwdLog: log, seenReqs: make(map[string]time.Time),
		fwdClient: &http.Client{
			Timeout: timeout,
			// The holder answers; a redirect is not an answer.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}}
}

// start reads the store's secret (made by the first server): forwarding
// is on from then, where servers share a store that keeps one.
func (f *forwarder) start(ctx context.Context) error {
	cv, ok := f.jobStore.(clusterValues)
	if f.holders == nil || !ok {
		return nil
	}
	s, err := cv.ClusterValue(ctx, forwardSecret, func() string {
		var b [32]byte
		rand.Read(b[:])
		return hex.EncodeToString(b[:])
	})
	if err != nil {
		return fmt.Errorf("the servers' shared secret: %w", err)
	}
	key := []byte(s)
	f.fwdSecret.Store(&key)
	return nil
}

// mac is body's signature.
func (f *forwarder) mac(body []byte) []byte {
	mac := hmac.New(sha256.New, *f.fwdSecret.Load())
	mac.Write(body)
	return mac.Sum(nil)
}

// key is the key of a request meant for server to, sent at at (the
// store's clock): "SECONDS.MAC", where MAC signs both. It is good for
// forwardWindow: one overheard (on a listener without TLS) does not let
// a stranger make the holder read bodies for the rest of its life.
func (f *forwarder) key(to string, at time.Time) string {
	sec := strconv.FormatInt(at.Unix(), 10)
	return sec + "." + hex.EncodeToString(f.mac([]byte("to "+to+" at "+sec)))
}

// keyFresh checks a request's key: this server's, made within
// forwardWindow of now on the store's clock.
func (f *forwarder) keyFresh(key string) bool {
	sec, _, ok := strings.Cut(key, ".")
	at, err := strconv.ParseInt(sec, 10, 64)
	if !ok || err != nil {
		return false
	}
	if d := f.holders.now().Sub(time.Unix(at, 0)); d > forwardWindow || d < -forwardWindow {
		return false
	}
	return hmac.Equal([]byte(key), []byte(f.key(f.holders.me.ID, time.Unix(at, 0))))
}

type forwardedKey struct{}

// forwardedOf is the forwarded request ctx submits (nil: not forwarded).
func forwardedOf(ctx context.Context) *forwardRequest {
	r, _ := ctx.Value(forwardedKey{}).(*forwardRequest)
	return r
}

// send forwards a command for a kept sandbox to holder, the server that
// holds it, and returns the job it stored. refusal is what the client is
// told when it cannot be (forwarding off, the holder has no address, or
// it does not answer): today's refusal, naming the server.
func (f *forwarder) send(ctx context.Context, holder delegate.Server, m delegate.Manifest, opts delegate.SubmitOptions, refusal *delegate.FieldError) (*delegate.Job, error) {
	if f.fwdSecret.Load() == nil || holder.Addr == "" || forwardedOf(ctx) != nil {
		return nil, refusal // a forwarded command is never forwarded again
	}
	var id [12]byte
	rand.Read(id[:])
	req := forwardRequest{ID: hex.EncodeToString(id[:]), JobID: newJobID(), From: f.holders.me.ID, To: holder.ID, At: f.holders.now(),
		Principal: delegate.PrincipalOf(ctx), Manifest: m, IdempotencyKey: opts.IdempotencyKey}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("forward the command: %w", err)
	}
	log := f.fwdLog.With("sandbox", m.Sandbox, "to", holder.ID, "addr", holder.Addr, "job", req.JobID)
	ans, err := f.post(ctx, holder.Addr, holder.ID, body)
	if err != nil {
		// The answer may be what was lost: the job then is in the store.
		if job, gerr := f.jobStore.GetJob(context.WithoutCancel(ctx), req.JobID); gerr == nil {
			log.Info("forwarded a command; its answer was lost, its job is stored", "err", err)
			return job, nil
		}
		log.Warn("forward a command to the server that holds its sandbox", "err", err)
		return nil, &delegate.FieldError{Field: refusal.Field, Rule: fmt.Sprintf("%s (it was forwarded there, and %s did not answer: %v)",
			refusal.Rule, holder.Addr, err)}
	}
	if ans.Error != "" {
		kind := delegate.ParseKind(ans.Kind)
		return nil, &forwardError{server: holder.ID, msg: ans.Error, kind: kind.Sentinel()}
	}
	job, err := f.jobStore.GetJob(ctx, ans.JobID)
	if err != nil {
		return nil, fmt.Errorf("the job %s that server %s stored: %w", ans.JobID, holder.ID, err)
	}
	log.Info("command forwarded to the server that holds its sandbox")
	return job, nil
}

// post sends a signed request to server to at addr and reads its answer.
func (f *forwarder) post(ctx context.Context, addr, to string, body []byte) (delegate.ForwardAnswer, error) {
	var ans delegate.ForwardAnswer
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(addr, "/")+delegate.ForwardPath, bytes.NewReader(body))
	if err != nil {
		return ans, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set(delegate.ForwardSignatureHeader, hex.EncodeToString(f.mac(body)))
	hreq.Header.Set(delegate.ForwardKeyHeader, f.key(to, f.holders.now()))
	resp, err := f.fwdClient.Do(hreq)
	if err != nil {
		return ans, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return ans, err
	}
	if err := json.Unmarshal(raw, &ans); err != nil || ans.JobID == "" && ans.Error == "" {
		return ans, fmt.Errorf("HTTP %d, not a server's answer: %.200q", resp.StatusCode, raw)
	}
	return ans, nil
}

// forwardError is the holder's refusal of a forwarded command, of the
// kind it said.
type forwardError struct {
	server, msg string
	kind        error // nil: internal
}

func (e *forwardError) Error() string {
	return e.msg + " (said server " + e.server + ", which holds the sandbox)"
}
func (e *forwardError) Unwrap() error { return e.kind }

// unsigned refuses a forwarded request whose sender is not proven (it is
// of kind unauthenticated, in its own words: no job token is involved).
type unsigned struct{ msg string }

func (e *unsigned) Error() string { return e.msg }
func (e *unsigned) Unwrap() error { return delegate.ErrUnauthenticated }

// AcceptForward takes a command another server forwarded here
// (delegate.ForwardService).
func (f *forwarder) AcceptForward(ctx context.Context, key, signature string, r io.Reader) (*delegate.Job, error) {
	if f.fwdSecret.Load() == nil {
		return nil, &unsigned{"this server shares no store with other servers, and takes no forwarded command"}
	}
	// The key first: a sender that does not know the secret is turned
	// away before its body is read.
	if !f.keyFresh(key) {
		return nil, &unsigned{"a forwarded command: its key is not this server's by the store's secret, or not made within " + forwardWindow.String() +
			" on the store's clock (or it was meant for a server that stopped): send it again"}
	}
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("a forwarded command's request could not be read whole: %v: %w", err, delegate.ErrInvalid)
	}
	want, err := hex.DecodeString(signature)
	if err != nil || !hmac.Equal(want, f.mac(body)) {
		return nil, &unsigned{"a forwarded command: its signature is not the store's secret's"}
	}
	var req forwardRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("a forwarded command: %v: %w", err, delegate.ErrInvalid)
	}
	if err := f.admit(&req); err != nil {
		return nil, err
	}
	// The principal's scopes, as /mcp checks them for a command in a
	// sandbox; its right to the sandbox is the store's read of it, as
	// the principal (Submit).
	if p := req.Principal; p != nil {
		for _, sc := range []delegate.Scope{delegate.ScopeJobs, delegate.ScopeSandboxes} {
			if err := p.Need(sc, "a job in a sandbox"); err != nil {
				return nil, err
			}
		}
		ctx = delegate.WithPrincipal(ctx, p)
	}
	f.fwdLog.Info("command forwarded here by another server", "from", req.From, "job", req.JobID, "sandbox", req.Manifest.Sandbox,
		"principal", req.Principal.String())
	return f.submitAs(context.WithValue(ctx, forwardedKey{}, &req), req.Manifest, delegate.SubmitOptions{IdempotencyKey: req.IdempotencyKey})
}

// admit refuses a request meant for another server, one too old (or from
// the future), and one seen before; and remembers it.
func (f *forwarder) admit(req *forwardRequest) error {
	if req.To != f.holders.me.ID {
		return fmt.Errorf("a forwarded command was meant for server %s; this is %s (that one stopped): send it again: %w",
			req.To, f.holders.me.ID, delegate.ErrConflict)
	}
	if !validJobID(req.JobID) || req.ID == "" {
		return fmt.Errorf("a forwarded command: no request id, or job id %q is not one: %w", req.JobID, delegate.ErrInvalid)
	}
	now := f.holders.now()
	if d := now.Sub(req.At); d > forwardWindow || d < -forwardWindow {
		return &unsigned{fmt.Sprintf("a forwarded command sent at %s, %s from now on the store's clock (more than %s): send it again",
			req.At.Format(time.RFC3339), d.Round(time.Second), forwardWindow)}
	}
	f.seenMu.Lock()
	defer f.seenMu.Unlock()
	for id, until := range f.seenReqs {
		if now.After(until) {
			delete(f.seenReqs, id)
		}
	}
	if _, ok := f.seenReqs[req.ID]; ok {
		return fmt.Errorf("forwarded command %s was taken already: %w", req.ID, delegate.ErrConflict)
	}
	f.seenReqs[req.ID] = req.At.Add(2 * forwardWindow)
	return nil
}

// validJobID says whether id is of newJobID's form.
func validJobID(id string) bool {
	rest, ok := strings.CutPrefix(id, "job-")
	if !ok || len(rest) != 16 {
		return false
	}
	for _, c := range rest {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}
