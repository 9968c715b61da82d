package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/mock"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The sandbox tools over a mock SandboxService.

func init() {
	toolTypes["open_sandbox"] = struct{ in, out reflect.Type }{reflect.TypeFor[mcpserver.OpenSandboxIn](), reflect.TypeFor[mcpserver.OpenSandboxOut]()}
	toolTypes["list_sandboxes"] = struct{ in, out reflect.Type }{reflect.TypeFor[mcpserver.ListSandboxesIn](), reflect.TypeFor[mcpserver.ListSandboxesOut]()}
	toolTypes["sandbox_files"] = struct{ in, out reflect.Type }{reflect.TypeFor[mcpserver.FilesIn](), reflect.TypeFor[mcpserver.FilesOut]()}
	// With sandboxes, release_job takes a sandbox_id too.
	toolTypes["release_job"] = struct{ in, out reflect.Type }{reflect.TypeFor[mcpserver.ReleaseIn](), reflect.TypeFor[mcpserver.ReleaseOut]()}
}

func keptSandbox(id string) *delegate.Sandbox {
	return &delegate.Sandbox{ID: id, State: delegate.SandboxPaused, Backend: "local", Instance: "inst-secret", JobID: "job-1",
		Resources: delegate.Resources{CPU: 1, Memory: "512M", Disk: "1G"}, Network: delegate.Network{Mode: delegate.NetworkNone},
		CreatedAt: t0, LastUsedAt: t0.Add(time.Minute + 123456789), PausedAt: t0.Add(31 * time.Minute), ExpiresAt: t0.Add(24 * time.Hour),
		IdleTimeout: 30 * time.Minute, PauseTimeout: 24 * time.Hour, Commands: 3}
}

// fullSandboxes answers every sandbox call with something, for the
// schema checks.
func fullSandboxes(m *mock.SandboxService) {
	m.OpenSandboxFn = func(ctx context.Context, spec delegate.SandboxSpec) (*delegate.Sandbox, error) {
		sb := keptSandbox("sbx-new")
		sb.State, sb.PausedAt, sb.JobID, sb.Commands = delegate.SandboxIdle, time.Time{}, "", 0
		return sb, nil
	}
	m.GetSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, error) { return keptSandbox(id), nil }
	m.ListSandboxesFn = func(ctx context.Context, opts delegate.SandboxListOptions) ([]delegate.Sandbox, error) {
		return []delegate.Sandbox{*keptSandbox("sbx-2"), *keptSandbox("sbx-1")}, nil
	}
	m.ReleaseSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, bool, error) {
		sb := keptSandbox(id)
		sb.State, sb.EndedAt, sb.Reason = delegate.SandboxReleased, t0.Add(time.Hour), "released"
		return sb, true, nil
	}
	m.ReadSandboxFileFn = func(ctx context.Context, id, path string, offset, length int64) (*delegate.FileContent, error) {
		return &delegate.FileContent{Data: []byte("hi\n"), Offset: offset, Size: offset + 3, EOF: true}, nil
	}
	m.WriteSandboxFileFn = func(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error { return nil }
	m.ListSandboxFilesFn = func(ctx context.Context, id string, opts delegate.FileListOptions) (*delegate.FileListing, error) {
		return &delegate.FileListing{Entries: []delegate.FileInfo{
			{Path: "f", Type: "file", Size: 3, Mode: 0o644, ModTime: t0},
			{Path: "bin", Type: "dir", Size: 4096, Mode: fs.ModeDir | 0o755, ModTime: t0},
			{Path: "l", Type: "link", Mode: fs.ModeSymlink | 0o777, ModTime: t0, Link: "f"},
		}}, nil
	}
}

// checkOutput validates a tool's structured output against the schema it
// publishes and the typed schema of its Go type, as
// TestToolOutputsMatchSchemas does for one call of each tool.
func checkOutput(t *testing.T, cs *mcp.ClientSession, res *mcp.CallToolResult, tool string) {
	t.Helper()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(tools.Tools, func(x *mcp.Tool) bool { return x.Name == tool })
	if i < 0 {
		t.Fatalf("no tool %s", tool)
	}
	typed, err := jsonschema.ForType(toolTypes[tool].out, nil)
	if err != nil {
		t.Fatal(err)
	}
	var instance any
	out, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(out, &instance)
	if err := resolve(t, tools.Tools[i].OutputSchema).Validate(instance); err != nil {
		t.Errorf("%s: %s does not match the declared schema: %v", tool, out, err)
	}
	if err := resolve(t, typed).Validate(instance); err != nil {
		t.Errorf("%s: %s does not match the typed schema: %v", tool, out, err)
	}
	raw, _ := json.Marshal(tools.Tools[i].OutputSchema)
	var declared map[string]any
	json.Unmarshal(raw, &declared)
	if missing := undeclared(instance, declared, ""); len(missing) > 0 {
		t.Errorf("%s: output fields %v are not declared in %s", tool, missing, raw)
	}
}

