package proxmox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// The workspace over HTTP. Through the guest agent a file travels in
// agent/file-write calls of 45 KiB each: a 100 MB archive is some 2,300
// calls, minutes at a real cluster's latencies. A job VM with a network
// reaches delegate's callback server (its firewall lets it, egress.go),
// so there the guest fetches the workspace's archive from it, and sends
// the workspace back to it, over HTTP, with curl: a few agent calls
// whatever the size. Each transfer is opened by a token of its own:
//
//   - single-purpose: it opens one transfer, in one direction (GET the
//     archive into the guest, or PUT the workspace out of it), and
//     nothing else; not the job's callback token, which reports the job
//     done;
//   - used once: the first request with it claims the transfer, a second
//     is refused;
//   - short-lived: the transfer exists only while the call that opened
//     it (PutArchive, GetArchive) waits for the guest, seconds;
//   - never in an argument list: the guest agent logs every exec's
//     arguments to the guest's journal, so curl reads the header from
//     its standard input (agent/exec's input-data).
//
// What travels is checked: the guest's sha256sum and size of what it got
// (or sent) against the server's of what it sent (or got), before the
// archive is unpacked (or its end handed on). Nothing is held whole in
// memory: the archive is made as the guest reads it, and the guest's is
// read as it arrives.
//
// Where the guest cannot reach the server (a VM without a NIC, as every
// job without network and every warm-pool VM; a network that does not
// route to it; a guest without curl) the workspace goes through the
// agent as before, and the log says why. A transfer cut off after it
// began cannot fall back (the archive was read as it went): it fails.

// Transfers are the open transfers of a backend (Config.TransferURL),
// which the callback server serves at GET and PUT /transfer/{id}
// (httpapi.Transfers).
type Transfers struct {
	base string        // the callback server's URL as job VMs reach it, no trailing slash
	poll time.Duration // the longest wait between polls of the guest's side
	log  *slog.Logger

	mu   sync.Mutex
	open map[string]*transfer
}

// transfer is one open transfer, until claimed or ended.
type transfer struct {
	id, job, method string
	what            string            // what travels, for the log: "workspace in"
	token           [sha256.Size]byte // the token's hash: the token itself is not kept
	serve           http.HandlerFunc
	claimed         chan struct{} // closed by Claim
}

// errTransferClosed: a transfer's reader was closed before its end.
var errTransferClosed = errors.New("the transfer's reader was closed")

// newTransfers checks the URL job VMs reach the callback server at. A
// loopback URL is none: a guest's loopback is its own.
func newTransfers(raw string, poll time.Duration, log *slog.Logger) (*Transfers, string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, "", fmt.Errorf("proxmox: the transfer URL %q must be the callback server's http:// or https:// URL as job VMs reach it, without user, query or fragment", raw)
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); (err == nil && a.IsLoopback()) || host == "localhost" {
		return nil, fmt.Sprintf("the callback URL %s is a loopback address, which a VM cannot reach", raw), nil
	}
	return &Transfers{base: strings.TrimRight(raw, "/"), poll: poll, log: log, open: map[string]*transfer{}}, "", nil
}

// Claim implements httpapi.Transfers.
func (t *Transfers) Claim(id, method, token string) (string, http.HandlerFunc, error) {
	sum := sha256.Sum256([]byte(token))
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := t.open[id]
	if tr == nil || tr.method != method || subtle.ConstantTimeCompare(sum[:], tr.token[:]) != 1 {
		return "", nil, fmt.Errorf("transfer %q: %w", id, delegate.ErrUnauthenticated)
	}
	delete(t.open, id)
	close(tr.claimed)
	return tr.job, tr.serve, nil
}

// begin opens a transfer of what for job: its URL and the header line
// that carries its token.
func (t *Transfers) begin(job, method, what string, serve http.HandlerFunc) (tr *transfer, link string, header []byte) {
	var id [16]byte
	var token [32]byte
	rand.Read(id[:])
	rand.Read(token[:])
	tok := hex.EncodeToString(token[:])
	tr = &transfer{id: hex.EncodeToString(id[:]), job: job, method: method, what: what, token: sha256.Sum256([]byte(tok)), serve: serve, claimed: make(chan struct{})}
	t.mu.Lock()
	t.open[tr.id] = tr
	t.mu.Unlock()
	return tr, t.base + "/transfer/" + tr.id, []byte("Authorization: Bearer " + tok + "\n")
}

