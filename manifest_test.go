package delegate_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/jsonin"
)

func TestParseManifest(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString([]byte("hello"))
	tests := []struct {
		name      string
		json      string
		wantField string // "" means valid
		wantRule  string
	}{
		{"minimal script", `{"agentType":"script","task":"echo hi"}`, "", ""},
		{"script via command", `{"agentType":"script","agent":{"command":"make test"}}`, "", ""},
		{"custom", `{"agentType":"custom","agent":{"command":"python3 run.py"},"task":"anything"}`, "", ""},
		{"claude", `{"agentType":"claude","task":"fix the bug","agent":{"claudeModel":"sonnet"}}`, "", ""},
		{"full", `{"agentType":"script","task":"x","files":[{"path":"a/b.txt","content":"` + b64 + `"},{"path":"/workspace/c","content":"","mode":"0755"}],
			"env":{"FOO":"bar"},"secrets":["API_KEY"],"resources":{"cpu":0.5,"memory":"512M","disk":"2G"},"timeout":60,
			"lifecycle":"persistent","vmTemplate":"/srv/rootfs","statusMode":"streaming"}`, "", ""},
		{"no agentType: a script", `{"task":"x"}`, "", ""},
		{"no agentType, no task", `{}`, "manifest.task", "is required: the shell script to run"},
		{"no agentType, a command", `{"task":"x","agent":{"command":"y"}}`, "manifest.agentType", "is required with agent.command"},
		{"bad agentType", `{"agentType":"docker","task":"x"}`, "manifest.agentType", "must be one of"},
		{"script no task", `{"agentType":"script"}`, "manifest.task", "is required"},
		{"custom no command", `{"agentType":"custom","task":"x"}`, "manifest.agent.command", "is required"},
		{"claude no task", `{"agentType":"claude"}`, "manifest.task", "is required"},
		{"unknown field", `{"agentType":"script","task":"x","timout":5}`, "manifest.timout", "unknown field"},
		{"wrong type", `{"agentType":"script","task":"x","timeout":"five"}`, "manifest.timeout", `must be seconds or a duration of whole seconds like "90s", "10m" or "1h30m" (got "five")`},
		{"wrong kind", `{"agentType":"script","task":"x","timeout":[5]}`, "manifest.timeout", `must be seconds or a duration like "10m" (got an array)`},
		{"git: a path", `{"task":"x","workspace":{"git":"/srv/repos/calc","ref":"v1"}}`, "", ""},
		{"git: neither", `{"task":"x","workspace":{"git":"repos/calc"}}`, "manifest.workspace.git", `must be an https URL or the absolute path of a repository under an allowed root (DELEGATE_WORKSPACE_ROOTS): "repos/calc" is neither`},
		{"a duration", `{"agentType":"script","task":"x","timeout":"10m"}`, "", ""},
		{"a duration too long", `{"agentType":"script","task":"x","timeout":"25h"}`, "manifest.timeout", "between 1 and 86400 seconds (got 90000"},
		{"every unknown field", `{"agentType":"script","task":"x","timout":5,"artefacts":[],"resources":{"memroy":"1G"},"network":{"allow":[],"deny":[]}}`,
			"manifest.timout", "unknown field (known: task, agentType, agent, files, env, secrets, resources, timeout, lifecycle, vmTemplate, statusMode, artifacts, network, stdin, sandbox, workspace, caches); " +
				"3 more unknown: manifest.artefacts, manifest.resources.memroy (known: cpu, memory, disk), manifest.network.deny (known: allow, ask)"},
		{"fraction", `{"agentType":"script","task":"x","timeout":1.5}`, "manifest.timeout", "must be an integer (got 1.5)"},
		{"integral float", `{"agentType":"script","task":"x","timeout":60.0}`, "", ""},
		{"timeout zero", `{"agentType":"script","task":"x","timeout":0}`, "manifest.timeout", "between 1 and 86400"},
		{"timeout null is absent", `{"agentType":"script","task":"x","timeout":null}`, "", ""},
		{"null manifest", `null`, "manifest", "required (an object)"},
		{"array manifest", `[]`, "manifest", "must be an object (got an array)"},
		{"duplicate key", `{"agentType":"script","task":"a","task":"b"}`, "manifest.task", "duplicate key"},
		{"duplicate escaped", `{"agentType":"script","task":"a","t\u0061sk":"b"}`, "manifest.task", "duplicate key"},
		{"duplicate after null", `{"agentType":"script","task":"a","timeout":null,"timeout":5}`, "manifest.timeout", "duplicate key"},
		{"duplicate env", `{"agentType":"script","task":"a","env":{"A":"1","A":"2"}}`, "manifest.env.A", "duplicate key"},
		{"duplicate in a file", `{"agentType":"script","task":"a","files":[{"path":"a","content":"","path":"b"}]}`, "manifest.files[0].path", "duplicate key"},
		{"case is not folded", `{"agentType":"script","Task":"x"}`, "manifest.Task", "unknown field"},
		{"env not string", `{"agentType":"script","task":"x","env":{"A":1}}`, "manifest.env.A", "must be a string (got a number)"},
		{"files not array", `{"agentType":"script","task":"x","files":{}}`, "manifest.files", "must be an array (got an object)"},
		{"file null", `{"agentType":"script","task":"x","files":[null]}`, "manifest.files[0]", "must be an object (got null)"},
		{"file without content", `{"agentType":"script","task":"x","files":[{"path":"a"}]}`, "manifest.files[0].content", "required (a string)"},
		{"third file not base64", `{"agentType":"script","task":"x","files":[{"path":"a","content":""},{"path":"b","content":"aGk="},{"path":"c","content":"aGk"}]}`, "manifest.files[2].content", "not base64"},
		{"wrapped base64", `{"agentType":"script","task":"x","files":[{"path":"a","content":"aGVs\nbG8="}]}`, "", ""},
		{"invalid UTF-8", "{\"agentType\":\"script\",\"task\":\"a\xffb\"}", "manifest.task", "not valid UTF-8"},
		{"lone surrogate", `{"agentType":"script","task":"a\ud800b"}`, "manifest.task", "lone UTF-16 surrogate"},
		{"surrogate pair", `{"agentType":"script","task":"\ud83d\ude00"}`, "", ""},
		{"raw newline in string", "{\"agentType\":\"script\",\"task\":\"a\nb\"}", "manifest.task", "control character"},
		{"trailing comma", `{"agentType":"script","task":"x",}`, "manifest", "not valid JSON"},
		{"timeout high", `{"agentType":"script","task":"x","timeout":86401}`, "manifest.timeout", "between 1 and 86400"},
		{"timeout negative", `{"agentType":"script","task":"x","timeout":-1}`, "manifest.timeout", "between 1 and 86400"},
		{"memory bad", `{"agentType":"script","task":"x","resources":{"memory":"lots"}}`, "manifest.resources.memory", "like 512M"},
		{"memory small", `{"agentType":"script","task":"x","resources":{"memory":"1M"}}`, "manifest.resources.memory", "at least 16M"},
		{"disk huge", `{"agentType":"script","task":"x","resources":{"disk":"5T"}}`, "manifest.resources.disk", "larger than 1T"},
		{"cpu high", `{"agentType":"script","task":"x","resources":{"cpu":1000}}`, "manifest.resources.cpu", "between"},
		{"env name", `{"agentType":"script","task":"x","env":{"1BAD":"v"}}`, "manifest.env", "must match"},
		{"env reserved", `{"agentType":"script","task":"x","env":{"DELEGATE_TASK":"v"}}`, "manifest.env.DELEGATE_TASK", "reserved"},
		{"secret name", `{"agentType":"script","task":"x","secrets":["a-b"]}`, "manifest.secrets[0]", "must match"},
		{"path escape", `{"agentType":"script","task":"x","files":[{"path":"../etc/passwd","content":""}]}`, "manifest.files[0].path", "inside /workspace"},
		{"abs outside", `{"agentType":"script","task":"x","files":[{"path":"/etc/passwd","content":""}]}`, "manifest.files[0].path", "inside /workspace"},
		{"workspace itself", `{"agentType":"script","task":"x","files":[{"path":"/workspace","content":""}]}`, "manifest.files[0].path", "inside /workspace"},
		{"dup path", `{"agentType":"script","task":"x","files":[{"path":"a","content":""},{"path":"/workspace/a","content":""}]}`, "manifest.files[1].path", "also files[0]"},
		{"bad mode", `{"agentType":"script","task":"x","files":[{"path":"a","content":"","mode":"rwx"}]}`, "manifest.files[0].mode", "octal"},
		{"setuid mode", `{"agentType":"script","task":"x","files":[{"path":"a","content":"","mode":"4755"}]}`, "manifest.files[0].mode", "octal"},
		{"bad base64", `{"agentType":"script","task":"x","files":[{"path":"a","content":"!!"}]}`, "manifest.files[0].content", "base64"},
		{"lifecycle", `{"agentType":"script","task":"x","lifecycle":"forever"}`, "manifest.lifecycle", "ephemeral or persistent"},
		{"statusMode", `{"agentType":"script","task":"x","statusMode":"loud"}`, "manifest.statusMode", "simple, detailed or streaming"},
		{"model on script", `{"agentType":"script","task":"x","agent":{"claudeModel":"sonnet"}}`, "manifest.agent.claudeModel", "only used with"},
		{"model chars", `{"agentType":"claude","task":"x","agent":{"claudeModel":"a b"}}`, "manifest.agent.claudeModel", "model name"},
		{"two objects", `{"agentType":"script","task":"x"} {}`, "manifest", "single JSON value"},
		{"not json", `nope`, "manifest", "valid JSON"},
		{"NUL in task", `{"agentType":"script","task":"a\u0000b"}`, "manifest.task", "NUL"},
		{"network egress", `{"task":"x","network":"egress"}`, "", ""},
		{"network allowlist", `{"task":"x","network":{"allow":["pypi.org","*.pythonhosted.org","github.com:443"],"ask":true}}`, "", ""},
		{"network empty allowlist", `{"task":"x","network":{"allow":[]}}`, "", ""},
		{"network mode", `{"task":"x","network":"internet"}`, "manifest.network", "must be none, egress or"},
		{"network allowlist without allow", `{"task":"x","network":{"ask":true}}`, "manifest.network.allow", "required (an array of strings)"},
		{"network unknown member", `{"task":"x","network":{"allow":[],"deny":["a"]}}`, "manifest.network.deny", "unknown field (known: allow, ask)"},
		{"network allow not strings", `{"task":"x","network":{"allow":["a.test",7]}}`, "manifest.network.allow[1]", "must be a string (got a number)"},
		{"network ask not bool", `{"task":"x","network":{"allow":[],"ask":"yes"}}`, "manifest.network.ask", "must be true or false"},
		{"network number", `{"task":"x","network":1}`, "manifest.network", `must be "none", "egress" or an allowlist`},
		{"network empty rule", `{"task":"x","network":{"allow":["a.test",""]}}`, "manifest.network.allow[1]", "must be a host name"},
		{"network duplicate member", `{"task":"x","network":{"allow":[],"allow":["a"]}}`, "manifest.network.allow", "duplicate key"},
		{"link", `{"task":"x","files":[{"path":"a","content":"","link":"b/c"},{"path":"b/c","content":"` + b64 + `"}]}`, "", ""},
		{"link with content", `{"task":"x","files":[{"path":"a","content":"` + b64 + `","link":"b"}]}`, "manifest.files[0].link", "content must be empty"},
		{"file under a link", `{"task":"x","files":[{"path":"d","content":"","link":"/etc"},{"path":"d/x/passwd","content":""}]}`, "manifest.files[1].path", "under files[0], a symbolic link"},
		{"NUL in a link", `{"task":"x","files":[{"path":"a","content":"","link":"b\u0000"}]}`, "manifest.files[0].link", "NUL"},
		{"stdin", `{"task":"cat","stdin":"` + b64 + `"}`, "", ""},
		{"stdin not base64", `{"task":"cat","stdin":"aGk"}`, "manifest.stdin", "not base64"},
		{"stdin of claude", `{"agentType":"claude","task":"x","stdin":"` + b64 + `"}`, "manifest.stdin", "its standard input is the prompt"},
		{"stdin too large", `{"task":"cat","stdin":"` + strings.Repeat("QUFB", delegate.MaxStdinBytes/3+1) + `"}`, "manifest.stdin", "at most 1048576 bytes once decoded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := jsonin.ParseManifest([]byte(tc.json))
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var fe *delegate.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("want a FieldError on %s, got %v", tc.wantField, err)
			}
			if fe.Field != tc.wantField || !strings.Contains(fe.Rule, tc.wantRule) {
				t.Fatalf("got %q: %q; want %q containing %q", fe.Field, fe.Rule, tc.wantField, tc.wantRule)
			}
			if !errors.Is(err, delegate.ErrInvalid) {
				t.Fatal("FieldError should match ErrInvalid")
			}
		})
	}
}