func TestOpenListRelease(t *testing.T) {
	s := fullService()
	var spec delegate.SandboxSpec
	open := s.OpenSandboxFn
	s.OpenSandboxFn = func(ctx context.Context, sp delegate.SandboxSpec) (*delegate.Sandbox, error) {
		spec = sp
		return open(ctx, sp)
	}
	var got string
	s.GetSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, error) {
		got = id
		return keptSandbox(id), nil
	}
	cs := connect(t, s, nil)

	var o mcpserver.OpenSandboxOut
	res := call(t, cs, "open_sandbox", map[string]any{"resources": map[string]any{"memory": "1G", "cpu": 2}, "vmTemplate": "debian",
		"network": "egress", "idle_timeout": "10m", "lifetime": 7200}) // a duration or seconds
	structured(t, res, &o)
	want := delegate.SandboxSpec{Resources: &delegate.Resources{Memory: "1G", CPU: 2}, VMTemplate: "debian", Network: delegate.Network{Mode: delegate.NetworkEgress},
		IdleTimeout: 600, Lifetime: 7200}
	if !reflect.DeepEqual(spec, want) {
		t.Errorf("the service got %+v, want %+v", spec, want)
	}
	if o.SandboxID != "sbx-new" || o.State != delegate.SandboxIdle || !o.ExpiresAt.Equal(t0.Add(24*time.Hour)) {
		t.Errorf("open_sandbox answered %+v", o)
	}

	var l mcpserver.ListSandboxesOut
	res = call(t, cs, "list_sandboxes", map[string]any{})
	structured(t, res, &l)
	checkOutput(t, cs, res, "list_sandboxes")
	if text := errorText(res); strings.Contains(text, "inst-secret") {
		t.Errorf("list_sandboxes shows the backend's instance: %s", text)
	}
	if len(l.Sandboxes) != 2 || l.Sandboxes[0].SandboxID != "sbx-2" || l.Sandboxes[1].State != delegate.SandboxPaused {
		t.Errorf("list_sandboxes %+v", l)
	}
	first := l.Sandboxes[0]
	if !first.LastUsedAt.Equal(t0.Add(time.Minute+123*time.Millisecond)) || first.Commands != 3 || first.JobID != "job-1" {
		t.Errorf("a sandbox shown as %+v", first)
	}
	structured(t, call(t, cs, "list_sandboxes", map[string]any{"sandbox_id": "sbx-7"}), &l)
	if got != "sbx-7" || len(l.Sandboxes) != 1 || l.Sandboxes[0].SandboxID != "sbx-7" {
		t.Errorf("list_sandboxes of one: asked %q, got %+v", got, l)
	}

	// release_job releases a sandbox by its id, or by the persistent job
	// that made it; one of the two.
	var released []string
	s.ReleaseSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, bool, error) {
		released = append(released, id)
		return keptSandbox(id), id == "sbx-1", nil
	}
	s.ReleaseFn = func(ctx context.Context, id string) (*delegate.Job, bool, error) {
		released = append(released, id)
		return finishedJob(id), true, nil
	}
	var r mcpserver.ReleaseOut
	res = call(t, cs, "release_job", map[string]any{"sandbox_id": "sbx-1"})
	structured(t, res, &r)
	checkOutput(t, cs, res, "release_job")
	if !r.Released {
		t.Errorf("release_job of a sandbox: %+v", r)
	}
	if structured(t, call(t, cs, "release_job", map[string]any{"sandbox_id": "sbx-2"}), &r); r.Released {
		t.Errorf("release_job of a sandbox gone already: %+v", r)
	}
	if structured(t, call(t, cs, "release_job", map[string]any{"job_id": "job-4"}), &r); !r.Released {
		t.Errorf("release_job of a job: %+v", r)
	}
	if fmt.Sprint(released) != "[sbx-1 sbx-2 job-4]" {
		t.Errorf("released %v", released)
	}
	for _, args := range []map[string]any{{}, {"job_id": "job-4", "sandbox_id": "sbx-1"}} {
		if res := call(t, cs, "release_job", args); !res.IsError || errorText(res) != "sandbox_id: give sandbox_id or job_id, one of them" {
			t.Errorf("release_job %v: %s", args, errorText(res))
		}
	}
}

