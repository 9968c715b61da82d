package delegate

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// AgentType says how a job's work is started inside the sandbox.
type AgentType string

const (
	AgentClaude AgentType = "claude" // the Claude CLI, task as its prompt
	AgentScript AgentType = "script" // agent.command (or else task) through /bin/sh -c
	AgentCustom AgentType = "custom" // agent.command, task in $DELEGATE_TASK
)

// Lifecycle says what happens to the sandbox after the job.
type Lifecycle string

const (
	LifecycleEphemeral  Lifecycle = "ephemeral"
	LifecyclePersistent Lifecycle = "persistent"
)

// StatusMode says how much of a running job the client wants to follow.
type StatusMode string

const (
	StatusModeSimple    StatusMode = "simple"
	StatusModeDetailed  StatusMode = "detailed"
	StatusModeStreaming StatusMode = "streaming"
)

// Workspace is the job's working directory inside every sandbox.
const Workspace = "/workspace"

// Limits on what a manifest may carry. They keep one submission from
// exhausting the server; they are generous for real work.
const (
	MaxTaskBytes      = 256 << 10
	MaxFiles          = 1000
	MaxFileBytesTotal = 64 << 20
	MaxEnv            = 256
	MaxEnvValueBytes  = 128 << 10
	MaxSecrets        = 64
	MaxTimeoutSeconds = 86400
	MaxCPU            = 128
	MinMemoryBytes    = 16 << 20
	MinDiskBytes      = 1 << 20
	MaxSizeBytes      = 1 << 40
	MaxArtifactGlobs  = 32
	// MaxStdinBytes caps a job's standard input (decoded): it travels in
	// the manifest and into the sandbox in memory, like the task. More
	// data goes in files.
	MaxStdinBytes = 1 << 20
)

// Manifest is what a client submits: the seed's fields, field for field.
type Manifest struct {
	Task string `json:"task,omitempty"`
	// AgentType is script when left out and a task is given.
	AgentType AgentType         `json:"agentType,omitempty"`
	Agent     *AgentConfig      `json:"agent,omitempty"`
	Files     []File            `json:"files,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Secrets   []string          `json:"secrets,omitempty"`
	Resources *Resources        `json:"resources,omitempty"`
	// Timeout is in seconds, counted from running; nil asks for the
	// server's default (0 is not "no timeout": it is refused). In JSON it
	// may be a duration too ("10m"): the tag delegate:"seconds" tells
	// jsonin to read a string with ParseSeconds.
	Timeout    *int       `json:"timeout,omitempty" delegate:"seconds"`
	Lifecycle  Lifecycle  `json:"lifecycle,omitempty"`
	VMTemplate string     `json:"vmTemplate,omitempty"`
	StatusMode StatusMode `json:"statusMode,omitempty"`
	// Artifacts are globs relative to /workspace; matching files are kept.
	Artifacts []string `json:"artifacts,omitempty"`
	// Network is none (default), egress (default for claude), or an
	// allowlist {"allow": [...], "ask": bool} (network.go).
	Network Network `json:"network,omitzero"`
	// Stdin is the job's standard input, base64 (standard encoding), at
	// most MaxStdinBytes once decoded; empty: /dev/null. A claude job
	// reads its prompt there, so it takes none.
	Stdin string `json:"stdin,omitempty"`
	// Sandbox runs the job in a kept sandbox (its id) instead of a new
	// one: with its files, its network, its limits, its processes.
	Sandbox string `json:"sandbox,omitempty"`
	// Workspace is copied into /workspace before the job, and what the
	// job changes there is kept (see WorkspaceSource).
	Workspace *WorkspaceSource `json:"workspace,omitempty"`
	// Caches are kept between jobs of the same workspace source, mounted
	// at /cache/NAME (see Caches).
	Caches []string `json:"caches,omitempty"`
}

// Clone is a copy of the manifest that shares nothing a caller could
// change in place with it (maps, slices, pointed-to values).
func (m Manifest) Clone() Manifest {
	m.Files = slices.Clone(m.Files)
	m.Env = maps.Clone(m.Env)
	m.Secrets = slices.Clone(m.Secrets)
	m.Artifacts = slices.Clone(m.Artifacts)
	m.Caches = slices.Clone(m.Caches)
	m.Network.Allow = slices.Clone(m.Network.Allow)
	m.Agent = clonePtr(m.Agent)
	m.Resources = clonePtr(m.Resources)
	m.Timeout = clonePtr(m.Timeout)
	m.Workspace = clonePtr(m.Workspace)
	return m
}

// clonePtr points to a copy of *p (nil for nil).
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

// AgentConfig tunes the agent.
type AgentConfig struct {
	Command     string `json:"command,omitempty"`
	ClaudeModel string `json:"claudeModel,omitempty"`
}

// File is injected into the sandbox before the agent starts.
type File struct {
	Path    string `json:"path"`
	Content string `json:"content"`        // base64 (standard encoding)
	Mode    string `json:"mode,omitempty"` // octal permissions, e.g. "0755"; default "0644"
	// Link, if set, makes Path a symbolic link to Link instead of a file
	// (Content and Mode empty): a tree sent as it is, links as links.
	// Inside the sandbox a link resolves there, never on the server.
	Link string `json:"link,omitempty"`
}

// Resources asks for cpu cores, memory and workspace disk.
type Resources struct {
	CPU    float64 `json:"cpu,omitempty"`
	Memory string  `json:"memory,omitempty"` // like 512M, 2G
	Disk   string  `json:"disk,omitempty"`
}

// Defaults fill what a manifest leaves out.
type Defaults struct {
	Timeout    int
	CPU        float64
	Memory     string
	Disk       string
	VMTemplate string
}

var (
	nameRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })
	sizeRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9]+)([KMGT]?)(I?B?)$`) })
	modelRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._:\[\]-]{1,100}$`) })
	modeRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^0?[0-7]{3}$`) })
)

