package pvetools

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/pve"
	"github.com/google/jsonschema-go/jsonschema"
)

// The guest agent: commands and files in a VM (containers have no exec
// in the API). Every call needs PROXMOX_ALLOW_ELEVATED: the agent runs as
// root in the guest.

// ExecIn runs a command: an argv array (no shell, as Proxmox's agent/exec
// takes it) or a string, which runs with /bin/sh -c.
type ExecIn struct {
	Node    string          `json:"node"`
	VMID    int             `json:"vmid"`
	Type    string          `json:"type,omitempty" jsonschema:"default qemu (lxc: no exec in the API)"`
	Command json.RawMessage `json:"command"`
	Force   bool            `json:"force,omitempty" jsonschema:"even if a running delegate job owns it"`
}

// AgentExecIn is ExecIn without a type: VMs only.
type AgentExecIn struct {
	Node    string          `json:"node"`
	VMID    int             `json:"vmid"`
	Command json.RawMessage `json:"command"`
	Force   bool            `json:"force,omitempty" jsonschema:"even if a running delegate job owns it"`
}

// ExecOut is how a command ended, or that it still runs.
type ExecOut struct {
	PID      int    `json:"pid"`
	Exited   bool   `json:"exited"`
	ExitCode *int   `json:"exitcode,omitempty"`
	Signal   *int   `json:"signal,omitempty"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// Truncated: the agent kept only the first 16 MiB of a stream.
	StdoutTruncated bool `json:"stdout_truncated,omitempty"`
	StderrTruncated bool `json:"stderr_truncated,omitempty"`
	// Note says what became of a command that outlived the wait.
	Note string `json:"note,omitempty"`
}

// commandSchema is what command takes: argv or a shell line.
func commandSchema() *jsonschema.Schema {
	return &jsonschema.Schema{Types: []string{"array", "string"}, Items: &jsonschema.Schema{Type: "string"},
		Description: "argv array (no shell), or a string run by /bin/sh -c"}
}

// argv reads a command argument.
func argv(raw json.RawMessage) ([]string, error) {
	var line string
	if err := json.Unmarshal(raw, &line); err == nil {
		if strings.TrimSpace(line) == "" {
			return nil, argErr("command", "must not be empty")
		}
		return []string{"/bin/sh", "-c", line}, nil
	}
	var args []string
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, argErr("command", "must be an array of strings (argv) or a string (run by /bin/sh -c)")
	}
	if len(args) == 0 || args[0] == "" {
		return nil, argErr("command", "must name a program first, e.g. [\"uname\", \"-a\"]")
	}
	for i, a := range args {
		if strings.ContainsRune(a, 0) {
			return nil, argErr(fmt.Sprintf("command[%d]", i), "must not contain a NUL character")
		}
	}
	return args, nil
}

func (t *tools) executeCommand(ctx context.Context, in *ExecIn) (ExecOut, error) {
	deadline := t.deadline()
	if err := t.elevated(); err != nil {
		return ExecOut{}, err
	}
	typ, err := (&Guest{Node: in.Node, VMID: in.VMID, Type: in.Type}).check()
	if err != nil {
		return ExecOut{}, err
	}
	if typ == pve.LXC {
		return ExecOut{}, argErr("type", "lxc: the Proxmox API has no exec for containers (pct exec runs on the node, "+
			"outside the API); commands run in VMs through the QEMU guest agent")
	}
	if _, err := t.prepare(ctx, &Guest{Node: in.Node, VMID: in.VMID}, in.Force, "running a command in it"); err != nil {
		return ExecOut{}, err
	}
	return t.exec(ctx, in.Node, in.VMID, in.Command, deadline)
}

func (t *tools) agentExec(ctx context.Context, in *AgentExecIn) (ExecOut, error) {
	deadline := t.deadline()
	if _, err := t.prepare(ctx, &Guest{Node: in.Node, VMID: in.VMID}, in.Force, "running a command in it"); err != nil {
		return ExecOut{}, err
	}
	return t.exec(ctx, in.Node, in.VMID, in.Command, deadline)
}

// exec starts a command and polls its status until it ends or the
// deadline passes.
func (t *tools) exec(ctx context.Context, node string, vmid int, command json.RawMessage, deadline time.Time) (ExecOut, error) {
	args, err := argv(command)
	if err != nil {
		return ExecOut{}, err
	}
	pid, err := t.c.AgentExec(ctx, node, vmid, args, nil)
	if err != nil {
		return ExecOut{}, proxmoxError(err)
	}
	wait := t.cfg.PollInterval
	for {
		st, err := t.c.AgentExecStatus(ctx, node, vmid, pid)
		if err != nil {
			return ExecOut{}, proxmoxError(err)
		}
		if st.Exited {
			return ExecOut{PID: pid, Exited: true, ExitCode: st.ExitCode, Signal: st.Signal,
				Stdout: text(st.Stdout), Stderr: text(st.Stderr),
				StdoutTruncated: st.StdoutTruncated, StderrTruncated: st.StderrTruncated}, nil
		}
		if time.Now().Add(wait).After(deadline) {
			return ExecOut{PID: pid, Note: fmt.Sprintf("still running in the guest after %s (pid %d); "+
				"its output is not kept for later: run long work as a delegate job (submit_job), or in the background "+
				"with its output in a file and read it with proxmox_agent_file", t.cfg.Wait.Round(time.Second), pid)}, nil
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ExecOut{}, ctx.Err()
		case <-timer.C:
		}
		wait = min(wait*3/2, time.Second)
	}
}

// text renders output as JSON text: bytes that are not UTF-8 become U+FFFD.
func text(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }

// FileIn reads or writes a file in a VM.
type FileIn struct {
	Node     string `json:"node"`
	VMID     int    `json:"vmid"`
	Action   string `json:"action" jsonschema:"read or write"`
	File     string `json:"file" jsonschema:"absolute path in the guest"`
	Content  string `json:"content,omitempty" jsonschema:"write: the new content (the file is replaced)"`
	Encoding string `json:"encoding,omitempty" jsonschema:"content is text (default) or base64"`
	Force    bool   `json:"force,omitempty" jsonschema:"write even if a running delegate job owns it"`
}

// FileOut is a file read, or how a write went.
type FileOut struct {
	File     string `json:"file"`
	Bytes    int    `json:"bytes"`
	Content  string `json:"content,omitempty"`
	Encoding string `json:"encoding,omitempty"`
	// Truncated: the file is longer than the 16 MiB Proxmox reads.
	Truncated bool `json:"truncated,omitempty"`
	// Parts is how many agent writes a write took (each carries at most
	// pve.MaxFileWrite bytes).
	Parts int `json:"parts,omitempty"`
}

// MaxFileBytes is the most a read returns (Proxmox's limit) and a write
// takes.
const MaxFileBytes = 16 << 20

// joinScript assembles a file from parts the agent wrote beside it: the
// target and the parts arrive as arguments, never inside the script.
const joinScript = `out=$1; shift
cat -- "$@" > "$out"; rc=$?
rm -f -- "$@"; exit $rc`

func (t *tools) agentFile(ctx context.Context, in *FileIn) (FileOut, error) {
	deadline := t.deadline()
	if err := t.elevated(); err != nil {
		return FileOut{}, err
	}
	if _, err := (&Guest{Node: in.Node, VMID: in.VMID}).check(); err != nil {
		return FileOut{}, err
	}
	if !strings.HasPrefix(in.File, "/") || strings.ContainsRune(in.File, 0) {
		return FileOut{}, argErr("file", "must be an absolute path in the guest (got %q)", in.File)
	}
	switch in.Encoding {
	case "":
		in.Encoding = "text"
	case "text", "base64":
	default:
		return FileOut{}, argErr("encoding", "must be text or base64 (got %q)", in.Encoding)
	}
	switch in.Action {
	case "read":
		if in.Content != "" {
			return FileOut{}, argErr("content", "is for action write only")
		}
		if in.Force {
			return FileOut{}, argErr("force", "is for action write only (reading a job's VM changes nothing)")
		}
		fc, err := t.c.AgentFileRead(ctx, in.Node, in.VMID, in.File)
		if err != nil {
			return FileOut{}, proxmoxError(err)
		}
		out := FileOut{File: in.File, Bytes: len(fc.Data), Encoding: in.Encoding, Truncated: fc.Truncated}
		if in.Encoding == "base64" {
			out.Content = base64.StdEncoding.EncodeToString(fc.Data)
		} else if !utf8.Valid(fc.Data) {
			return FileOut{}, argErr("encoding", "text: %s is not UTF-8 text (%d bytes): read it with encoding base64", in.File, len(fc.Data))
		} else {
			out.Content = string(fc.Data)
		}
		return out, nil
	case "write":
		if !in.Force {
			if err := t.refuseJobVM(ctx, in.Node, pve.QEMU, in.VMID, "writing a file in it"); err != nil {
				return FileOut{}, err
			}
		}
		data := []byte(in.Content)
		if in.Encoding == "base64" {
			var err error
			if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
				return FileOut{}, argErr("content", "is not valid base64: %v", err)
			}
		}
		if len(data) > MaxFileBytes {
			return FileOut{}, argErr("content", "is %d bytes; at most %d (16 MiB) are written", len(data), MaxFileBytes)
		}
		parts, err := t.writeFile(ctx, in.Node, in.VMID, in.File, data, deadline)
		if err != nil {
			return FileOut{}, err
		}
		return FileOut{File: in.File, Bytes: len(data), Parts: parts}, nil
	}
	return FileOut{}, argErr("action", "must be read or write (got %q)", in.Action)
}

// writeFile replaces a file in the guest. file-write carries at most
// pve.MaxFileWrite bytes and only overwrites, so a larger file is written
// in parts beside it and joined in the guest (as the Proxmox backend
// writes a job's files).
func (t *tools) writeFile(ctx context.Context, node string, vmid int, file string, data []byte, deadline time.Time) (int, error) {
	if len(data) <= pve.MaxFileWrite {
		if err := t.c.AgentFileWrite(ctx, node, vmid, file, data); err != nil {
			return 0, proxmoxError(err)
		}
		return 1, nil
	}
	var nonce [6]byte
	rand.Read(nonce[:])
	prefix := file + ".part-" + hex.EncodeToString(nonce[:]) + "-"
	args := []string{"/bin/sh", "-c", joinScript, "delegate-join", file}
	for i := 0; i*pve.MaxFileWrite < len(data); i++ {
		part := fmt.Sprintf("%s%d", prefix, i)
		chunk := data[i*pve.MaxFileWrite : min(len(data), (i+1)*pve.MaxFileWrite)]
		if err := t.c.AgentFileWrite(ctx, node, vmid, part, chunk); err != nil {
			return 0, fmt.Errorf("writing part %d of %s: %w", i, file, proxmoxError(err))
		}
		args = append(args, part)
	}
	raw, _ := json.Marshal(args)
	out, err := t.exec(ctx, node, vmid, raw, deadline)
	if err != nil {
		return 0, fmt.Errorf("joining the parts of %s: %w", file, err)
	}
	if !out.Exited || out.ExitCode == nil || *out.ExitCode != 0 {
		return 0, answer(delegate.ErrConflict, "joining the %d parts of %s failed in the guest: %s", len(args)-5, file, strings.TrimSpace(out.Stderr+" "+out.Note))
	}
	return len(args) - 5, nil
}
