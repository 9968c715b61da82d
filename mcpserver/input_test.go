package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// validatingService answers every tool, and validates a submitted
// manifest as the engine does.
func validatingService() *service {
	s := fullService()
	s.SubmitFn = func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
		if err := m.Validate(); err != nil {
			return nil, err
		}
		return &delegate.Job{ID: "job-1", Status: delegate.StatusPending, Manifest: m}, nil
	}
	return s
}

// callRaw calls a tool with arguments given as JSON text, as a client
// may send them.
func callRaw(t *testing.T, cs *mcp.ClientSession, tool, args string) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("%s %s: %v", tool, args, err)
	}
	return res
}

// TestArgumentErrors: bad arguments to any tool are refused with a message
// that names the field and the rule, in words (not a schema validator's).
func TestArgumentErrors(t *testing.T) {
	cs := connect(t, validatingService(), nil)
	b64 := `"aGk="`
	tests := []struct {
		tool, args, want string
	}{
		{"submit_job", `{"manifest":null}`, "manifest: required (an object)"},
		{"submit_job", `{}`, "manifest: required (an object)"},
		{"submit_job", `{"manifest":"echo hi"}`, "manifest: must be an object (got a string)"},
		{"submit_job", `{"manifets":{}}`, "manifets: unknown field (known: manifest, idempotency_key)"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","timeout":"5 minutes"}}`, `manifest.timeout: must be seconds or a duration of whole seconds like "90s", "10m" or "1h30m" (got "5 minutes")`},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","timeout":"1.5s"}}`, `manifest.timeout: must be seconds or a duration of whole seconds`},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","timeout":true}}`, `manifest.timeout: must be seconds or a duration like "10m" (got a boolean)`},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","timeout":"48h"}}`, "manifest.timeout: must be between 1 and 86400 seconds (got 172800"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","timout":5,"resources":{"memroy":"1G"},"files":[{"path":"a","content":"","mdoe":"0644"}]}}`,
			"manifest.timout: unknown field (known: task, agentType, agent, files, env, secrets, resources, timeout, lifecycle, vmTemplate, statusMode, artifacts, network, stdin, sandbox, workspace, caches); " +
				"2 more unknown: manifest.resources.memroy (known: cpu, memory, disk), manifest.files[0].mdoe (known: path, content, mode, link)"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","timeout":0}}`, "manifest.timeout: must be between 1 and 86400 seconds"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","timeout":-1}}`, "manifest.timeout: must be between 1 and 86400 seconds"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","files":[{"path":"a","content":` + b64 + `},{"path":"b","content":` + b64 + `},{"path":"c","content":"a b"}]}}`, "manifest.files[2].content: not base64"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","files":[{"path":"a"}]}}`, "manifest.files[0].content: required (a string)"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"a","task":"b"}}`, "manifest.task: duplicate key"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","env":{"A":"1","A":"2"}}}`, "manifest.env.A: duplicate key"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x"},"manifest":{"agentType":"script","task":"rm -rf /"}}`, "manifest: duplicate key"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","resources":{"cpu":"2"}}}`, "manifest.resources.cpu: must be a number (got a string)"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x","secrets":"A"}}`, "manifest.secrets: must be an array of strings (got a string)"},
		{"submit_job", `{"manifest":{"agentType":"bash","task":"x"}}`, "manifest.agentType: must be one of claude, script, custom"},
		{"submit_job", `{"manifest":{}}`, "manifest.task: is required: the shell script to run"},
		{"submit_job", `{"manifest":{"agentType":"script","task":"x"},"idempotency_key":7}`, "idempotency_key: must be a string (got a number)"},
		{"submit_job", `[1]`, "arguments: must be an object (got an array)"},
		{"get_job_status", `{}`, "job_id: required (a string)"},
		{"get_job_status", `{"job_id":5}`, "job_id: must be a string (got a number)"},
		{"get_job_status", `{"job_id":"a","job_id":"b"}`, "job_id: duplicate key"},
		{"get_job_status", `{"job_id":"a","jobId":"b"}`, "jobId: unknown field (known: job_id)"},
		{"wait_job", `{"job_id":"a","timeout_seconds":0}`, "timeout_seconds: must be between 1 and 50"},
		{"wait_job", `{"job_id":"a","timeout_seconds":"ten"}`, `timeout_seconds: must be seconds or a duration of whole seconds like "90s"`},
		{"wait_job", `{"job_id":"a","timeout_seconds":"2m"}`, "timeout_seconds: must be between 1 and 50 (got 120"},
		{"wait_job", `{"job_id":"a","timeout_seconds":2.5}`, "timeout_seconds: must be an integer (got 2.5)"},
		{"get_job_result", `{"job_id":"a","max_output_bytes":true}`, "max_output_bytes: must be an integer (got a boolean)"},
		{"get_job_logs", `{"job_id":"a","offset":3}`, "offset: unknown field (known: job_id, cursor, max_bytes)"},
		{"list_jobs", `{"limit":"5"}`, "limit: must be an integer (got a string)"},
		{"list_jobs", `{"status":["running"]}`, "status: must be a string (got an array)"},
		{"cancel_job", `{"job_id":null}`, "job_id: required (a string)"},
		{"release_job", `{"job_id":["a"]}`, "job_id: must be a string (got an array)"},
	}
	for _, tc := range tests {
		t.Run(tc.tool+" "+tc.args, func(t *testing.T) {
			res := callRaw(t, cs, tc.tool, tc.args)
			if !res.IsError {
				t.Fatalf("accepted: %s", errorText(res))
			}
			if msg := errorText(res); !strings.HasPrefix(msg, tc.want) {
				t.Errorf("got %q, want %q", msg, tc.want)
			}
		})
	}
	// What the service gets from a manifest that leaves timeout out: no
	// timeout (the default), not 0.
	s := validatingService()
	var got delegate.Manifest
	s.SubmitFn = func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
		got = m
		return &delegate.Job{ID: "job-1", Status: delegate.StatusPending}, nil
	}
	if res := callRaw(t, connect(t, s, nil), "submit_job", `{"manifest":{"agentType":"script","task":"x"}}`); res.IsError || got.Timeout != nil {
		t.Errorf("timeout left out: %v %s", got.Timeout, errorText(res))
	}
}