// end closes a transfer no one claimed; it says whether one had.
func (t *Transfers) end(tr *transfer) (claimed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open[tr.id] == tr {
		delete(t.open, tr.id)
		return false
	}
	return true
}

// Transfers is what the callback server serves for this backend at
// /transfer/{id} (httpapi.Services.Transfers); nil without a transfer
// URL (Config.TransferURL), when workspaces go through the agent alone.
func (b *Backend) Transfers() *Transfers { return b.xfers }

// The guest's side. Both find curl on sandbox.DefaultPath (the PATH of
// jobs, docs/PROXMOX.md), read the Authorization header from standard
// input (curl -H @-), give up connecting after 5 s, and exit 127 when
// the guest has no curl. Constants: the URL and the file are arguments.
const (
	xferPath = `PATH=` + sandbox.DefaultPath + `; export PATH
command -v curl >/dev/null 2>&1 || { echo "delegate: the guest has no curl" >&2; exit 127; }
umask 077
`
	// fetchScript fetches $0 into the file $1, then prints its sha256
	// and size; what a failed fetch left is removed.
	fetchScript = xferPath + `mkdir -p -m 0755 -- "${1%/*}" || exit 1
curl -fsS --connect-timeout 5 -H @- -o "$1" "$0" || { rc=$?; rm -f -- "$1"; exit $rc; }
s=$(sha256sum <"$1") && n=$(wc -c <"$1") && echo "${s%% *} $n"`
	// sendScript sends the file $1 to $0 (PUT), and removes it once it
	// was taken; a failed send leaves it, to go through the agent.
	sendScript = xferPath + `curl -fsS --connect-timeout 5 -H @- -T "$1" "$0" && rm -f -- "$1"`
)

// guest is what a transfer needs of a VM: to start a command in it (with
// standard input), and to follow it.
type guest interface {
	start(ctx context.Context, argv []string, stdin []byte) (int, error)
	status(ctx context.Context, pid int, name string) (result, bool, error)
	wait(ctx context.Context, pid int, name string) (result, error)
	run(ctx context.Context, argv []string) (result, error)
}

// viaHTTP says whether the workspace should travel over HTTP: the
// server serves transfers, and the VM has a NIC to reach it with.
func viaHTTP(s *vmSandbox) (*Transfers, string) {
	switch {
	case s.b.xfers == nil:
		return nil, s.b.xferOff
	case !s.nic:
		return nil, "the VM has no network (a job without network, or a warm-pool VM)"
	}
	return s.b.xfers, ""
}

// agentPath logs that what ("workspace in", "files out") goes through
// the agent, and why.
func agentPath(log *slog.Logger, level slog.Level, what string, vmid int, job, why string) {
	log.Log(context.Background(), level, what+" through the guest agent", "vmid", vmid, "job", job, "why", why)
}

// sentArchive is what the HTTP handler of a PutArchive sent.
type sentArchive struct {
	res sandbox.Unpacked
	n   int64
	sum string
	err error
}

// putHTTP makes the archive as the guest fetches it into file (check:
// checked and packed on the way, writeArchive; else r is the server's
// own archive, a fork's, sent as it is). used false: the guest never
// asked for it (nothing of r was read), and the workspace should go
// through the agent.
func (t *Transfers) put(ctx context.Context, g guest, vmid int, job string, r io.Reader, file string, check bool) (res sandbox.Unpacked, used bool, err error) {
	results := make(chan sentArchive, 1)
	serve := func(w http.ResponseWriter, req *http.Request) {
		hctx, cancel := context.WithCancel(req.Context())
		defer cancel()
		defer context.AfterFunc(ctx, cancel)()
		w.Header().Set("Content-Type", "application/gzip")
		h := sha256.New()
		cw := &countWriter{w: io.MultiWriter(w, h)}
		var res sandbox.Unpacked
		var err error
		if check {
			res, err = writeArchive(hctx, r, cw)
		} else {
			_, err = io.Copy(cw, &ctxReader{ctx: hctx, r: r})
		}
		results <- sentArchive{res: res, n: cw.n, sum: hex.EncodeToString(h.Sum(nil)), err: err}
		if err != nil {
			// A cut connection, not an end: the guest's curl fails.
			panic(http.ErrAbortHandler)
		}
	}
	tr, link, header := t.begin(job, http.MethodGet, "workspace in", serve)
	got, claimed, err := t.carry(ctx, g, vmid, tr, []string{"/bin/sh", "-c", fetchScript, link, file}, header)
	if err != nil || !claimed {
		return res, err != nil, err
	}
	sent := <-results
	if sent.err != nil {
		g.run(context.WithoutCancel(ctx), []string{"/bin/rm", "-f", "--", file})
		return sent.res, true, sent.err
	}
	if got.code != 0 {
		return sent.res, true, fmt.Errorf("the guest's fetch of the archive failed midway (curl exit %d: %s)", got.code, strings.TrimSpace(string(got.stderr)))
	}
	if err := sameBytes(got.stdout, sent.sum, sent.n); err != nil {
		g.run(context.WithoutCancel(ctx), []string{"/bin/rm", "-f", "--", file})
		return sent.res, true, fmt.Errorf("the archive the guest fetched: %w", err)
	}
	return sent.res, true, nil
}

