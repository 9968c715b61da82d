package pvesim

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// agentFor is PVE's assert_agent_available (src/PVE/QemuServer/Agent.pm):
// the VM has an agent option (one that is absent fails at once; with
// agent: 0, QEMU has no agent socket and the ping fails) and runs, and its
// agent answers a guest-ping within 3 s (Options.AgentPingTimeout; a booting guest makes
// the ping wait that long). Each agent_cmd does it again before its
// command, so a call costs a ping and the command. A call takes at least
// Options.AgentLatency. The agent itself refuses what it blocks (qemu-ga
// -b, RHEL's --allow-rpcs list): qemu's "Command guest-exec has been
// disabled", which PVE reports as "Agent error: ..." (check_agent_error).
// Call without s.mu held.
func (c *call) agentFor() (guestAgent, int, error) {
	s := c.s
	s.mu.Lock()
	v, err := c.loadVM()
	if err == nil && v.conf["agent"] == "" {
		// Only an agent option that is absent is refused at once: with
		// agent: 0 the VM runs without the agent's socket, and the ping
		// below fails.
		err = dieErr("No QEMU guest agent configured")
	}
	if err == nil && v.status != "running" {
		err = dieErr("VM %d is not running", v.vmid)
	}
	var vmid int
	noSocket := false
	if err == nil {
		vmid, noSocket = v.vmid, !v.agentEnabled()
	}
	s.mu.Unlock()
	if err != nil {
		return nil, 0, err
	}
	if noSocket {
		return nil, 0, dieErr("QEMU guest agent is not running")
	}
	if d := s.opts.AgentLatency; d > 0 {
		select {
		case <-time.After(d):
		case <-c.ctx.Done():
		}
	}
	if err := s.pingAgent(c.ctx, vmid); err != nil {
		return nil, 0, dieErr("QEMU guest agent is not running")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vms[vmid]
	if !ok || v.guest == nil {
		return nil, 0, dieErr("VM %d is not running", vmid)
	}
	return v.guest.agent, vmid, nil
}

// agentErr reports a failed agent command like PVE: the agent's own
// errors as "Agent error: ...", a silent agent as a QMP timeout, and a
// guest that went away meanwhile as not running.
func (c *call) agentErr(err error, vmid int, cmd string) error {
	var ae *agentError
	if errors.As(err, &ae) {
		return dieErr("%s", ae.Error())
	}
	var api *apiError
	if errors.As(err, &api) {
		return api
	}
	c.s.mu.Lock()
	v, ok := c.s.vms[vmid]
	running := ok && v.status == "running" && v.guest != nil
	c.s.mu.Unlock()
	if !running {
		return dieErr("VM %d is not running", vmid)
	}
	if errors.Is(err, errAgentTimeout) {
		return dieErr("VM %d qmp command 'guest-%s' failed - got timeout", vmid, cmd)
	}
	return dieErr("VM %d qmp command 'guest-%s' failed - %v", vmid, cmd, err)
}

// POST .../agent/ping
func hAgentPing(c *call) (any, error) {
	a, vmid, err := c.agentFor()
	if err != nil {
		return nil, err
	}
	if err := a.ping(c.ctx, qgaCmdTimeout); err != nil {
		return nil, c.agentErr(err, vmid, "ping")
	}
	return map[string]any{"result": map[string]any{}}, nil
}

// GET .../agent/info: guest-info, the agent's version and its commands,
// each enabled or not.
func hAgentInfo(c *call) (any, error) {
	a, vmid, err := c.agentFor()
	if err != nil {
		return nil, err
	}
	info, err := a.info(c.ctx)
	if err != nil {
		return nil, c.agentErr(err, vmid, "info")
	}
	return map[string]any{"result": info}, nil
}

// POST .../agent/exec: the command runs in the guest, in the background;
// the answer is its pid.
func hAgentExec(c *call) (any, error) {
	var argv []string
	if cmd, ok := c.params["command"].([]any); ok {
		for _, a := range cmd {
			argv = append(argv, fmt.Sprint(a))
		}
	}
	var input []byte
	if c.has("input-data") {
		var err error
		if input, err = fromLatin1(c.str("input-data")); err != nil {
			return nil, err
		}
	}
	if len(argv) == 0 && input == nil {
		return nil, dieErr("command or input-data (or both) required")
	}
	a, vmid, err := c.agentFor()
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, dieErr("Agent error: Invalid parameter type for 'path', expected: string")
	}
	for _, arg := range argv {
		for i := 0; i < len(arg); i++ {
			if arg[i] == 0 {
				return nil, dieErr("Agent error: Invalid JSON syntax")
			}
		}
	}
	c.s.mu.Lock()
	selinux := c.s.vms[vmid] != nil && c.s.vms[vmid].selinux
	c.s.mu.Unlock()
	if selinux {
		// SELinux confines qemu-ga (virt_qemu_ga_t): it may run no
		// program of the guest's (the exec call's fork succeeds, the
		// execve is denied) unless virt_qemu_ga_run_unconfined is on.
		return nil, c.agentErr(&agentError{desc: fmt.Sprintf("Guest agent command failed, error was 'Failed to execute child process “%s” (Permission denied)'", argv[0])}, vmid, "exec")
	}
	pid, err := a.exec(c.ctx, argv, input)
	if err != nil {
		return nil, c.agentErr(err, vmid, "exec")
	}
	return map[string]any{"pid": pid}, nil
}