// TestInputSchemasDescribeWhatIsAccepted: for every tool, the published
// input schema and the decoder agree. Each property it lists is accepted
// with a value of its type and refused, naming it, with a value of
// another type; each required property is refused when left out; a
// property it does not list is refused; and every accepted call's
// arguments validate against the schema.
func TestInputSchemasDescribeWhatIsAccepted(t *testing.T) {
	cs := connect(t, validatingService(), nil)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		t.Run(tool.Name, func(t *testing.T) {
			raw, _ := json.Marshal(tool.InputSchema)
			var schema map[string]any
			json.Unmarshal(raw, &schema)
			resolved := resolve(t, tool.InputSchema)
			base := minimal(schema)
			accepted := func(args map[string]any) bool {
				t.Helper()
				data, _ := json.Marshal(args)
				res := callRaw(t, cs, tool.Name, string(data))
				if res.IsError && (strings.Contains(errorText(res), "(got ") || strings.Contains(errorText(res), "unknown field") ||
					strings.Contains(errorText(res), "required (")) {
					return false // refused by the decoder (the service may refuse a value too)
				}
				var instance any
				json.Unmarshal(data, &instance)
				if err := resolved.Validate(instance); err != nil {
					t.Errorf("accepted %s, which the schema refuses: %v", data, err)
				}
				return true
			}
			if !accepted(base) {
				t.Fatalf("the required properties alone %v are refused", base)
			}
			for _, leaf := range leaves(schema, "") {
				args := withValue(base, leaf.path, leaf.good)
				if !accepted(args) {
					t.Errorf("%s: a value of its type (%v) is refused", leaf.path, leaf.good)
				}
				data, _ := json.Marshal(withValue(base, leaf.path, leaf.bad))
				res := callRaw(t, cs, tool.Name, string(data))
				if !res.IsError || !strings.Contains(errorText(res), leaf.path+": must be") {
					t.Errorf("%s: %v is not refused naming it: %s", leaf.path, leaf.bad, errorText(res))
				}
			}
			for _, req := range stringsOf(schema["required"]) {
				args := withValue(base, req, nil)
				delete(args, req)
				if accepted(args) {
					t.Errorf("accepted without %s, which the schema requires", req)
				}
			}
			if accepted(withValue(base, "no_such_field", 1)) {
				t.Errorf("accepted a property the schema does not list")
			}
		})
	}
}

type leaf struct {
	path      string
	good, bad any
}