// ValidName reports whether s may be an environment variable or secret name.
func ValidName(s string) bool { return nameRE().MatchString(s) }

// ParseSize reads a size like 512M, 2G, 1024K or 1048576 (bytes); K, M, G
// and T are powers of 1024, with an optional "i" or "B" ("2GiB", "2GB").
func ParseSize(s string) (int64, error) {
	m := sizeRE().FindStringSubmatch(strings.ToUpper(strings.TrimSpace(s)))
	if m == nil || (m[2] == "" && m[3] != "") {
		return 0, fmt.Errorf("%q is not a size like 512M or 2G", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is too large", s)
	}
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m[2]]
	if n > MaxSizeBytes>>shift {
		return 0, fmt.Errorf("%q is larger than 1T", s)
	}
	return n << shift, nil
}

// NormalSize writes a size ParseSize reads in the one form delegate
// stores and shows: the largest unit that holds it exactly ("1GB", "1GiB",
// "1024M" and "1073741824" are all "1G"). A size ParseSize refuses is
// returned as it is, for Validate to refuse.
func NormalSize(s string) string {
	n, err := ParseSize(s)
	if err != nil || n == 0 {
		return s
	}
	for _, u := range []struct {
		shift uint
		unit  string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.unit
		}
	}
	return strconv.FormatInt(n, 10)
}

// ParseSeconds reads a duration as delegate takes it everywhere (the
// CLI's flags, a manifest, MCP's arguments): whole seconds, as an integer
// ("600") or a Go duration ("10m", "1h30m", "90s"). Its error is a
// *FieldError without a field, for the caller to name.
func ParseSeconds(s string) (int, error) {
	t := strings.TrimSpace(s)
	if n, err := strconv.Atoi(t); err == nil {
		return n, nil
	}
	d, err := time.ParseDuration(t)
	if err != nil || d%time.Second != 0 || d > time.Duration(math.MaxInt32)*time.Second {
		return 0, &FieldError{Rule: fmt.Sprintf("must be seconds or a duration of whole seconds like \"90s\", \"10m\" or \"1h30m\" (got %q)", s)}
	}
	return int(d / time.Second), nil
}

