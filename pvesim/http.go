package pvesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxPost is the largest request body of any release (see release): what
// an error answer drains of a body it did not read.
const maxPost = 512 << 10

// apiError is an error the way the PVE API server reports it: a status,
// a message (its first line becomes the reason phrase), maybe
// per-parameter errors, and whether the body is the JSON envelope
// (errors raised by handlers) or empty (errors of the HTTP layer).
type apiError struct {
	code   int
	msg    string
	errors map[string]string
	noBody bool
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.code, strings.TrimSpace(e.msg)) }

// dieErr is a handler's die "...\n": HTTP 500 with the message.
func dieErr(format string, args ...any) *apiError {
	return &apiError{code: http.StatusInternalServerError, msg: fmt.Sprintf(format, args...) + "\n"}
}

// httpErr is an error of the HTTP layer, without a body.
func httpErr(code int, msg string) *apiError {
	return &apiError{code: code, msg: msg, noBody: true}
}

var splitAbsURI = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^/api2/+([a-z][a-z0-9]+)(/.*)?$`) })

// call is one request on its way through the simulated API.
type call struct {
	s      *Server
	ctx    context.Context // ends with the request or the simulator
	m      *Method
	params Params // merged and validated
	authid string // the caller: user@realm!token
	total  int    // the envelope's "total", when > 0 or totalSet
	// totalSet: the method always sends total (0 included).
	totalSet bool
}

// ServeHTTP implements the API: pveproxy's order of checks, then the
// method's handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := Request{Time: start, Method: r.Method, Path: r.URL.Path}
	if lat := s.requestLatency(); lat > 0 {
		select {
		case <-time.After(lat):
		case <-r.Context().Done():
		}
	}
	data, c, err := s.serve(r, &rec)
	if err == nil {
		body := map[string]any{"data": data}
		if c != nil && (c.total > 0 || c.totalSet) {
			body["total"] = c.total
		}
		raw, jerr := json.Marshal(body)
		if jerr != nil {
			err = dieErr("unable to encode result: %v", jerr)
		} else {
			rec.Status, rec.Reason = http.StatusOK, "OK"
			s.record(rec)
			writeHeaders(w.Header(), "application/json;charset=UTF-8")
			w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
			w.WriteHeader(http.StatusOK)
			w.Write(raw)
			return
		}
	}
	var pe *ParamError
	if errors.As(err, &pe) {
		err = &apiError{code: http.StatusBadRequest, msg: "Parameter verification failed.\n", errors: pe.Errors}
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = dieErr("%v", err)
	}
	reason := firstLine(ae.msg)
	if reason == "" {
		reason = http.StatusText(ae.code)
	}
	rec.Status, rec.Reason = ae.code, reason
	s.record(rec)
	if ae.code == http.StatusUnauthorized {
		// pveproxy delays every failed authentication by 3 s.
		select {
		case <-time.After(s.opts.AuthFailureDelay - time.Since(start)):
		case <-r.Context().Done():
		}
	}
	var body []byte
	contentType := ""
	if !ae.noBody {
		env := map[string]any{"data": nil, "message": ae.msg}
		if len(ae.errors) > 0 {
			env["errors"] = ae.errors
		}
		body, _ = json.Marshal(env)
		contentType = "application/json;charset=UTF-8"
	}
	writeError(w, ae.code, reason, contentType, body)
}

func (s *Server) record(rec Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) >= s.opts.MaxRequestLog {
		// A long-running simulator (pve-sim) must not grow forever.
		drop := max(1, s.opts.MaxRequestLog/10)
		s.requests = append(s.requests[:0], s.requests[drop:]...)
	}
	s.requests = append(s.requests, rec)
}

func firstLine(msg string) string {
	line, _, _ := strings.Cut(msg, "\n")
	return line
}

func writeHeaders(h http.Header, contentType string) {
	now := time.Now().UTC().Format(http.TimeFormat)
	h.Set("Server", "pve-api-daemon/3.0")
	h.Set("Date", now)
	h.Set("Expires", now)
	h.Set("Cache-Control", "max-age=0")
	h.Set("Pragma", "no-cache")
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
}

// writeError answers with Proxmox's message as the reason phrase, which
// net/http cannot set: the connection is taken over and the response
// written by hand. Like pveproxy, the connection closes after an error.
func writeError(w http.ResponseWriter, code int, reason, contentType string, body []byte) {
	h := http.Header{}
	writeHeaders(h, contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Connection", "close")
	hj, ok := w.(http.Hijacker)
	if !ok {
		for k, v := range h {
			w.Header()[k] = v
		}
		w.WriteHeader(code)
		w.Write(body)
		return
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	var out bytes.Buffer
	// A reason phrase is one line of visible text.
	reason = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, reason)
	fmt.Fprintf(&out, "HTTP/1.1 %d %s\r\n", code, reason)
	h.Write(&out)
	out.WriteString("\r\n")
	out.Write(body)
	buf.Writer.Write(out.Bytes())
	if buf.Writer.Flush() != nil {
		return
	}
	// Close gracefully: a client may still be sending a body we did not
	// read (one too large, say), and closing with unread data resets the
	// connection, which can destroy the answer before the client reads it.
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(buf.Reader, 2*maxPost))
}

// serve runs the checks in pveproxy's order and then the handler.
func (s *Server) serve(r *http.Request, rec *Request) (any, *call, error) {
	path := r.URL.Path
	if !strings.HasPrefix(path, "/api2") {
		return nil, nil, httpErr(http.StatusNotImplemented, fmt.Sprintf("no such file '%s'\n", path))
	}
	m := splitAbsURI().FindStringSubmatch(path)
	if m == nil {
		return nil, nil, httpErr(http.StatusNotImplemented, "no such uri")
	}
	format, rel := m[1], m[2]
	if rel == "" {
		rel = "/"
	}
	rec.Path = rel
	switch r.Method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete:
	default:
		return nil, nil, httpErr(http.StatusNotImplemented, fmt.Sprintf("method '%s' not available", r.Method))
	}
	authid, err := s.authenticate(r)
	if err != nil {
		return nil, nil, err
	}
	rec.TokenID = authid
	params, err := readParams(r, s.rel.maxPost)
	if err != nil {
		return nil, nil, err
	}
	rec.Params = params.Clone()
	if format != "json" {
		// pveproxy has more formatters (extjs, html...); the simulator only
		// speaks json.
		return nil, nil, httpErr(http.StatusNotImplemented, fmt.Sprintf("no formatter for uri %s, %s", rel, format))
	}
	meth, pathParams, ok := s.schema.Lookup(r.Method, rel)
	if !ok {
		if s.schema.InRealAPI(r.Method, rel) {
			s.log.Warn("pvesim: a real PVE API method the simulator does not serve", "method", r.Method, "path", rel)
		}
		return nil, nil, &apiError{code: http.StatusNotImplemented, msg: fmt.Sprintf("Method '%s %s' not implemented", r.Method, rel)}
	}
	if err := s.injectError(); err != nil {
		return nil, nil, err
	}
	merged, err := mergeParams(pathParams, params)
	if err != nil {
		return nil, nil, err
	}
	if !meth.AllowToken {
		return nil, nil, &apiError{code: http.StatusForbidden, msg: fmt.Sprintf("Permission check failed (URI '%s' not available with API token, need proper ticket.)\n", rel)}
	}
	s.mu.Lock()
	err = s.checkPermissions(meth.Permissions, authid, merged)
	s.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	if meth.ProxyTo == "node" {
		node := fmt.Sprint(merged["node"])
		if err := s.reachNode(node); err != nil {
			return nil, nil, err
		}
		defer s.countCall(node)()
	}
	if err := meth.check(merged); err != nil {
		return nil, nil, err
	}
	if meth.Protected {
		// pveproxy hands the call to pvedaemon, on the node it names (or
		// this one), where it waits for a worker and holds it while it runs.
		node := s.opts.Nodes[0].Name
		if meth.ProxyTo == "node" {
			node = fmt.Sprint(merged["node"])
		}
		waited := time.Now()
		release, err := s.daemonWorker(r.Context(), node)
		rec.Queued = time.Since(waited)
		if err != nil {
			return nil, nil, err
		}
		defer release()
	}
	h := handlers[meth.Method+" "+meth.Path]
	if h == nil {
		return nil, nil, &apiError{code: http.StatusNotImplemented, msg: fmt.Sprintf("Method '%s %s' not implemented", r.Method, rel)}
	}
	// Guest work (agent calls) must not outlive the simulator.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	c := &call{s: s, ctx: ctx, m: meth, params: merged, authid: authid}
	data, err := h(c)
	return data, c, err
}

// readParams decodes the body (form or JSON, POST and PUT only) and the
// query string, query values winning, like pve-http-server's
// extract_params.
func readParams(r *http.Request, maxPost int) (Params, error) {
	params := Params{}
	var body []byte
	if r.ContentLength != 0 {
		if r.Method != http.MethodPost && r.Method != http.MethodPut {
			return nil, httpErr(http.StatusNotImplemented, fmt.Sprintf("Unexpected content for method '%s'", r.Method))
		}
		if r.ContentLength < 0 {
			return nil, httpErr(http.StatusNotImplemented, "chunked transfer encoding not supported")
		}
		if r.ContentLength > int64(maxPost) {
			return nil, httpErr(http.StatusNotImplemented, "for data too large")
		}
		var err error
		if body, err = io.ReadAll(io.LimitReader(r.Body, int64(maxPost)+1)); err != nil {
			return nil, httpErr(http.StatusBadRequest, "bad request")
		}
		ct := r.Header.Get("Content-Type")
		mt, _, _ := mime.ParseMediaType(ct)
		switch mt {
		case "", "application/x-www-form-urlencoded":
			params = decodeForm(string(body))
		case "application/json":
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				return nil, httpErr(http.StatusNotImplemented, fmt.Sprintf("malformed JSON string: %v\n", err))
			}
			obj, ok := v.(map[string]any)
			if !ok {
				return nil, httpErr(http.StatusNotImplemented, "JSON body is not an object\n")
			}
			for k, e := range obj {
				params[k] = jsonToParams(e)
			}
		default:
			return nil, httpErr(506, fmt.Sprintf("upload 'Content-Type '%s' not implemented", ct))
		}
	}
	for k, v := range decodeForm(r.URL.RawQuery) {
		params[k] = v
	}
	delete(params, "_dc") // the ExtJS cache buster
	return params, nil
}

// decodeForm is pve-http-server's decode_urlencoded: "&" and ";" split
// pairs, "+" is a space, a repeated key becomes an array.
func decodeForm(data string) Params {
	out := Params{}
	if data == "" {
		return out
	}
	for _, kv := range strings.FieldsFunc(data, func(r rune) bool { return r == '&' || r == ';' }) {
		// Perl's my ($k, $v) = split(/=/, $kv): a second "=" ends the
		// value, and an empty value is no value at all.
		parts := strings.Split(kv, "=")
		for len(parts) > 0 && parts[len(parts)-1] == "" {
			parts = parts[:len(parts)-1]
		}
		k := ""
		if len(parts) > 0 {
			k = formUnescape(parts[0])
		}
		var val any
		if len(parts) > 1 {
			val = formUnescape(parts[1])
		}
		if old, ok := out[k]; ok && val != nil {
			switch o := old.(type) {
			case []any:
				out[k] = append(o, val)
			case nil:
				out[k] = val
			default:
				out[k] = []any{o, val}
			}
			continue
		}
		out[k] = val
	}
	return out
}

func formUnescape(s string) string {
	s = strings.ReplaceAll(s, "+", " ")
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// requestLatency is how long this request takes (Options.RequestLatency).
func (s *Server) requestLatency() time.Duration {
	span := s.opts.RequestLatency
	if span.Max <= 0 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return span.Min + time.Duration(s.rng.Int64N(int64(span.Max-span.Min)+1))
}

// injectError fails a request on purpose (Faults.ErrorRate).
func (s *Server) injectError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults.ErrorRate > 0 && s.rng.Float64() < s.faults.ErrorRate {
		return dieErr("pvesim: injected fault (error rate %.2f)", s.faults.ErrorRate)
	}
	return nil
}

// reachNode is pveproxy forwarding a call to the node it names.
func (s *Server) reachNode(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node(name) == nil {
		return dieErr("hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", name, name)
	}
	if s.faults.offline(name) {
		// What AnyEvent::HTTP reports when the node does not answer.
		return httpErr(595, "No route to host")
	}
	return nil
}

// daemonWorker waits for one of a node's pvedaemon workers (Options.
// DaemonWorkers; pve-manager PVE/Service/pvedaemon.pm): each serves one
// call at a time, since the API handler runs synchronously inside the
// worker's event loop (pve-http-server src/PVE/APIServer/AnyEvent.pm).
func (s *Server) daemonWorker(ctx context.Context, node string) (func(), error) {
	if s.opts.DaemonWorkers < 0 {
		return func() {}, nil
	}
	s.mu.Lock()
	sem := s.workers[node]
	if sem == nil {
		sem = make(chan struct{}, s.opts.DaemonWorkers)
		s.workers[node] = sem
	}
	s.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, httpErr(http.StatusServiceUnavailable, "request cancelled")
	}
}

// countCall counts a call to a node in flight until the result is
// called, keeping the most there were at once (PeakCalls).
func (s *Server) countCall(node string) func() {
	s.mu.Lock()
	s.inflight[node]++
	s.peak[node] = max(s.peak[node], s.inflight[node])
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.inflight[node]--
		s.mu.Unlock()
	}
}

// PeakCalls is, for each node, the most calls to it (on /nodes/{node}/
// paths) that were in flight at once since the simulator started or
// ResetPeakCalls.
func (s *Server) PeakCalls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.peak)
}

// ResetPeakCalls starts counting PeakCalls afresh.
func (s *Server) ResetPeakCalls() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := range s.peak {
		s.peak[n] = s.inflight[n]
	}
}