// leaves lists the properties of a schema (as JSON) down to the scalars,
// with a value each of its type and one of another type. Arrays and maps
// are given one element.
func leaves(schema map[string]any, path string) []leaf {
	var out []leaf
	props, _ := schema["properties"].(map[string]any)
	names := make([]string, 0, len(props))
	for name := range props {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p, ok := props[name].(map[string]any)
		if !ok {
			p = map[string]any{} // true: the empty schema
		}
		pp := name
		if path != "" {
			pp = path + "." + name
		}
		switch {
		case p["anyOf"] != nil:
			// manifest.network: a mode, or an allowlist object.
			for _, alt := range p["anyOf"].([]any) {
				a := alt.(map[string]any)
				if a["enum"] != nil {
					out = append(out, leaf{pp, a["enum"].([]any)[0], 42})
				} else {
					out = append(out, leaf{pp, map[string]any{"allow": []any{"pypi.org"}, "ask": true}, 42})
				}
			}
		case p["description"] == "as submit_job's" && len(p) == 1:
			// open_sandbox's network: submit_job's manifest.network, said
			// by reference (tools/list's budget); it takes the same.
			out = append(out, leaf{pp, "none", 42}, leaf{pp, map[string]any{"allow": []any{"pypi.org"}, "ask": true}, 42})
		case p["enum"] != nil:
			out = append(out, leaf{pp, p["enum"].([]any)[0], 42})
		case typeOf(p) == nil:
			// A duration (the decoder's delegate:"seconds"): seconds, or
			// a string like "10m"; its schema has no type (tools/list's
			// budget), only a description when there is room.
			out = append(out, leaf{pp, "10s", true}, leaf{pp, 5, "seven"})
		case p["properties"] != nil:
			out = append(out, leaf{pp, minimal(p), "x"})
			for _, l := range leaves(p, pp) {
				out = append(out, leaf{l.path, l.good, l.bad})
			}
		default:
			out = append(out, leaf{pp, example(p), counterexample(p)})
		}
	}
	return out
}

// typeOf is a property's type: its "type", or below the top, where the
// schema leaves it out, what its items or properties say.
func typeOf(p map[string]any) any {
	switch {
	case p["type"] != nil:
		return p["type"]
	case p["items"] != nil:
		return "array"
	case p["properties"] != nil || p["additionalProperties"] != nil:
		return "object"
	}
	return nil
}

func example(p map[string]any) any {
	switch typeOf(p) {
	case "string":
		return "a"
	case "integer":
		return 5
	case "number":
		return 1.5
	case "boolean":
		return true
	case "array":
		items, _ := p["items"].(map[string]any)
		if items["properties"] != nil {
			return []any{fileExample(items)}
		}
		return []any{example(items)}
	case "object":
		if ap, ok := p["additionalProperties"].(map[string]any); ok {
			return map[string]any{"KEY": example(ap)}
		}
		return minimal(p)
	}
	panic(fmt.Sprintf("no example for %v", p))
}

// fileExample is an element of an array of objects: its required
// properties, with values that also pass validation.
func fileExample(items map[string]any) map[string]any {
	m := minimal(items)
	if _, ok := m["content"]; ok {
		m["content"] = "aGk=" // manifest files: base64
	}
	return m
}

func counterexample(p map[string]any) any {
	if p["type"] == "string" {
		return 7
	}
	return "seven"
}

// minimal is an object with only the required properties of a schema.
func minimal(schema map[string]any) map[string]any {
	props, _ := schema["properties"].(map[string]any)
	out := map[string]any{}
	for _, name := range stringsOf(schema["required"]) {
		p := props[name].(map[string]any)
		switch {
		case p["enum"] != nil:
			out[name] = p["enum"].([]any)[0] // script, for agentType
		case p["properties"] != nil:
			m := minimal(p)
			if _, ok := p["properties"].(map[string]any)["task"]; ok {
				m["task"] = "make" // a manifest needs one to be valid
			}
			out[name] = m
		default:
			out[name] = example(p)
		}
	}
	return out
}

func stringsOf(v any) []string {
	var out []string
	list, _ := v.([]any)
	for _, s := range list {
		out = append(out, s.(string))
	}
	return out
}

// withValue is a copy of args with the value at a dotted path set.
func withValue(args map[string]any, path string, v any) map[string]any {
	data, _ := json.Marshal(args)
	var out map[string]any
	json.Unmarshal(data, &out)
	m := out
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
	return out
}