// TestOpenSandboxRefusesBadSpecs: the spec's rules are the domain's
// (SandboxSpec.Validate), named by the field, before the service is asked.
func TestOpenSandboxRefusesBadSpecs(t *testing.T) {
	s := fullService()
	s.OpenSandboxFn = func(context.Context, delegate.SandboxSpec) (*delegate.Sandbox, error) {
		t.Error("an invalid spec reached the service")
		return nil, fmt.Errorf("no")
	}
	cs := connect(t, s, nil)
	for args, want := range map[string]string{
		`{"idle_timeout":-5}`:                      "idle_timeout: must be between 1 and",
		`{"lifetime":99999999}`:                    "lifetime: must be between 1 and",
		`{"resources":{"memory":"lots"}}`:          "manifest.resources.memory",
		`{"network":"wifi"}`:                       "network",
		`{"lifetime":"an hour"}`:                   `lifetime: must be seconds or a duration of whole seconds like "90s"`,
		`{"idle_timeout":"-5m"}`:                   "idle_timeout: must be between 1 and",
		`{"pause_timeout":60}`:                     "pause_timeout: unknown field",
		`{"resources":{"memory":"1G","x":1}}`:      "resources.x: unknown field",
		`{"vmTemplate":"debian","vmTemplate":"x"}`: "vmTemplate: duplicate key",
	} {
		res := callRaw(t, cs, "open_sandbox", args)
		if !res.IsError || !strings.Contains(errorText(res), want) {
			t.Errorf("%s: %q, want an error saying %q", args, errorText(res), want)
		}
	}
}