// carry runs a guest's side of transfer tr (argv, its header on
// standard input) until the guest claims it, or until it ends without
// having: then the transfer is closed, and claimed false says to go
// through the agent (logged). Once claimed, it waits for the guest's
// side to end and returns how.
func (t *Transfers) carry(ctx context.Context, g guest, vmid int, tr *transfer, argv []string, header []byte) (result, bool, error) {
	pid, err := g.start(ctx, argv, header)
	if err != nil {
		t.end(tr)
		return result{}, false, err
	}
	ended, err := t.untilClaimed(ctx, g, tr.claimed, pid)
	if err != nil {
		if !t.end(tr) {
			return result{}, false, err
		}
		// Claimed meanwhile: its handler runs, and ends with ctx.
		return result{}, true, err
	}
	if ended != nil && !t.end(tr) {
		t.unreached(vmid, tr, *ended)
		return result{}, false, nil
	}
	if ended != nil {
		return *ended, true, nil
	}
	r, err := g.wait(ctx, pid, "curl")
	return r, true, err
}

// unreached logs that the guest's side of tr ended without reaching the
// server: its workspace goes through the agent.
func (t *Transfers) unreached(vmid int, tr *transfer, ended result) {
	why := fmt.Sprintf("the guest could not reach %s (curl exit %d: %s)", t.base, ended.code, strings.TrimSpace(string(ended.stderr)))
	if ended.code == 127 {
		why = "the guest has no curl on " + sandbox.DefaultPath + " (install curl in the template)"
	}
	agentPath(t.log, slog.LevelWarn, tr.what, vmid, tr.job, why)
}

