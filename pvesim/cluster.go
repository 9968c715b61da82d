package pvesim

import (
	"maps"
	"slices"
	"strconv"
	"strings"
)

// hostMemBase is what a node's host uses before any VM runs.
const hostMemBase = 1536 << 20

// GET /version
func hVersion(c *call) (any, error) {
	v := c.s.rel.version
	parts := strings.SplitN(v, ".", 3)
	release := v
	if len(parts) >= 2 {
		release = parts[0] + "." + parts[1]
	}
	return map[string]any{"version": v, "release": release, "repoid": "5bd1b3a6", "console": "xtermjs"}, nil
}

// nodeUsage is what running VMs use of a node: the memory their guests
// touch and their vCPUs. Call with s.mu held.
func (s *Server) nodeUsage(node string) (mem int64, cpus int) {
	for _, v := range s.vms {
		if v.node == node && v.status == "running" {
			mem += guestUse(v.runMem)
			cpus += v.runCPUs
		}
	}
	return mem, cpus
}

// nodeEntry is a node in /nodes and /cluster/resources (pve-manager
// PVE/API2Tools.pm extract_node_stats): without Sys.Audit on
// /nodes/<node> the caller sees its status and level, not uptime, cpu,
// mem, disk, maxcpu, maxmem or maxdisk (PVE/API2/Nodes.pm index,
// PVE/API2/Cluster.pm resources). Call with s.mu held.
func (c *call) nodeEntry(n *simNode, stats *statsSnapshot) map[string]any {
	s := c.s
	e := map[string]any{"id": "node/" + n.name, "type": "node", "node": n.name, "status": "unknown"}
	audit := s.access.check(c.authid, "/nodes/"+n.name, "Sys.Audit") == nil
	if d, ok := stats.nodes[n.name]; ok {
		online := !s.faults.offline(n.name)
		if online {
			e["status"] = "online"
			if audit {
				e["uptime"], e["cpu"], e["mem"], e["disk"] = d.uptime, d.cpu, d.mem, d.disk
			}
		}
		e["level"] = ""
		if audit {
			e["maxcpu"], e["maxmem"], e["maxdisk"] = d.maxcpu, d.maxmem, d.maxdisk
		}
	}
	if s.faults.offline(n.name) {
		e["status"] = "offline"
	}
	return e
}

// GET /nodes
func hNodes(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	stats := s.currentStats()
	out := []map[string]any{}
	for _, n := range s.nodes {
		e := c.nodeEntry(n, stats)
		e["ssl_fingerprint"] = s.fp
		out = append(out, e)
	}
	return out, nil
}

// vmEntry is a VM in /cluster/resources: its figures from the last
// pvestatd cycle (none for a VM made since: status "unknown"), lock and
// tags from its config, its pool. Call with s.mu held.
func (s *Server) vmEntry(v *vm, stats *statsSnapshot) map[string]any {
	e := map[string]any{"id": v.typ() + "/" + strconv.Itoa(v.vmid), "type": v.typ(), "vmid": v.vmid, "node": v.node,
		"status": "unknown"}
	if d, ok := stats.vms[v.vmid]; ok && !s.faults.offline(v.node) {
		e["status"], e["template"], e["maxcpu"], e["maxmem"], e["maxdisk"] = d.status, d.template, d.maxcpu, d.maxmem, d.maxdisk
		e["uptime"], e["mem"], e["cpu"], e["disk"] = d.uptime, d.mem, d.cpu, 0
		e["netin"], e["netout"], e["diskread"], e["diskwrite"] = 0, 0, 0, 0
		if d.name != "" {
			e["name"] = d.name
		}
	}
	if l := v.conf["lock"]; l != "" {
		e["lock"] = l
	}
	if t := v.conf["tags"]; t != "" {
		e["tags"] = t
	}
	for name, p := range s.access.pools {
		if p.vms[v.vmid] {
			e["pool"] = name
		}
	}
	return e
}

// GET /cluster/resources: pools, VMs, nodes, storages and SDN zones, each
// filtered by what the caller may see (pve-manager PVE/API2/Cluster.pm
// resources): Pool.Audit on the pool, VM.Audit on the VM, Sys.Audit for a
// node's figures, Datastore.Audit on the storage, SDN.Audit on the zone.
func hResources(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	typ := c.str("type")
	stats := s.currentStats()
	out := []map[string]any{}
	if typ == "" {
		for _, name := range slices.Sorted(maps.Keys(uc.pools)) {
			if uc.check(c.authid, "/pool/"+name, "Pool.Audit") == nil {
				out = append(out, map[string]any{"id": "/pool/" + name, "pool": name, "type": "pool"})
			}
		}
	}
	if typ == "" || typ == "vm" {
		for _, id := range slices.Sorted(maps.Keys(s.vms)) {
			if uc.check(c.authid, "/vms/"+strconv.Itoa(id), "VM.Audit") != nil {
				continue
			}
			e := s.vmEntry(s.vms[id], stats)
			if p, ok := e["pool"].(string); ok && uc.check(c.authid, "/pool/"+p, "Pool.Audit") != nil {
				delete(e, "pool")
			}
			out = append(out, e)
		}
	}
	if typ == "" || typ == "node" {
		for _, n := range s.nodes {
			out = append(out, c.nodeEntry(n, stats))
		}
	}
	if typ == "" || typ == "storage" {
		for _, st := range s.storages {
			if uc.check(c.authid, "/storage/"+st.id, "Datastore.Audit") != nil {
				continue
			}
			for _, n := range s.nodes {
				out = append(out, s.storageEntry(st, n.name))
			}
		}
	}
	if typ == "" || typ == "sdn" {
		if uc.check(c.authid, "/sdn/zones/localnetwork", "SDN.Audit") == nil {
			for _, n := range s.nodes {
				out = append(out, map[string]any{"id": "sdn/" + n.name + "/localnetwork", "type": "sdn",
					"sdn": "localnetwork", "node": n.name, "status": "ok"})
			}
		}
	}
	return out, nil
}

// GET /cluster/nextid: the lowest id no VM config uses, as a string
// (though the schema says integer). It reserves nothing: the id is taken
// when a clone's task writes the new config (pve-manager
// PVE/API2/Cluster.pm nextid reads the vmlist and returns).
func hNextID(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.has("vmid") {
		id := c.int("vmid")
		if _, taken := s.vms[id]; taken {
			return nil, paramErr("vmid", "VM "+strconv.Itoa(id)+" already exists")
		}
		return c.str("vmid"), nil
	}
	for id := 100; id < 1_000_000; id++ {
		if _, taken := s.vms[id]; !taken {
			return strconv.Itoa(id), nil
		}
	}
	return nil, dieErr("unable to get any free VMID in range [100, 999999]")
}
