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
