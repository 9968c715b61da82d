package pvesim

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// hostMemBase is what a node's host uses before any VM runs.
const hostMemBase = 1536 << 20

// GET /version
func hVersion(c *call) (any, error) {
	v := c.s.opts.Version
	parts := strings.SplitN(v, ".", 3)
	release := v
	if len(parts) >= 2 {
		release = parts[0] + "." + parts[1]
	}
	return map[string]any{"version": v, "release": release, "repoid": "5bd1b3a6", "console": "xtermjs"}, nil
}

// nodeUsage is what running VMs take from a node. Call with s.mu held.
func (s *Server) nodeUsage(node string) (mem int64, cpus int) {
	for _, v := range s.vms {
		if v.node == node && v.status == "running" {
			mem += v.runMem
			cpus += v.runCPUs
		}
	}
	return mem, cpus
}

func (s *Server) nodeEntry(n *simNode) map[string]any {
	e := map[string]any{"id": "node/" + n.name, "type": "node", "node": n.name, "ssl_fingerprint": s.fp}
	if s.faults.offline(n.name) {
		e["status"] = "offline"
		return e
	}
	mem, cpus := s.nodeUsage(n.name)
	e["status"] = "online"
	e["cpu"] = min(1.0, 0.01+0.1*float64(cpus)/float64(n.cpus))
	e["maxcpu"] = n.cpus
	e["mem"] = hostMemBase + mem
	e["maxmem"] = n.mem
	e["disk"] = int64(4) << 30
	e["maxdisk"] = int64(100) << 30
	e["uptime"] = int64(time.Since(n.started).Seconds()) + 86400
	e["level"] = ""
	return e
}

// GET /nodes
func hNodes(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, n := range s.nodes {
		out = append(out, s.nodeEntry(n))
	}
	return out, nil
}

// vmEntry is a VM in /cluster/resources. Call with s.mu held.
func (s *Server) vmEntry(v *vm) map[string]any {
	tpl := 0
	if v.isTemplate() {
		tpl = 1
	}
	e := map[string]any{
		"id": "qemu/" + strconv.Itoa(v.vmid), "type": "qemu", "vmid": v.vmid, "node": v.node,
		"status": v.status, "template": tpl, "maxcpu": v.vcpus(), "maxmem": v.memoryMiB() << 20,
		"maxdisk": v.maxDisk(), "disk": 0, "mem": 0, "cpu": 0, "uptime": 0,
		"netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
	}
	if name := v.conf["name"]; name != "" {
		e["name"] = name
	}
	if l := v.conf["lock"]; l != "" {
		e["lock"] = l
	}
	if t := v.conf["tags"]; t != "" {
		e["tags"] = t
	}
	if v.status == "running" {
		e["uptime"] = int64(time.Since(v.started).Seconds())
		e["mem"] = v.runMem * 2 / 5
		e["cpu"] = 0.02
	}
	if s.faults.offline(v.node) {
		// The cluster has not heard from the node: it knows the config,
		// not the state.
		e["status"] = "unknown"
		for _, k := range []string{"uptime", "mem", "cpu", "netin", "netout", "diskread", "diskwrite"} {
			delete(e, k)
		}
	}
	return e
}

// GET /cluster/resources: nodes, VMs, storage and SDN zones, filtered by
// type and by what the token may see.
func hResources(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := c.str("type")
	out := []map[string]any{}
	if typ == "" || typ == "vm" {
		if c.token.has("VM.Audit") {
			for _, id := range slices.Sorted(maps.Keys(s.vms)) {
				out = append(out, s.vmEntry(s.vms[id]))
			}
		}
	}
	if typ == "" || typ == "node" {
		for _, n := range s.nodes {
			out = append(out, s.nodeEntry(n))
		}
	}
	if typ == "" || typ == "storage" {
		if c.token.has("Datastore.Audit") {
			for _, n := range s.nodes {
				status := "available"
				if s.faults.offline(n.name) {
					status = "unknown"
				}
				out = append(out,
					map[string]any{"id": "storage/" + n.name + "/local", "type": "storage", "storage": "local",
						"node": n.name, "status": status, "plugintype": "dir", "content": "iso,vztmpl,backup",
						"shared": 0, "disk": int64(4) << 30, "maxdisk": int64(100) << 30},
					map[string]any{"id": "storage/" + n.name + "/local-lvm", "type": "storage", "storage": "local-lvm",
						"node": n.name, "status": status, "plugintype": "lvmthin", "content": "images,rootdir",
						"shared": 0, "disk": int64(10) << 30, "maxdisk": int64(800) << 30})
			}
		}
	}
	if typ == "" || typ == "sdn" {
		for _, n := range s.nodes {
			out = append(out, map[string]any{"id": "sdn/" + n.name + "/localnetwork", "type": "sdn",
				"sdn": "localnetwork", "node": n.name, "status": "ok"})
		}
	}
	return out, nil
}

// GET /cluster/nextid: a string, though the schema says integer.
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