func TestSandboxFiles(t *testing.T) {
	s := fullService()
	type readCall struct {
		id, path       string
		offset, length int64
	}
	var reads []readCall
	file := bytes.Repeat([]byte("abcdefgh"), 1<<18) // 2 MiB
	file[5] = 0xff                                  // not UTF-8
	s.ReadSandboxFileFn = func(ctx context.Context, id, path string, offset, length int64) (*delegate.FileContent, error) {
		reads = append(reads, readCall{id, path, offset, length})
		if path == "text.txt" {
			return &delegate.FileContent{Data: []byte("héllo\n"), Size: 7, EOF: true}, nil
		}
		end := min(offset+length, int64(len(file)))
		return &delegate.FileContent{Data: file[offset:end], Offset: offset, Size: int64(len(file)), EOF: end == int64(len(file))}, nil
	}
	type writeCall struct {
		path string
		data []byte
		mode fs.FileMode
	}
	var writes []writeCall
	s.WriteSandboxFileFn = func(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error {
		writes = append(writes, writeCall{path, data, mode})
		return nil
	}
	var listed delegate.FileListOptions
	list := s.ListSandboxFilesFn
	s.ListSandboxFilesFn = func(ctx context.Context, id string, opts delegate.FileListOptions) (*delegate.FileListing, error) {
		listed = opts
		return list(ctx, id, opts)
	}
	cs := connect(t, s, nil)

	// Text comes back as text.
	var out mcpserver.FilesOut
	res := call(t, cs, "sandbox_files", map[string]any{"sandbox_id": "sbx-1", "op": "read", "path": "text.txt"})
	structured(t, res, &out)
	checkOutput(t, cs, res, "sandbox_files")
	if out.Text == nil || *out.Text != "héllo\n" || out.Content != nil || out.EOF == nil || !*out.EOF || out.NextOffset != nil {
		t.Errorf("text read: %s", errorText(res))
	}
	if reads[0] != (readCall{"sbx-1", "text.txt", 0, delegate.MaxFileRead}) {
		t.Errorf("the service was asked %+v (the default length is the most a read returns)", reads[0])
	}

	// A binary file larger than a read: base64, paged by next_offset
	// until eof, byte for byte.
	var got []byte
	offset := int64(0)
	for n := 0; ; n++ {
		var part mcpserver.FilesOut
		res := call(t, cs, "sandbox_files", map[string]any{"sandbox_id": "sbx-1", "op": "read", "path": "big.bin", "offset": offset})
		structured(t, res, &part)
		if n == 0 {
			checkOutput(t, cs, res, "sandbox_files")
		}
		// The first part has the byte that is not UTF-8; the others are
		// text.
		var data []byte
		switch {
		case n == 0 && (part.Content == nil || part.Text != nil):
			t.Fatalf("the part of a binary file that is not UTF-8 is not base64: %.200s", errorText(res))
		case part.Content != nil:
			var err error
			if data, err = base64.StdEncoding.DecodeString(*part.Content); err != nil {
				t.Fatal(err)
			}
		case part.Text != nil:
			data = []byte(*part.Text)
		}
		got = append(got, data...)
		if *part.EOF {
			if part.NextOffset != nil {
				t.Errorf("next_offset at eof")
			}
			break
		}
		if part.NextOffset == nil || *part.NextOffset != offset+int64(len(data)) || *part.Size != int64(len(file)) {
			t.Fatalf("part %d: next_offset %v after %d bytes from %d", n, part.NextOffset, len(data), offset)
		}
		offset = *part.NextOffset
		if n > 3 {
			t.Fatal("no eof")
		}
	}
	if !bytes.Equal(got, file) {
		t.Errorf("paged read: %d bytes, not the file's %d", len(got), len(file))
	}

	// Writes: base64 or text, with a mode.
	var written mcpserver.FilesOut
	structured(t, call(t, cs, "sandbox_files", map[string]any{"sandbox_id": "sbx-1", "op": "write", "path": "a/b.bin",
		"content": base64.StdEncoding.EncodeToString([]byte{0, 1, 0xff}), "mode": "0755"}), &written)
	if written.Size == nil || *written.Size != 3 || written.EOF != nil || written.Text != nil {
		t.Errorf("write answered %+v", written)
	}
	res = call(t, cs, "sandbox_files", map[string]any{"sandbox_id": "sbx-1", "op": "write", "path": "main.go", "text": "package main\n"})
	structured(t, res, &out)
	checkOutput(t, cs, res, "sandbox_files")
	res = call(t, cs, "sandbox_files", map[string]any{"sandbox_id": "sbx-1", "op": "write", "path": "empty", "text": ""})
	structured(t, res, &out)
	want := []writeCall{{"a/b.bin", []byte{0, 1, 0xff}, 0o755}, {"main.go", []byte("package main\n"), 0o644}, {"empty", []byte{}, 0o644}}
	if !reflect.DeepEqual(writes, want) {
		t.Errorf("writes %+v, want %+v", writes, want)
	}

	// A listing, with each entry's permissions in octal.
	res = call(t, cs, "sandbox_files", map[string]any{"sandbox_id": "sbx-1", "op": "list", "path": "src", "depth": 2, "limit": 50})
	structured(t, res, &out)
	checkOutput(t, cs, res, "sandbox_files")
	if listed != (delegate.FileListOptions{Path: "src", Depth: 2, Limit: 50}) {
		t.Errorf("list options %+v", listed)
	}
	if len(out.Entries) != 3 || out.Entries[0].Mode != "0644" || out.Entries[1].Mode != "0755" || out.Entries[1].Type != "dir" || out.Entries[2].Link != "f" {
		t.Errorf("listing %s", errorText(res))
	}
	s.ListSandboxFilesFn = func(context.Context, string, delegate.FileListOptions) (*delegate.FileListing, error) {
		return &delegate.FileListing{}, nil
	}
	if res := call(t, cs, "sandbox_files", map[string]any{"sandbox_id": "sbx-1", "op": "list"}); errorText(res) != `{"entries":[]}` {
		t.Errorf("an empty directory: %s", errorText(res))
	}
}

// TestSandboxArgumentErrors: what sandbox_files and its siblings refuse,
// naming the field and the rule, before the service is asked.
func TestSandboxArgumentErrors(t *testing.T) {
	cs := connect(t, validatingService(), nil)
	for _, tc := range []struct{ tool, args, want string }{
		{"sandbox_files", `{"sandbox_id":"sbx-1"}`, "op: required (a string)"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"delete","path":"f"}`, `op: must be one of read, write, list, not "delete"`},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"read"}`, "path: is required for op read"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"read","path":"f","length":2000000}`,
			"length: must be between 1 and 1048576 bytes, not 2000000: read a larger file in parts, each from the last one's next_offset"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"read","path":"f","length":-1}`, "length: must be between 1 and 1048576"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"read","path":"f","offset":-1}`, "offset: must be 0 or more"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"read","path":"f","content":"aGk="}`, "content: is for op write only"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"list","offset":5}`, "offset: is for op read only"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"write","path":"f","depth":1,"text":""}`, "depth: is for op list only"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"write","path":"f"}`, "content: is required for op write"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"write","content":"aGk="}`, "path: is required for op write"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"write","path":"f","content":"a b"}`, "content: not base64"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"write","path":"f","content":"aGk=","text":"hi"}`, "content: give content (base64) or text, not both"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"write","path":"f","text":"x","mode":"0999"}`, `mode: must be octal permissions from 0000 to 0777`},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"write","path":"f","text":"x","mode":"4755"}`, `mode: must be octal permissions from 0000 to 0777 such as 0644 or 0755, not "4755"`},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"write","path":"f","text":"x","mode":644}`, "mode: must be a string (got a number)"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"list","depth":33}`, "depth: must be between 1 and 32"},
		{"sandbox_files", `{"sandbox_id":"sbx-1","op":"list","limit":10001}`, "limit: must be between 1 and 10000"},
		{"release_job", `{"sandbox_id":7}`, "sandbox_id: must be a string (got a number)"},
		{"release_job", `{"sandbox":"a"}`, "sandbox: unknown field (known: job_id, sandbox_id)"},
		{"list_sandboxes", `{"sandbox_id":5}`, "sandbox_id: must be a string (got a number)"},
		{"submit_job", `{"manifest":{"task":"x","sandbox":"SBX 1"}}`, `manifest.sandbox: must be a sandbox id like sbx-…`},
		{"submit_job", `{"manifest":{"task":"x","sandbox":"sbx-1","network":"egress"}}`, `manifest.network: is the sandbox's own`},
	} {
		res := callRaw(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.HasPrefix(errorText(res), tc.want) {
			t.Errorf("%s %s: %q, want %q", tc.tool, tc.args, errorText(res), tc.want)
		}
	}
}