// OneOf lists the agent types, for messages.
func (AgentType) OneOf() []string {
	return []string{string(AgentClaude), string(AgentScript), string(AgentCustom)}
}

// TimeoutSeconds is the job's timeout once ApplyDefaults has run (the
// server's default before that).
func (m *Manifest) TimeoutSeconds() int {
	if m.Timeout == nil {
		return DefaultTimeoutSeconds
	}
	return *m.Timeout
}

// Validate checks every field and returns the first problem as a *FieldError.
func (m *Manifest) Validate() error {
	switch m.AgentType {
	case AgentClaude:
		if strings.TrimSpace(m.Task) == "" {
			return fieldErr("manifest.task", "is required for agentType claude (it is the prompt)")
		}
	case AgentScript:
		if strings.TrimSpace(m.Task) == "" && (m.Agent == nil || strings.TrimSpace(m.Agent.Command) == "") {
			return fieldErr("manifest.task", "is required for agentType script unless agent.command is set (it is the shell script to run)")
		}
	case AgentCustom:
		if m.Agent == nil || strings.TrimSpace(m.Agent.Command) == "" {
			return fieldErr("manifest.agent.command", "is required for agentType custom")
		}
	case "":
		// A task without an agent type is a shell script (ApplyDefaults).
		if strings.TrimSpace(m.Task) == "" {
			return fieldErr("manifest.task", "is required: the shell script to run (agentType script, the default), or the prompt (agentType claude)")
		}
		if m.Agent != nil && m.Agent.Command != "" {
			return fieldErr("manifest.agentType", "is required with agent.command: script or custom")
		}
	default:
		return fieldErr("manifest.agentType", "must be one of claude, script, custom (got %q)", m.AgentType)
	}
	if len(m.Task) > MaxTaskBytes {
		return fieldErr("manifest.task", "must be at most %d bytes (got %d)", MaxTaskBytes, len(m.Task))
	}
	if strings.ContainsRune(m.Task, 0) {
		return fieldErr("manifest.task", "must not contain NUL bytes")
	}
	if m.Agent != nil {
		if rule := TextRule(m.Agent.Command, MaxTaskBytes); rule != "" {
			return fieldErr("manifest.agent.command", "%s", rule)
		}
		if m.Agent.ClaudeModel != "" && !modelRE().MatchString(m.Agent.ClaudeModel) {
			return fieldErr("manifest.agent.claudeModel", "must be a model name such as sonnet or claude-sonnet-4-5 (letters, digits, . _ : - [ ])")
		}
		if m.Agent.ClaudeModel != "" && m.AgentType != AgentClaude {
			return fieldErr("manifest.agent.claudeModel", "is only used with agentType claude")
		}
	}
	if err := validateFiles(m.Files); err != nil {
		return err
	}
	if len(m.Env) > MaxEnv {
		return fieldErr("manifest.env", "must have at most %d variables", MaxEnv)
	}
	for k, v := range m.Env {
		if !ValidName(k) {
			return fieldErr("manifest.env", "name %q must match [A-Za-z_][A-Za-z0-9_]*", k)
		}
		if strings.HasPrefix(k, "DELEGATE_") {
			return fieldErr("manifest.env."+k, "names starting with DELEGATE_ are reserved")
		}
		if rule := TextRule(v, MaxEnvValueBytes); rule != "" {
			return fieldErr("manifest.env."+k, "value %s", rule)
		}
	}
	if len(m.Secrets) > MaxSecrets {
		return fieldErr("manifest.secrets", "must name at most %d secrets", MaxSecrets)
	}
	for i, s := range m.Secrets {
		if !ValidName(s) {
			return fieldErr(fmt.Sprintf("manifest.secrets[%d]", i), "name %q must match [A-Za-z_][A-Za-z0-9_]*", s)
		}
		if _, clash := m.Env[s]; clash {
			return fieldErr(fmt.Sprintf("manifest.secrets[%d]", i), "%q is also set in env; set it in one place", s)
		}
	}
	if r := m.Resources; r != nil {
		if !(r.CPU >= 0 && r.CPU <= MaxCPU) { // NaN too
			return fieldErr("manifest.resources.cpu", "must be between 0.01 and %d cores (got %g)", MaxCPU, r.CPU)
		}
		if r.CPU != 0 && r.CPU < 0.01 {
			return fieldErr("manifest.resources.cpu", "must be at least 0.01 cores (got %g)", r.CPU)
		}
		if err := checkSize("manifest.resources.memory", r.Memory, MinMemoryBytes); err != nil {
			return err
		}
		if err := checkSize("manifest.resources.disk", r.Disk, MinDiskBytes); err != nil {
			return err
		}
	}
	if t := m.Timeout; t != nil && (*t < 1 || *t > MaxTimeoutSeconds) {
		return fieldErr("manifest.timeout", "must be between 1 and %d seconds (got %d; leave it out for the default)", MaxTimeoutSeconds, *t)
	}
	switch m.Lifecycle {
	case "", LifecycleEphemeral, LifecyclePersistent:
	default:
		return fieldErr("manifest.lifecycle", "must be ephemeral or persistent (got %q)", m.Lifecycle)
	}
	switch m.StatusMode {
	case "", StatusModeSimple, StatusModeDetailed, StatusModeStreaming:
	default:
		return fieldErr("manifest.statusMode", "must be simple, detailed or streaming (got %q)", m.StatusMode)
	}
	if err := m.Network.Validate("manifest.network"); err != nil {
		return err
	}
	if len(m.Artifacts) > MaxArtifactGlobs {
		return fieldErr("manifest.artifacts", "must have at most %d globs", MaxArtifactGlobs)
	}
	for i, g := range m.Artifacts {
		if err := ValidArtifactGlob(g); err != nil {
			return fieldErr(fmt.Sprintf("manifest.artifacts[%d]", i), "%v", err)
		}
	}
	if m.Stdin != "" {
		if m.AgentType == AgentClaude {
			return fieldErr("manifest.stdin", "is not taken by agentType claude (its standard input is the prompt, the task)")
		}
		tooLarge := fmt.Sprintf("must be at most %d bytes once decoded (send larger data as files)", MaxStdinBytes)
		// A value far too long is refused before decoding (base64 may
		// be wrapped in lines, hence the slack).
		if len(m.Stdin) > 2*base64.StdEncoding.EncodedLen(MaxStdinBytes) {
			return fieldErr("manifest.stdin", "%s", tooLarge)
		}
		n, err := checkBase64(m.Stdin)
		if err != nil {
			return fieldErr("manifest.stdin", "%v", err)
		}
		if n > MaxStdinBytes {
			return fieldErr("manifest.stdin", "%s", tooLarge)
		}
	}
	if rule := TextRule(m.VMTemplate, 4096); rule != "" {
		return fieldErr("manifest.vmTemplate", "%s", rule)
	}
	if err := m.validateWorkspace(); err != nil {
		return err
	}
	if m.Sandbox != "" {
		if err := CheckSandboxID("manifest.sandbox", m.Sandbox); err != nil {
			return err
		}
		// The sandbox has its limits, its template and its network: a
		// command runs within them.
		for _, f := range []struct {
			name string
			set  bool
		}{{"resources", m.Resources != nil}, {"vmTemplate", m.VMTemplate != ""}, {"network", !m.Network.IsZero()}, {"lifecycle", m.Lifecycle != ""}} {
			if f.set {
				return fieldErr("manifest."+f.name, "is the sandbox's own for a command in sandbox %s: leave it out", m.Sandbox)
			}
		}
	}
	return nil
}

