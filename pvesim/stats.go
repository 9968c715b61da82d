package pvesim

import (
	"time"
)

// statsSnapshot is what pvestatd last broadcast to the cluster (pmxcfs's
// RRD data): each node's and each VM's figures. /nodes and
// /cluster/resources report it, so their figures lag by up to one cycle,
// and a VM created since the last cycle has none (pve-manager
// PVE/API2Tools.pm extract_vm_stats: without RRD data an entry is only
// id, vmid, node, type and status "unknown").
type statsSnapshot struct {
	nodes map[string]nodeStats
	vms   map[int]vmStats
}

type nodeStats struct {
	cpu                        float64
	maxcpu                     int
	mem, maxmem, disk, maxdisk int64
	uptime                     int64
}

type vmStats struct {
	name, status         string
	template, maxcpu     int
	cpu                  float64
	mem, maxmem, maxdisk int64
	uptime               int64
}

// rrdExpire is how long pmxcfs keeps a node's last RRD data when the
// node stops sending (pve-cluster src/pmxcfs/status.c: 5 minutes).
const rrdExpire = 5 * time.Minute

// collectStats is one pvestatd cycle on every node. An offline node sends
// nothing: its last figures (and its VMs') stay for rrdExpire. Call with
// s.mu held.
func (s *Server) collectStats() *statsSnapshot {
	snap := &statsSnapshot{nodes: map[string]nodeStats{}, vms: map[int]vmStats{}}
	prev := s.stats
	stale := func(node string) bool {
		since, off := s.offlineSince[node]
		return off && prev != nil && time.Since(since) < rrdExpire
	}
	for _, n := range s.nodes {
		if s.faults.offline(n.name) {
			if stale(n.name) {
				if old, ok := prev.nodes[n.name]; ok {
					snap.nodes[n.name] = old
				}
			}
			continue
		}
		used, cpus := s.nodeUsage(n.name)
		snap.nodes[n.name] = nodeStats{
			cpu: min(1.0, 0.01+0.1*float64(cpus)/float64(n.cpus)), maxcpu: n.cpus,
			mem: hostMemBase + used, maxmem: n.mem, disk: 4 << 30, maxdisk: 100 << 30,
			uptime: int64(time.Since(n.started).Seconds()) + 86400,
		}
	}
	for id, v := range s.vms {
		if s.faults.offline(v.node) {
			if stale(v.node) {
				if old, ok := prev.vms[id]; ok {
					snap.vms[id] = old
				}
			}
			continue
		}
		st := vmStats{name: v.conf["name"], status: v.status, maxcpu: s.guestCPUs(v),
			maxmem: v.memoryMiB() << 20, maxdisk: v.maxDisk()}
		if v.ct {
			st.name = ctName(v)
		}
		if v.isTemplate() {
			st.template = 1
		}
		if v.status == "running" {
			st.uptime = int64(time.Since(v.started).Seconds())
			st.mem = guestUse(v.runMem)
			st.cpu = 0.02
		}
		snap.vms[id] = st
	}
	return snap
}

// setFaults changes the faults, recording since when each node is
// offline (what the cluster knew of it before stays a while). Call with
// s.mu held.
func (s *Server) setFaults(f Faults) {
	s.currentStats()
	s.faults = f.clone()
	for _, n := range s.nodes {
		_, was := s.offlineSince[n.name]
		switch off := s.faults.offline(n.name); {
		case off && !was:
			s.offlineSince[n.name] = time.Now()
		case !off && was:
			delete(s.offlineSince, n.name)
		}
	}
}

// guestUse is what a running guest takes of its memory: a booted Linux
// guest touches a part of its RAM, not all of it (QEMU allocates guest
// memory lazily), so a node's "mem" counts use, not allocation.
func guestUse(runMem int64) int64 { return runMem * 2 / 5 }

// currentStats is the snapshot requests see: the last cycle's, or a live
// one when Options.StatsInterval is zero. Call with s.mu held.
func (s *Server) currentStats() *statsSnapshot {
	if s.opts.StatsInterval <= 0 || s.stats == nil {
		s.stats = s.collectStats()
	}
	return s.stats
}

// runStats is pvestatd: every StatsInterval it takes a new snapshot.
func (s *Server) runStats() {
	if s.opts.StatsInterval <= 0 {
		return
	}
	s.mu.Lock()
	s.stats = s.collectStats()
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(s.opts.StatsInterval)
		defer tick.Stop()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-tick.C:
				s.mu.Lock()
				s.stats = s.collectStats()
				s.mu.Unlock()
			}
		}
	}()
}