// TestSandboxNotFound: a sandbox that is not there is named by the
// argument that named it, with the way to the ones that are.
func TestSandboxNotFound(t *testing.T) {
	s := fullService()
	s.GetSandboxFn = func(context.Context, string) (*delegate.Sandbox, error) {
		return nil, delegate.SandboxNotFound("sbx-x")
	}
	s.ReleaseSandboxFn = func(context.Context, string) (*delegate.Sandbox, bool, error) {
		return nil, false, delegate.SandboxNotFound("sbx-x")
	}
	s.ReleaseFn = func(context.Context, string) (*delegate.Job, bool, error) {
		return nil, false, delegate.JobNotFound("job-x")
	}
	s.ReadSandboxFileFn = func(context.Context, string, string, int64, int64) (*delegate.FileContent, error) {
		return nil, fmt.Errorf("sandbox sbx-x: %w", delegate.ErrNotFound) // without a NotFoundError
	}
	s.WriteSandboxFileFn = func(context.Context, string, string, []byte, fs.FileMode) error {
		return &delegate.FieldError{Field: "path", Rule: `"../etc/passwd" leads out of /workspace: paths stay inside it`}
	}
	s.SubmitFn = func(context.Context, delegate.Manifest, delegate.SubmitOptions) (*delegate.Job, error) {
		return nil, delegate.SandboxNotFound("sbx-x")
	}
	cs := connect(t, s, nil)
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"list_sandboxes", map[string]any{"sandbox_id": "sbx-x"}, `sandbox_id: sandbox "sbx-x": not found (list_sandboxes shows the sandboxes that exist)`},
		{"release_job", map[string]any{"sandbox_id": "sbx-x"}, `sandbox_id: sandbox "sbx-x": not found (list_sandboxes shows`},
		{"release_job", map[string]any{"job_id": "job-x"}, `job_id: job "job-x": not found (list_jobs shows`},
		{"sandbox_files", map[string]any{"sandbox_id": "sbx-x", "op": "read", "path": "f"}, "sandbox_id: sandbox sbx-x: not found (list_sandboxes shows"},
		{"sandbox_files", map[string]any{"sandbox_id": "sbx-1", "op": "write", "path": "../etc/passwd", "text": ""}, `path: "../etc/passwd" leads out of /workspace`},
		{"submit_job", map[string]any{"manifest": map[string]any{"task": "ls", "sandbox": "sbx-x"}},
			`manifest.sandbox: sandbox "sbx-x": not found (list_sandboxes shows the sandboxes that exist)`},
	} {
		res := call(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.HasPrefix(errorText(res), tc.want) {
			t.Errorf("%s: %q, want %q", tc.tool, errorText(res), tc.want)
		}
	}
	// A job tool's missing job is still about its job_id.
	s.GetFn = func(context.Context, string) (*delegate.Job, error) { return nil, delegate.JobNotFound("job-x") }
	if res := call(t, cs, "get_job_status", map[string]any{"job_id": "job-x"}); !strings.HasPrefix(errorText(res), `job_id: job "job-x": not found (list_jobs`) {
		t.Errorf("get_job_status: %q", errorText(res))
	}
}