func checkSize(field, s string, min int64) error {
	if s == "" {
		return nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return fieldErr(field, "must be like 512M or 2G: %v", err)
	}
	if n < min {
		return fieldErr(field, "must be at least %dM (got %s)", min>>20, s)
	}
	return nil
}

func validateFiles(files []File) error {
	if len(files) > MaxFiles {
		return fieldErr("manifest.files", "must have at most %d files", MaxFiles)
	}
	seen := make(map[string]int, len(files))
	links := map[string]int{}
	var total int64
	for i, f := range files {
		field := fmt.Sprintf("manifest.files[%d]", i)
		p, err := WorkspacePath(f.Path)
		if err != nil {
			return fieldErr(field+".path", "%v", err)
		}
		if j, dup := seen[p]; dup {
			return fieldErr(field+".path", "%s is also files[%d]", p, j)
		}
		seen[p] = i
		if f.Link != "" {
			if rule := TextRule(f.Link, 4096); rule != "" {
				return fieldErr(field+".link", "%s", rule)
			}
			if f.Content != "" || f.Mode != "" {
				return fieldErr(field+".link", "makes a symbolic link: content must be empty (\"\") and mode left out")
			}
			links[p] = i
		}
		if f.Mode != "" && !modeRE().MatchString(f.Mode) {
			return fieldErr(field+".mode", "must be octal permissions like 0644 or 0755 (got %q)", f.Mode)
		}
		n, err := checkBase64(f.Content)
		if err != nil {
			return fieldErr(field+".content", "%v", err)
		}
		total += n
		if total > MaxFileBytesTotal {
			return fieldErr(field+".content", "files must total at most %d MiB", MaxFileBytesTotal>>20)
		}
	}
	if len(links) > 0 {
		// Nothing is written through a link: a file under a link's path
		// would land wherever the link points.
		for i, f := range files {
			p, _ := WorkspacePath(f.Path)
			for d := path.Dir(p); d != Workspace; d = path.Dir(d) {
				if j, ok := links[d]; ok {
					return fieldErr(fmt.Sprintf("manifest.files[%d].path", i), "%s is under files[%d], a symbolic link", p, j)
				}
			}
		}
	}
	return nil
}

