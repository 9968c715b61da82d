package pve

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// CloseIdleConnections closes the client's idle connections to Proxmox.
func (c *Client) CloseIdleConnections() {
	for _, ep := range c.eps {
		ep.http.CloseIdleConnections()
	}
}

// maxResponse bounds an answer (file-read returns up to 16 MiB, which
// JSON may grow several times).
const maxResponse = 128 << 20

// Client calls one Proxmox VE API endpoint. It is safe for concurrent
// use.
type Client struct {
	cfg Config
	// eps are the cluster's nodes' APIs (Config.Host, then
	// Config.Endpoints); cur is the one calls go to, until it fails to
	// answer.
	eps   []*endpoint
	cur   atomic.Int32
	auth  string
	limit *tokenBucket
	nodes *nodeSlots
	log   *slog.Logger
	// observe hears each attempt (see Observe); nil: nobody listens.
	observe Observer
}

// New checks cfg and returns a client. It does not contact the server.
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("pve: %w", err)
	}
	var eps []*endpoint
	for _, ec := range cfg.endpoints() {
		tc, err := tlsConfig(ec)
		if err != nil {
			return nil, fmt.Errorf("pve: %s: %w", ec.Host, err)
		}
		tr := &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			TLSClientConfig:     tc,
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 8,
			IdleConnTimeout:     90 * time.Second,
			// pveproxy speaks HTTP/1.1, whose reason phrase carries the errors.
			ForceAttemptHTTP2: false,
			TLSNextProto:      map[string]func(string, *tls.Conn) http.RoundTripper{},
		}
		eps = append(eps, &endpoint{host: net.JoinHostPort(ec.Host, strconv.Itoa(ec.Port)), base: ec.baseURL(), http: &http.Client{Transport: tr}})
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{
		cfg:   cfg,
		eps:   eps,
		auth:  "PVEAPIToken=" + cfg.TokenID() + "=" + cfg.TokenValue,
		limit: newTokenBucket(cfg.RateLimit, cfg.RateBurst),
		nodes: newNodeSlots(cfg.NodeCalls),
		log:   log,
	}, nil
}

// Close releases idle connections.
func (c *Client) Close() { c.CloseIdleConnections() }

// endpoint is one node's API.
type endpoint struct {
	host string // host:port
	base string
	http *http.Client
}

// endpoint is the API calls go to now.
func (c *Client) endpoint() *endpoint { return c.eps[int(c.cur.Load())%len(c.eps)] }

// failover moves calls from ep, which did not answer, to the next
// endpoint (unless another call moved them already).
func (c *Client) failover(ep *endpoint) {
	for i, e := range c.eps {
		if e == ep {
			if c.cur.CompareAndSwap(int32(i), int32((i+1)%len(c.eps))) {
				c.log.Warn("a Proxmox API endpoint does not answer: calls go to the next", "down", ep.host, "next", c.eps[(i+1)%len(c.eps)].host)
			}
			return
		}
	}
}

// unreachable: the attempt failed for lack of an answer from the node (a
// connection refused or timed out), not for anything the node said or a
// certificate it showed.
func unreachable(err error) bool {
	var api *APIError
	var fp *FingerprintMismatchError
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	return err != nil && !errors.As(err, &api) && !errors.As(err, &fp) && !errors.As(err, &cv) && !errors.As(err, &ua) && !errors.As(err, &hn) &&
		!errors.Is(err, context.Canceled)
}

// params are a request's parameters: string, int, bool (sent as 0/1) or
// []string values.
type params map[string]any

// envelope is the API's answer: {"data": ..., "total": n, "errors": {...}}.
type envelope struct {
	Data    json.RawMessage   `json:"data"`
	Total   Int               `json:"total"`
	Errors  map[string]string `json:"errors"`
	Message string            `json:"message"`
}

// get, post, put and del call the API and decode "data" into out (nil:
// ignore it).
func (c *Client) get(ctx context.Context, path string, p params, out any) (*envelope, error) {
	return c.call(ctx, http.MethodGet, path, p, out)
}

func (c *Client) post(ctx context.Context, path string, p params, out any) error {
	_, err := c.call(ctx, http.MethodPost, path, p, out)
	return err
}

func (c *Client) put(ctx context.Context, path string, p params, out any) error {
	_, err := c.call(ctx, http.MethodPut, path, p, out)
	return err
}

func (c *Client) del(ctx context.Context, path string, p params, out any) error {
	_, err := c.call(ctx, http.MethodDelete, path, p, out)
	return err
}

// call sends a request, retrying what is safe to retry: a GET after a
// transport error or a transient status, and any request that never
// left this process (the connection failed before it was written).
func (c *Client) call(ctx context.Context, method, path string, p params, out any) (*envelope, error) {
	return c.callOnce(ctx, method, path, p, out, false)
}

// getConsuming is get for a read that changes what it reads: the guest
// agent forgets an exited command's pid once exec-status has reported it
// (qga/commands-posix.c, guest-exec-status), so a GET repeated after its
// answer was lost in transit finds "Invalid parameter 'pid'" and the
// command's result is gone. It is repeated only where the request cannot
// have reached the agent: before it was written, or answered 595 (pveproxy
// could not reach the node) or 503 (pveproxy refused it).
func (c *Client) getConsuming(ctx context.Context, path string, p params, out any) (*envelope, error) {
	return c.callOnce(ctx, http.MethodGet, path, p, out, true)
}