// TestJobNamesItsSandbox: a command's status, result and job:// resource
// name the kept sandbox it ran in; a job without one says nothing of it.
func TestJobNamesItsSandbox(t *testing.T) {
	s := fullService()
	s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		j := finishedJob(id)
		j.Sandbox = "sbx-1"
		j.Manifest.Sandbox = "sbx-1"
		return j, nil
	}
	result := s.ResultFn
	s.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		r, err := result(ctx, id, opts)
		r.Sandbox = "sbx-1"
		return r, err
	}
	cs := connect(t, s, nil)
	var st mcpserver.StatusOut
	res := call(t, cs, "get_job_status", map[string]any{"job_id": "job-1"})
	structured(t, res, &st)
	checkOutput(t, cs, res, "get_job_status")
	var r mcpserver.ResultOut
	res = call(t, cs, "get_job_result", map[string]any{"job_id": "job-1"})
	structured(t, res, &r)
	checkOutput(t, cs, res, "get_job_result")
	if st.SandboxID != "sbx-1" || r.SandboxID != "sbx-1" {
		t.Errorf("status %q, result %q: the sandbox is not named", st.SandboxID, r.SandboxID)
	}
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "job://job-1"})
	if err != nil || !strings.Contains(rr.Contents[0].Text, `"sandbox_id":"sbx-1"`) {
		t.Errorf("job resource: %v %+v", err, rr)
	}

	plain := connect(t, fullService(), nil)
	for _, tool := range []string{"get_job_status", "get_job_result"} {
		if text := errorText(call(t, plain, tool, map[string]any{"job_id": "job-1"})); strings.Contains(text, "sandbox") {
			t.Errorf("%s of a job without a kept sandbox: %s", tool, text)
		}
	}
}

func TestSandboxResource(t *testing.T) {
	s := fullService()
	get := s.GetSandboxFn
	s.GetSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, error) {
		if id != "sbx-1" {
			return nil, delegate.SandboxNotFound(id)
		}
		return get(ctx, id)
	}
	cs := connect(t, s, nil)
	ctx := context.Background()
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "sandbox://sbx-1"})
	if err != nil {
		t.Fatal(err)
	}
	var sb mcpserver.SandboxOut
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &sb); err != nil || sb.SandboxID != "sbx-1" || sb.State != delegate.SandboxPaused ||
		res.Contents[0].MIMEType != "application/json" {
		t.Errorf("sandbox resource %+v: %v", res.Contents[0], err)
	}
	for _, uri := range []string{"sandbox://sbx-nope", "sandbox://sbx-1/files"} {
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil || !strings.Contains(strings.ToLower(err.Error()), "not found") {
			t.Errorf("%s: %v, want not found", uri, err)
		}
	}
	templates, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil || !slices.ContainsFunc(templates.ResourceTemplates, func(rt *mcp.ResourceTemplate) bool { return rt.URITemplate == "sandbox://{id}" }) {
		t.Errorf("sandbox://{id} is not listed: %v", err)
	}
}

// TestNoSandboxToolsWithoutSandboxes: a service that keeps no sandboxes
// gets the job tools alone, and submit_job still takes manifest.sandbox
// (the service refuses it).
func TestNoSandboxToolsWithoutSandboxes(t *testing.T) {
	jobsOnly := struct{ *mock.JobService }{&newService().JobService}
	jobsOnly.WatchFn = func(ctx context.Context) <-chan string { return make(chan string) }
	cs := connect(t, jobsOnly, nil)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if strings.Contains(tool.Name, "sandbox") {
			t.Errorf("%s offered by a service without sandboxes", tool.Name)
		}
	}
	if len(tools.Tools) != 8 {
		t.Errorf("%d tools, want the 8 job tools", len(tools.Tools))
	}
}