// WorkspacePath resolves a manifest file path: relative paths land under
// /workspace, absolute ones must already be inside it. It returns the
// cleaned absolute path, never /workspace itself.
func WorkspacePath(p string) (string, error) {
	if p == "" {
		return "", errors.New("must not be empty")
	}
	if rule := TextRule(p, 4096); rule != "" {
		return "", errors.New(rule)
	}
	abs := p
	if !path.IsAbs(p) {
		abs = path.Join(Workspace, p)
	}
	abs = path.Clean(abs)
	if !strings.HasPrefix(abs, Workspace+"/") {
		return "", fmt.Errorf("%q must be relative or inside %s", p, Workspace)
	}
	for _, part := range strings.Split(strings.TrimPrefix(abs, Workspace+"/"), "/") {
		if part == ".." {
			return "", fmt.Errorf("%q must stay inside %s", p, Workspace)
		}
	}
	return abs, nil
}

// ApplyDefaults fills empty fields from d, so that the stored manifest shows
// the values the job really ran with.
func (m *Manifest) ApplyDefaults(d Defaults) {
	if m.Timeout == nil {
		m.Timeout = new(d.Timeout)
	}
	if m.Resources == nil {
		m.Resources = &Resources{}
	}
	if m.Resources.CPU == 0 {
		m.Resources.CPU = d.CPU
	}
	if m.Resources.Memory == "" {
		m.Resources.Memory = d.Memory
	}
	if m.Resources.Disk == "" {
		m.Resources.Disk = d.Disk
	}
	// One form for a size, however it was written ("1GB" is "1G").
	m.Resources.Memory, m.Resources.Disk = NormalSize(m.Resources.Memory), NormalSize(m.Resources.Disk)
	if m.VMTemplate == "" {
		m.VMTemplate = d.VMTemplate
	}
	if m.AgentType == "" {
		m.AgentType = AgentScript
	}
	if m.Lifecycle == "" {
		m.Lifecycle = LifecycleEphemeral
	}
	if m.StatusMode == "" {
		m.StatusMode = StatusModeSimple
	}
	if m.Network.Mode == "" {
		m.Network.Mode = NetworkNone
		if m.AgentType == AgentClaude {
			m.Network.Mode = NetworkEgress // the CLI must reach the model's API
		}
	}
}