// untilClaimed polls the guest's side of a transfer until the transfer
// is claimed (nil) or the guest's side ended (how).
func (t *Transfers) untilClaimed(ctx context.Context, g guest, claimed <-chan struct{}, pid int) (*result, error) {
	wait := 20 * time.Millisecond
	for {
		tick := time.NewTimer(wait)
		select {
		case <-claimed:
			tick.Stop()
			return nil, nil
		case <-ctx.Done():
			tick.Stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
		r, done, err := g.status(ctx, pid, "curl")
		if err != nil {
			return nil, err
		}
		if done {
			return &r, nil // claimed meanwhile or not: the caller's end says
		}
		wait = min(wait*2, t.poll)
	}
}

// sameBytes checks the guest's "SHA256 SIZE" line against the server's.
func sameBytes(line []byte, sum string, n int64) error {
	f := strings.Fields(string(line))
	if len(f) != 2 {
		return fmt.Errorf("the guest's sha256sum said %q", strings.TrimSpace(string(line)))
	}
	gn, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || gn != n || f[0] != sum {
		return fmt.Errorf("%s bytes of sha256 %s in the guest, %d bytes of sha256 %s here: it changed on the way", f[1], f[0], n, sum)
	}
	return nil
}

// get has the guest send file (what: the packed workspace, or files
// packed, of sha256 sum and size n) over HTTP. ok false: the guest could
// not send it (logged), and it should be read through the agent; the
// file is still there.
func (t *Transfers) get(ctx context.Context, g guest, vmid int, job, what, file, sum string, n int64) (io.ReadCloser, bool, error) {
	pr, pw := io.Pipe()
	serve := func(w http.ResponseWriter, req *http.Request) {
		if _, err := io.Copy(pw, req.Body); err != nil {
			pw.CloseWithError(fmt.Errorf("the %s from VM %d: %w", strings.TrimSuffix(what, " out"), vmid, err))
			writeTransferError(w, http.StatusInternalServerError)
			return
		}
		pw.Close()
		w.WriteHeader(http.StatusNoContent)
	}
	stop := context.AfterFunc(ctx, func() { pr.CloseWithError(ctx.Err()) })
	tr, link, header := t.begin(job, http.MethodPut, what, serve)
	pid, err := g.start(ctx, []string{"/bin/sh", "-c", sendScript, link, file}, header)
	if err != nil {
		stop()
		t.end(tr)
		return nil, false, err
	}
	ended, err := t.untilClaimed(ctx, g, tr.claimed, pid)
	if err != nil {
		t.end(tr)
		stop()
		pr.CloseWithError(err) // a handler that claimed it meanwhile fails
		return nil, true, err
	}
	if ended != nil && !t.end(tr) {
		stop()
		t.unreached(vmid, tr, *ended)
		return nil, false, nil
	}
	return &upload{ctx: ctx, g: g, pr: pr, stop: stop, pid: pid, ended: ended, file: file, h: sha256.New(), wantSum: sum, wantN: n}, true, nil
}

func writeTransferError(w http.ResponseWriter, code int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	io.WriteString(w, `{"error":"the transfer failed"}`)
}

// holdBack is how much of an upload's end is kept back until the whole
// of it arrived and was checked. A reader of the archive (tar through
// gzip) stops at tar's end marker, which is within the last few KiB, so
// it never sees the end of an archive that was not checked.
const holdBack = 64 << 10

// upload reads the workspace a guest sends, as it arrives, checking its
// size and sha256 at its end.
type upload struct {
	ctx      context.Context
	g        guest
	pr       *io.PipeReader
	stop     func() bool
	pid      int
	ended    *result // the guest's side, once known to have ended
	file     string
	h        hash.Hash
	n        int64
	wantSum  string
	wantN    int64
	buf      []byte
	chunk    [32 << 10]byte
	eof      bool
	verified bool
	err      error
}

func (u *upload) Read(p []byte) (int, error) {
	for u.err == nil && !u.eof && len(u.buf) <= holdBack {
		k, err := u.pr.Read(u.chunk[:])
		u.h.Write(u.chunk[:k])
		u.n += int64(k)
		if len(u.buf) == 0 {
			u.buf = u.chunk[:0:0] // a fresh slice, not the chunk's array
		}
		u.buf = append(u.buf, u.chunk[:k]...)
		switch {
		case err == io.EOF:
			u.eof = true
			if u.err = sameBytes([]byte(u.wantSum+" "+strconv.FormatInt(u.wantN, 10)), hex.EncodeToString(u.h.Sum(nil)), u.n); u.err != nil {
				u.err = fmt.Errorf("the workspace the guest sent: %w", u.err)
			}
			u.verified = u.err == nil
		case err != nil:
			u.err = err
		}
	}
	if u.err != nil {
		return 0, u.err
	}
	avail := len(u.buf)
	if !u.eof {
		avail -= holdBack
	}
	if avail <= 0 && u.eof {
		return 0, io.EOF
	}
	k := copy(p, u.buf[:avail])
	u.buf = u.buf[k:]
	return k, nil
}

// Close ends the transfer and waits for the guest's side (its exit
// status is collected, or the agent would keep it); the file it was to
// remove once sent is removed if it is still there.
func (u *upload) Close() error {
	u.pr.CloseWithError(errTransferClosed)
	u.stop()
	ctx := context.WithoutCancel(u.ctx)
	r := u.ended
	if r == nil {
		got, err := u.g.wait(ctx, u.pid, "curl")
		if err != nil {
			return err
		}
		r = &got
	}
	if r.code != 0 || !u.verified {
		if rm, err := u.g.run(ctx, []string{"/bin/rm", "-f", "--", u.file}); err != nil || rm.code != 0 {
			return fmt.Errorf("remove %s: exit %d: %v", u.file, rm.code, err)
		}
	}
	return nil
}

// countWriter counts what goes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ctxReader reads r until ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