// TestParseSeconds: a duration is seconds or a Go duration of whole
// seconds, everywhere delegate takes one.
func TestParseSeconds(t *testing.T) {
	for in, want := range map[string]int{"600": 600, "10m": 600, "1h30m": 5400, "90s": 90, " 5 ": 5, "-5m": -300, "0": 0} {
		if got, err := delegate.ParseSeconds(in); err != nil || got != want {
			t.Errorf("ParseSeconds(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1.5s", "10 minutes", "5x", "1ms", "99999999h"} {
		if _, err := delegate.ParseSeconds(in); err == nil {
			t.Errorf("ParseSeconds(%q) accepted", in)
		}
	}
	m, err := jsonin.ParseManifest([]byte(`{"task":"x","timeout":"1h"}`))
	if err != nil || m.TimeoutSeconds() != 3600 {
		t.Errorf("timeout 1h: %d, %v", m.TimeoutSeconds(), err)
	}
}

// TestNormalSize: one form for a size, however it was written, and the
// defaults applied store it so.
func TestNormalSize(t *testing.T) {
	for in, want := range map[string]string{"1GB": "1G", "1GiB": "1G", "1g": "1G", "1024M": "1G", "1073741824": "1G", "1536M": "1536M",
		"512mb": "512M", "1T": "1T", "3K": "3K", "1000": "1000", "lots": "lots", "": ""} {
		if got := delegate.NormalSize(in); got != want {
			t.Errorf("NormalSize(%q) = %q, want %q", in, got, want)
		}
	}
	m := delegate.Manifest{Task: "x", Resources: &delegate.Resources{Memory: "1GB"}}
	m.ApplyDefaults(delegate.Defaults{Memory: "512M", Disk: "2048MiB"})
	if m.Resources.Memory != "1G" || m.Resources.Disk != "2G" {
		t.Errorf("the defaults applied: memory %q, disk %q", m.Resources.Memory, m.Resources.Disk)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"512M": 512 << 20, "2G": 2 << 30, "2GiB": 2 << 30, "2gb": 2 << 30, "1024": 1024, "1K": 1024, "1T": 1 << 40} {
		if got, err := delegate.ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "M", "1.5G", "-1G", "2X", "1iB", "99999999999999999999", "2T"} {
		if _, err := delegate.ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

func TestApplyDefaults(t *testing.T) {
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "x", Resources: &delegate.Resources{Memory: "1G"}}
	m.ApplyDefaults(delegate.Defaults{Timeout: 3600, CPU: 2, Memory: "2G", Disk: "10G", VMTemplate: "/t"})
	if *m.Timeout != 3600 || m.Resources.CPU != 2 || m.Resources.Memory != "1G" || m.Resources.Disk != "10G" ||
		m.VMTemplate != "/t" || m.Lifecycle != delegate.LifecycleEphemeral || m.StatusMode != delegate.StatusModeSimple {
		t.Fatalf("defaults applied wrong: %+v %+v", m, *m.Resources)
	}
}

// FuzzParseManifest: no input may crash the parser, and whatever it accepts
// must have every file path inside /workspace.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(`{"agentType":"script","task":"echo hi"}`))
	f.Add([]byte(`{"agentType":"custom","agent":{"command":"x"},"files":[{"path":"a/../b","content":"aGk="}]}`))
	f.Add([]byte(`{"agentType":"claude","task":"t","resources":{"cpu":1,"memory":"1G","disk":"1G"},"timeout":5}`))
	f.Add([]byte(`{"agentType":"script","task":"x","files":[{"path":"/workspace/../etc","content":""}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := jsonin.ParseManifest(data)
		if err != nil {
			var fe *delegate.FieldError
			if !errors.As(err, &fe) || fe.Field == "" || fe.Rule == "" {
				t.Fatalf("error without field and rule: %v", err)
			}
			return
		}
		files, err := m.DecodedFiles()
		if err != nil {
			t.Fatalf("accepted manifest has undecodable files: %v", err)
		}
		for _, f := range files {
			if !strings.HasPrefix(f.Path, delegate.Workspace+"/") || strings.Contains(f.Path, "/../") || strings.HasSuffix(f.Path, "/..") {
				t.Fatalf("accepted path %q escapes /workspace", f.Path)
			}
		}
	})
}

// TestFilesTotal: files may total exactly MaxFileBytesTotal (base64
// padding is not counted as content), and not a byte more.
func TestFilesTotal(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		ok    bool
	}{
		{[]int{delegate.MaxFileBytesTotal}, true},
		{[]int{delegate.MaxFileBytesTotal - 1, 1}, true},
		{[]int{delegate.MaxFileBytesTotal, 1}, false},
		{[]int{delegate.MaxFileBytesTotal + 1}, false},
	} {
		m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "x"}
		for i, n := range tc.sizes {
			m.Files = append(m.Files, delegate.File{Path: fmt.Sprintf("f%d", i), Content: base64.StdEncoding.EncodeToString(make([]byte, n))})
		}
		if err := m.Validate(); (err == nil) != tc.ok {
			t.Errorf("files of %v bytes: %v", tc.sizes, err)
		}
	}
}

// TestNULAndSizeAreTwoRules: a NUL byte in a text field and a value over
// its size are told apart (one message said both, "at most N bytes
// without NUL", for either), and the NUL's place is given.
func TestNULAndSizeAreTwoRules(t *testing.T) {
	long := strings.Repeat("a", 5000)
	for _, tc := range []struct {
		name  string
		m     func(m *delegate.Manifest)
		field string
		want  string
		not   string
	}{
		{"env NUL", func(m *delegate.Manifest) { m.Env = map[string]string{"A": "x\x00y"} }, "manifest.env.A", "value must not contain a NUL byte (one is at byte 1)", "at most"},
		{"env size", func(m *delegate.Manifest) {
			m.Env = map[string]string{"A": strings.Repeat("a", delegate.MaxEnvValueBytes+1)}
		}, "manifest.env.A", "value must be at most", "NUL"},
		{"path NUL", func(m *delegate.Manifest) { m.Files = []delegate.File{{Path: "a\x00b", Content: ""}} }, "manifest.files[0].path", "must not contain a NUL byte (one is at byte 1)", "at most"},
		{"path size", func(m *delegate.Manifest) { m.Files = []delegate.File{{Path: long}} }, "manifest.files[0].path", "must be at most 4096 bytes (got 5000)", "NUL"},
		{"template NUL", func(m *delegate.Manifest) { m.VMTemplate = "\x00" }, "manifest.vmTemplate", "must not contain a NUL byte (one is at byte 0)", "at most"},
		{"agent command size", func(m *delegate.Manifest) {
			m.Agent = &delegate.AgentConfig{Command: strings.Repeat("a", delegate.MaxTaskBytes+1)}
		}, "manifest.agent.command", "must be at most", "NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}
			tc.m(&m)
			err := m.Validate()
			var fe *delegate.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Rule, tc.want) || strings.Contains(fe.Rule, tc.not) {
				t.Errorf("%v; want %s: …%s…, without %q", err, tc.field, tc.want, tc.not)
			}
		})
	}
}