// Digest is the SHA-256 of the manifest as it is (call it before
// ApplyDefaults: the manifest as submitted), in hex. It is computed over
// the manifest's JSON encoding, whose fields come in a fixed order and
// whose maps are sorted, so the same request digests the same however
// its JSON was spelled (key order, spaces, a null for an absent field).
// Call it on a validated manifest (whose every field encodes).
func (m *Manifest) Digest() string {
	b, err := json.Marshal(m)
	if err != nil {
		b = fmt.Appendf(nil, "%#v", *m) // not reached for a valid manifest
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// DecodedFiles returns the files with their content decoded and their path
// resolved inside /workspace. Call it on a validated manifest.
func (m *Manifest) DecodedFiles() ([]DecodedFile, error) {
	out := make([]DecodedFile, 0, len(m.Files))
	for i, f := range m.Files {
		p, err := WorkspacePath(f.Path)
		if err != nil {
			return nil, fieldErr(fmt.Sprintf("manifest.files[%d].path", i), "%v", err)
		}
		if f.Link != "" {
			out = append(out, DecodedFile{Path: p, Data: []byte(f.Link), Mode: fs.ModeSymlink | 0o777})
			continue
		}
		data, err := base64.StdEncoding.DecodeString(f.Content)
		if err != nil {
			return nil, fieldErr(fmt.Sprintf("manifest.files[%d].content", i), "%v", errNotBase64)
		}
		mode := fs.FileMode(0o644)
		if f.Mode != "" {
			m, err := strconv.ParseUint(f.Mode, 8, 32)
			if err != nil || !modeRE().MatchString(f.Mode) {
				return nil, fieldErr(fmt.Sprintf("manifest.files[%d].mode", i), "must be octal permissions like 0644 or 0755")
			}
			mode = fs.FileMode(m)
		}
		out = append(out, DecodedFile{Path: p, Data: data, Mode: mode})
	}
	return out, nil
}

// DecodedStdin returns the job's standard input, decoded (nil: none).
// Call it on a validated manifest.
func (m *Manifest) DecodedStdin() ([]byte, error) {
	if m.Stdin == "" {
		return nil, nil
	}
	data, err := base64.StdEncoding.DecodeString(m.Stdin)
	if err != nil {
		return nil, fieldErr("manifest.stdin", "%v", errNotBase64)
	}
	return data, nil
}

// DecodedFile is a manifest file ready to write.
type DecodedFile struct {
	Path string      // absolute, inside /workspace
	Data []byte      // for a symbolic link, its target
	Mode fs.FileMode // fs.ModeSymlink for a link
}

// errNotBase64 is the rule a file's content breaks when it is not base64.
var errNotBase64 = errors.New("not base64 (standard alphabet with = padding, as `base64` prints it)")

// checkBase64 checks s and counts the bytes it decodes to, without keeping
// them: files may total 64 MiB, and validation should not hold a second
// copy of them.
func checkBase64(s string) (int64, error) {
	n, err := io.Copy(io.Discard, base64.NewDecoder(base64.StdEncoding, strings.NewReader(s)))
	if err != nil {
		return 0, errNotBase64
	}
	return n, nil
}

// TextRule is what is wrong with a text value that may hold at most max
// bytes, one rule at a time: a NUL byte in it (and where), else its size;
// "" when nothing is.
func TextRule(v string, max int) string {
	if i := strings.IndexByte(v, 0); i >= 0 {
		return fmt.Sprintf("must not contain a NUL byte (one is at byte %d)", i)
	}
	if len(v) > max {
		return fmt.Sprintf("must be at most %d bytes (got %d)", max, len(v))
	}
	return ""
}
