package pve

import (
	"context"
	"encoding/base64"
	"fmt"
)

// Limits of the guest-agent calls.
const (
	// MaxFileWrite is the most data one AgentFileWrite carries: Proxmox
	// takes at most 61440 characters of content, and the data travels
	// base64-encoded (so any bytes arrive intact, on every PVE version).
	MaxFileWrite = 61440 / 4 * 3
	// MaxFileRead is the most AgentFileRead returns: Proxmox's agent
	// file-read gives "the content of the file, maximum 16777216" bytes
	// and says "truncated" past it (the API schema).
	MaxFileRead = 16 << 20
	// MaxExecInput is the most stdin AgentExec passes (input-data).
	MaxExecInput = 64 << 10
)

// AgentPing checks that the VM's guest agent answers. While it does not
// (the VM still boots), the error satisfies IsAgentNotRunning.
func (c *Client) AgentPing(ctx context.Context, node string, vmid int) error {
	return c.post(ctx, vmPath(node, vmid)+"/agent/ping", nil, nil)
}

// AgentExec starts command (argv, no shell) in the guest and returns its
// pid. stdin, if not nil, is written to its standard input.
func (c *Client) AgentExec(ctx context.Context, node string, vmid int, command []string, stdin []byte) (int, error) {
	if len(command) == 0 {
		return 0, fmt.Errorf("pve: agent exec in %d: empty command", vmid)
	}
	if len(stdin) > MaxExecInput {
		return 0, fmt.Errorf("pve: agent exec in %d: %d bytes of input, at most %d per call", vmid, len(stdin), MaxExecInput)
	}
	p := params{"command": command}
	if stdin != nil {
		// Proxmox base64-encodes input-data for the agent, reading each
		// character as a byte: one character per byte arrives exactly.
		p["input-data"] = bytesToJSON(stdin)
	}
	var res struct {
		PID Int `json:"pid"`
	}
	if err := c.post(ctx, vmPath(node, vmid)+"/agent/exec", p, &res); err != nil {
		return 0, err
	}
	return int(res.PID), nil
}

// ExecStatus is a command's state from AgentExecStatus. Once it reports
// Exited, the agent forgets the pid.
type ExecStatus struct {
	Exited   bool
	ExitCode *int // set when it exited normally
	Signal   *int // set when a signal killed it
	Stdout   []byte
	Stderr   []byte
	// The agent keeps at most 16 MiB of each stream.
	StdoutTruncated bool
	StderrTruncated bool
}

// AgentExecStatus reads the state of a command started by AgentExec.
func (c *Client) AgentExecStatus(ctx context.Context, node string, vmid, pid int) (ExecStatus, error) {
	var res struct {
		Exited       Bool   `json:"exited"`
		ExitCode     *Int   `json:"exitcode"`
		Signal       *Int   `json:"signal"`
		OutData      string `json:"out-data"`
		ErrData      string `json:"err-data"`
		OutTruncated Bool   `json:"out-truncated"`
		ErrTruncated Bool   `json:"err-truncated"`
	}
	if _, err := c.getConsuming(ctx, vmPath(node, vmid)+"/agent/exec-status", params{"pid": pid}, &res); err != nil {
		return ExecStatus{}, err
	}
	st := ExecStatus{Exited: bool(res.Exited), StdoutTruncated: bool(res.OutTruncated), StderrTruncated: bool(res.ErrTruncated)}
	if res.ExitCode != nil {
		n := int(*res.ExitCode)
		st.ExitCode = &n
	}
	if res.Signal != nil {
		n := int(*res.Signal)
		st.Signal = &n
	}
	var err error
	if st.Stdout, err = bytesFromJSON(res.OutData); err != nil {
		return st, err
	}
	if st.Stderr, err = bytesFromJSON(res.ErrData); err != nil {
		return st, err
	}
	return st, nil
}

// AgentFileWrite replaces file in the guest with data (at most
// MaxFileWrite bytes: write bigger files in parts and join them in the
// guest). The agent writes it as itself (root in a real guest).
func (c *Client) AgentFileWrite(ctx context.Context, node string, vmid int, file string, data []byte) error {
	if len(data) > MaxFileWrite {
		return fmt.Errorf("pve: agent file-write %s in %d: %d bytes, at most %d per call", file, vmid, len(data), MaxFileWrite)
	}
	p := params{"file": file, "content": base64.StdEncoding.EncodeToString(data), "encode": false}
	return c.post(ctx, vmPath(node, vmid)+"/agent/file-write", p, nil)
}

// FileContent is what AgentFileRead got.
type FileContent struct {
	Data []byte
	// Truncated: the read stopped at Proxmox's 16 MiB limit (it is also
	// set when the file is exactly that long).
	Truncated bool
}

// AgentFileRead reads a file of the guest (at most 16 MiB).
func (c *Client) AgentFileRead(ctx context.Context, node string, vmid int, file string) (FileContent, error) {
	var res struct {
		Content   string `json:"content"`
		Truncated Bool   `json:"truncated"`
	}
	if _, err := c.get(ctx, vmPath(node, vmid)+"/agent/file-read", params{"file": file}, &res); err != nil {
		return FileContent{}, err
	}
	data, err := bytesFromJSON(res.Content)
	if err != nil {
		return FileContent{}, err
	}
	return FileContent{Data: data, Truncated: bool(res.Truncated)}, nil
}

// NetworkInterface is one entry of the guest's network-get-interfaces.
type NetworkInterface struct {
	Name            string      `json:"name"`
	HardwareAddress string      `json:"hardware-address"`
	IPAddresses     []IPAddress `json:"ip-addresses"`
}

// IPAddress is an address of a NetworkInterface.
type IPAddress struct {
	Address string `json:"ip-address"`
	Type    string `json:"ip-address-type"` // ipv4, ipv6
	Prefix  Int    `json:"prefix"`
}

// AgentNetworkInterfaces lists the guest's network interfaces.
func (c *Client) AgentNetworkInterfaces(ctx context.Context, node string, vmid int) ([]NetworkInterface, error) {
	var res struct {
		Result []NetworkInterface `json:"result"`
	}
	if _, err := c.get(ctx, vmPath(node, vmid)+"/agent/network-get-interfaces", nil, &res); err != nil {
		return nil, err
	}
	return res.Result, nil
}

// AgentCommand is one command of the guest agent (agent/info).
type AgentCommand struct {
	Name    string `json:"name"`
	Enabled Bool   `json:"enabled"`
}

// AgentInfo is what the guest agent says of itself: its version and its
// commands, each enabled or not (qemu-ga --block-rpcs, --allow-rpcs).
type AgentInfo struct {
	Version  string         `json:"version"`
	Commands []AgentCommand `json:"supported_commands"`
}

// AgentInfo reads the guest agent's guest-info.
func (c *Client) AgentInfo(ctx context.Context, node string, vmid int) (AgentInfo, error) {
	var res struct {
		Result AgentInfo `json:"result"`
	}
	if _, err := c.get(ctx, vmPath(node, vmid)+"/agent/info", nil, &res); err != nil {
		return AgentInfo{}, err
	}
	return res.Result, nil
}

// Disabled lists the commands of names the agent does not allow (or does
// not have).
func (i AgentInfo) Disabled(names ...string) []string {
	var out []string
	for _, n := range names {
		ok := false
		for _, c := range i.Commands {
			if c.Name == n {
				ok = bool(c.Enabled)
				break
			}
		}
		if !ok {
			out = append(out, n)
		}
	}
	return out
}
