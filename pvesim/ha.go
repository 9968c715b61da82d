package pvesim

import (
	"fmt"
	"time"
)

// The HA manager's status (pve-ha-manager src/PVE/API2/HA/Status.pm
// manager_status, the CRM's manager_status file): each node's state as
// the HA manager sees it, "maintenance" for a node put in maintenance
// mode (ha-manager crm-command node-maintenance enable NODE, or a reboot
// under the "migrate" shutdown policy), "unknown" for one that is down.
// Needs Sys.Audit on /.

// SetNodeMaintenance puts a node in HA maintenance mode, or takes it out.
func (s *Server) SetNodeMaintenance(node string, on bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node(node) == nil {
		return fmt.Errorf("pvesim: no node %q", node)
	}
	if s.haMaintenance == nil {
		s.haMaintenance = map[string]bool{}
	}
	s.haMaintenance[node] = on
	return nil
}

// GET /cluster/ha/status/manager_status
func hHAManagerStatus(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	nodes := map[string]any{}
	for _, n := range s.nodes {
		switch {
		case s.faults.offline(n.name):
			nodes[n.name] = "unknown"
		case s.haMaintenance[n.name]:
			nodes[n.name] = "maintenance"
		default:
			nodes[n.name] = "online"
		}
	}
	return map[string]any{
		"manager_status": map[string]any{"master_node": s.nodes[0].name, "node_status": nodes, "service_status": map[string]any{},
			"timestamp": time.Now().Unix()},
		"quorum": map[string]any{"node": s.nodes[0].name, "quorate": "1"},
	}, nil
}

// A node's config (pve-manager PVE/API2/NodeConfig.pm, the node's
// config file in /etc/pve/nodes/<node>/config): its notes (description)
// and a digest; reading needs Sys.Audit on /, writing Sys.Modify on /
// (the schema), a stale digest is refused.

// GET /nodes/{node}/config
func hNodeConfig(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	desc := s.nodeNotes[c.str("node")]
	out := map[string]any{"digest": fwDigest(desc)}
	if desc != "" {
		out["description"] = desc
	}
	return out, nil
}

// PUT /nodes/{node}/config: description, or delete=description.
func hSetNodeConfig(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	node := c.str("node")
	if d := c.str("digest"); d != "" && d != fwDigest(s.nodeNotes[node]) {
		return nil, dieErr("detected modified configuration - file changed by other user? Try again.")
	}
	if s.nodeNotes == nil {
		s.nodeNotes = map[string]string{}
	}
	if c.has("description") {
		s.nodeNotes[node] = c.str("description")
	}
	for _, k := range splitList(c.str("delete")) {
		if k == "description" {
			delete(s.nodeNotes, node)
		}
	}
	return nil, nil
}