// callOnce is call; consumes says the request is a read that changes what
// it reads (getConsuming).
func (c *Client) callOnce(ctx context.Context, method, path string, p params, out any, consumes bool) (*envelope, error) {
	delay := c.cfg.RetryDelay
	node := pathNode(path)
	failovers := 0
	for attempt := 0; ; attempt++ {
		release, err := c.nodes.acquire(ctx, node)
		if err != nil {
			return nil, err
		}
		if err := c.limit.wait(ctx); err != nil {
			release()
			return nil, err
		}
		ep := c.endpoint()
		env, sent, err := c.once(ctx, ep, method, path, p)
		release()
		if len(c.eps) > 1 && unreachable(err) && ctx.Err() == nil {
			// Its node is down: the next node answers for the cluster. A
			// request that was sent may have been acted on: only a GET, or
			// one that never left, goes again (at once, the first time
			// round the endpoints).
			c.failover(ep)
			if ((method == http.MethodGet && !consumes) || !sent) && failovers < len(c.eps)-1 {
				failovers++
				attempt--
				continue
			}
		}
		if err == nil {
			if out != nil && len(env.Data) > 0 && string(env.Data) != "null" {
				if err := json.Unmarshal(env.Data, out); err != nil {
					return nil, fmt.Errorf("pve: %s %s: decode answer: %w", method, path, err)
				}
			}
			return env, nil
		}
		if ctx.Err() != nil || attempt >= c.cfg.RetryAttempts || !c.retryable(method, sent, consumes, err) {
			return nil, err
		}
		// Jitter keeps many clients from retrying in step.
		wait := time.Duration(float64(delay) * (0.8 + 0.4*rand.Float64()))
		c.log.Debug("pve retry", "method", method, "path", path, "attempt", attempt+1, "in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		delay *= 2
	}
}

// retryable decides whether a failed attempt may be repeated.
func (c *Client) retryable(method string, sent, consumes bool, err error) bool {
	var api *APIError
	if errors.As(err, &api) {
		if consumes {
			return api.StatusCode == 595 || api.StatusCode == http.StatusServiceUnavailable
		}
		return method == http.MethodGet && retryableStatus(api)
	}
	// A certificate the client refuses will not change by asking again.
	var fp *FingerprintMismatchError
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	if errors.As(err, &fp) || errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) {
		return false
	}
	return (method == http.MethodGet && !consumes) || !sent
}

// once sends one attempt. sent reports whether the request was written
// to the connection (after which a POST may have been acted on).
func (c *Client) once(ctx context.Context, ep *endpoint, method, path string, p params) (*envelope, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	u := ep.base + path
	var body io.Reader
	query, err := encodeQuery(p)
	if err != nil {
		return nil, false, err
	}
	if method == http.MethodPost || method == http.MethodPut {
		raw, err := encodeJSON(p)
		if err != nil {
			return nil, false, err
		}
		body = bytes.NewReader(raw)
	} else if query != "" {
		u += "?" + query
	}
	// The trace runs on the transport's goroutine.
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { wrote.Store(true) },
	})
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, false, fmt.Errorf("pve: %w", err)
	}
	req.Header.Set("Authorization", c.auth)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := ep.http.Do(req)
	c.observed(method, path, resp)
	sent := wrote.Load()
	if err != nil {
		c.log.Debug("pve request failed", "method", method, "path", path, "sent", sent, "err", err)
		return nil, sent, fmt.Errorf("pve: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	c.log.Debug("pve request", "method", method, "path", path, "status", resp.StatusCode, "duration", time.Since(start))
	if err != nil {
		return nil, true, fmt.Errorf("pve: %s %s: read answer: %w", method, path, err)
	}
	var env envelope
	jerr := json.Unmarshal(raw, &env)
	if resp.StatusCode/100 != 2 {
		reason := strings.TrimSpace(strings.TrimPrefix(resp.Status, strconv.Itoa(resp.StatusCode)))
		return nil, true, &APIError{Method: method, Path: path, StatusCode: resp.StatusCode, Reason: reason,
			Errors: env.Errors, Message: env.Message}
	}
	if jerr != nil {
		return nil, true, fmt.Errorf("pve: %s %s: answer is not the JSON envelope: %w", method, path, jerr)
	}
	return &env, true, nil
}

// encodeJSON writes a request body: bools as 0/1 (what every PVE
// version accepts), arrays as arrays.
func encodeJSON(p params) ([]byte, error) {
	m := make(map[string]any, len(p))
	for k, v := range p {
		if b, ok := v.(bool); ok {
			v = boolInt(b)
		}
		m[k] = v
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("pve: encode request: %w", err)
	}
	return buf.Bytes(), nil
}

// encodeQuery writes parameters of a GET or DELETE; arrays repeat their
// key, as a form does.
func encodeQuery(p params) (string, error) {
	v := url.Values{}
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch t := p[k].(type) {
		case string:
			v.Add(k, t)
		case int:
			v.Add(k, strconv.Itoa(t))
		case int64:
			v.Add(k, strconv.FormatInt(t, 10))
		case bool:
			v.Add(k, strconv.Itoa(boolInt(t)))
		case []string:
			for _, e := range t {
				v.Add(k, e)
			}
		default:
			return "", fmt.Errorf("pve: parameter %s: unsupported type %T", k, t)
		}
	}
	return v.Encode(), nil
}

// vmPath is /nodes/{node}/qemu/{vmid}.
func vmPath(node string, vmid int) string {
	return "/nodes/" + url.PathEscape(node) + "/qemu/" + strconv.Itoa(vmid)
}

func nodePath(node string) string { return "/nodes/" + url.PathEscape(node) }
