package pve

import (
	"net/http"
	"strings"
)

// Observer hears every attempt the client makes at the API (a retried
// request is heard once per attempt): its class, from RequestClass, and
// the HTTP status of the answer (0 when none came: the connection failed).
// It is called on the requesting goroutine and must return at once.
type Observer func(class string, code int)

// Observe sets the observer (metrics). Call it before the client is used;
// it changes nothing of what the client does.
func (c *Client) Observe(fn Observer) { c.observe = fn }

// observed tells the observer about one attempt; resp is nil when no
// answer came.
func (c *Client) observed(method, path string, resp *http.Response) {
	if c.observe == nil {
		return
	}
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	c.observe(RequestClass(method, path), code)
}

// placeholders name the segment that follows each of these in an API
// path: what varies from call to call (a node, a vmid, a task, a
// snapshot's or a volume's name: a label of each would grow without
// bound).
var placeholders = map[string]string{
	"nodes":    "{node}",
	"qemu":     "{vmid}",
	"lxc":      "{vmid}",
	"tasks":    "{upid}",
	"storage":  "{storage}",
	"pools":    "{pool}",
	"snapshot": "{snapname}",
	"content":  "{volume}",
}

// RequestClass is a request's method and path with the parts that vary
// replaced by placeholders, e.g. "POST /nodes/{node}/qemu/{vmid}/clone":
// few enough values to be a metric's label.
func RequestClass(method, path string) string {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	segs := strings.Split(strings.Trim(path, "/"), "/")
	// Left to right, so that a placeholder is never read as a key: in
	// /nodes/qemu/qemu/7 the node called qemu is already {node}.
	for i := 1; i < len(segs); i++ {
		if p, ok := placeholders[segs[i-1]]; ok {
			segs[i] = p
		}
	}
	return method + " /" + strings.Join(segs, "/")
}
