package proxmox

import (
	"context"
	"fmt"
	"strings"

	"github.com/delegate-dev/delegate/pve"
)

// What the guest agent must allow. RHEL, Rocky and Alma ship qemu-ga with
// guest-exec and the file calls blocked (their /etc/sysconfig/qemu-ga:
// BLOCK_RPCS, or an --allow-rpcs list from QEMU 8.1 on), while guest-ping
// answers: their VMs look ready and every job would fail at its first
// file write. So the first VM of each template has its agent's commands
// read (agent/info) once it answers, before a job or the pool uses it; a
// template whose agent refuses them is refused from then on, at once, at
// submission and placement, until its config changes.

// neededRPCs are the agent commands delegate uses.
var neededRPCs = []string{"guest-exec", "guest-exec-status", "guest-file-open", "guest-file-write", "guest-file-read", "guest-file-close"}

// agentAllowFix is how to let the agent run what delegate needs.
const agentAllowFix = "allow it in the template's qemu-ga: on RHEL, Rocky and Alma take it out of BLOCK_RPCS " +
	"(and FILTER_RPC_ARGS) in /etc/sysconfig/qemu-ga; elsewhere out of qemu-ga's --block-rpcs, or add it to --allow-rpcs (QEMU 8.1 and later)"

// checkAgent makes sure the guest agent of a new VM of the hold's
// template allows what delegate needs, asking once per template.
func (ts *templates) checkAgent(ctx context.Context, s *vmSandbox, info *templateInfo) error {
	if info == nil {
		return nil
	}
	ts.mu.Lock()
	ok, refused := info.agentOK, info.agentRefused
	ts.mu.Unlock()
	switch {
	case refused != "":
		return fmt.Errorf("vmTemplate: %s", refused)
	case ok:
		return nil
	}
	ai, err := ts.c.AgentInfo(ctx, s.node, s.vmid)
	if err != nil {
		if cmd := pve.AgentDisabled(err); cmd == "" {
			// An old agent without guest-info, or a passing failure: the
			// commands themselves will tell.
			ts.log.Info("could not read the guest agent's commands", "vmid", s.vmid, "template", info.label, "err", err)
			return nil
		}
	}
	disabled := ai.Disabled(neededRPCs...)
	if err != nil {
		disabled = []string{pve.AgentDisabled(err)}
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if len(disabled) == 0 {
		info.agentOK = true
		return nil
	}
	info.agentRefused = fmt.Sprintf("the guest agent (qemu-ga %s) of template %s does not allow %s, which delegate needs to run jobs: %s",
		ai.Version, info.label, strings.Join(disabled, ", "), agentAllowFix)
	ts.log.Error("template refused: its guest agent blocks commands delegate needs", "template", info.label, "blocked", disabled)
	return fmt.Errorf("vmTemplate: %s", info.agentRefused)
}