// GET .../agent/exec-status: exited 0 until the process ended; then its
// exit code (or signal) and its output, decoded, booleans as 0/1.
func hAgentExecStatus(c *call) (any, error) {
	a, vmid, err := c.agentFor()
	if err != nil {
		return nil, err
	}
	st, err := a.execStatus(c.ctx, c.int("pid"))
	if err != nil {
		return nil, c.agentErr(err, vmid, "exec-status")
	}
	res := map[string]any{"exited": 0}
	if !st.Exited {
		return res, nil
	}
	res["exited"] = 1
	if st.ExitCode != nil {
		res["exitcode"] = *st.ExitCode
	}
	if st.Signal != nil {
		res["signal"] = *st.Signal
	}
	if len(st.Out) > 0 {
		res["out-data"] = latin1(st.Out)
		res["out-truncated"] = b2i(st.OutTruncated)
	}
	if len(st.Err) > 0 {
		res["err-data"] = latin1(st.Err)
		res["err-truncated"] = b2i(st.ErrTruncated)
	}
	return res, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// POST .../agent/file-write: the file is replaced. With encode=1 (the
// default) PVE base64-encodes content itself, so it must be text whose
// characters are bytes; with encode=0 content is already base64.
func hAgentFileWrite(c *call) (any, error) {
	content := c.str("content")
	var data []byte
	if c.boolOr("encode", true) {
		var err error
		if data, err = fromLatin1(content); err != nil {
			return nil, err
		}
	}
	a, vmid, err := c.agentFor()
	if err != nil {
		return nil, err
	}
	// file-write is three agent_cmd calls (open, write, close), each
	// after its own ping.
	for range 2 {
		if err := c.s.pingAgent(c.ctx, vmid); err != nil {
			return nil, dieErr("QEMU guest agent is not running")
		}
	}
	if !c.boolOr("encode", true) {
		if data, err = base64.StdEncoding.DecodeString(content); err != nil {
			return nil, dieErr("Agent error: Base64 data is not valid")
		}
	}
	if err := a.fileWrite(c.ctx, c.str("file"), data); err != nil {
		return nil, c.agentErr(err, vmid, "file-write")
	}
	return nil, nil
}

// maxFileRead is PVE's limit on agent/file-read.
const maxFileRead = 16 << 20

// GET .../agent/file-read: at most count bytes (16 MiB) read in 1 MiB
// chunks; truncated is 1 when the read did not reach the end of the file.
func hAgentFileRead(c *call) (any, error) {
	a, vmid, err := c.agentFor()
	if err != nil {
		return nil, err
	}
	count := int64(c.intOr("count", maxFileRead))
	data, eof, err := a.fileRead(c.ctx, c.str("file"), int64(c.intOr("offset", 0)), count)
	if err != nil {
		return nil, c.agentErr(err, vmid, "file-read")
	}
	res := map[string]any{"bytes-read": len(data)}
	if c.boolOr("decode", true) {
		res["content"] = latin1(data)
	} else {
		res["content"] = base64.StdEncoding.EncodeToString(data)
	}
	if !eof {
		res["truncated"] = 1
	}
	return res, nil
}

// GET .../agent/network-get-interfaces: loopback and one NIC with the
// VM's net0 MAC and an address derived from its vmid. (The sandbox has
// no network: the address is plausible, not reachable.)
func hAgentNetwork(c *call) (any, error) {
	_, vmid, err := c.agentFor()
	if err != nil {
		return nil, err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	stats := map[string]any{"rx-bytes": 0, "rx-packets": 0, "rx-errs": 0, "rx-dropped": 0,
		"tx-bytes": 0, "tx-packets": 0, "tx-errs": 0, "tx-dropped": 0}
	addr := func(ip, typ string, prefix int) map[string]any {
		return map[string]any{"ip-address": ip, "ip-address-type": typ, "prefix": prefix}
	}
	out := []any{map[string]any{"name": "lo", "hardware-address": "00:00:00:00:00:00", "statistics": stats,
		"ip-addresses": []any{addr("127.0.0.1", "ipv4", 8), addr("::1", "ipv6", 128)}}}
	v := s.vms[vmid]
	if v == nil {
		return map[string]any{"result": out}, nil
	}
	if v.docker {
		// Docker's bridge comes up with the guest, before DHCP is done.
		out = append(out, map[string]any{"name": "docker0", "hardware-address": "02:42:8e:5c:11:07", "statistics": stats,
			"ip-addresses": []any{addr("172.17.0.1", "ipv4", 16)}})
	}
	// netN is ethN; each has its link-local address at once, and net0 its
	// lease once DHCP answered (network.go).
	keys := slices.SortedFunc(func(yield func(string) bool) {
		for k := range v.conf {
			if netKeyRe().MatchString(k) && !yield(k) {
				return
			}
		}
	}, func(a, b string) int { return atoiOr(a[3:]) - atoiOr(b[3:]) })
	for _, k := range keys {
		mac := strings.ToLower(netMAC(v.conf[k]))
		b, _ := hex.DecodeString(strings.ReplaceAll(mac, ":", ""))
		ips := []any{}
		if k == "net0" {
			if ip, ok := s.lease(vmid); ok {
				ips = append(ips, addr(ip.String(), "ipv4", 24))
			}
		}
		if len(b) == 6 {
			ll := fmt.Sprintf("fe80::%02x%02x:%02xff:fe%02x:%02x%02x", b[0]^2, b[1], b[2], b[3], b[4], b[5])
			ips = append(ips, addr(ll, "ipv6", 64))
		}
		out = append(out, map[string]any{"name": "eth" + k[3:], "hardware-address": mac, "statistics": stats, "ip-addresses": ips})
	}
	return map[string]any{"result": out}, nil
}

func atoiOr(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
