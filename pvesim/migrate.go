package pvesim

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Migration (qemu-server src/PVE/API2/Qemu.pm migrate_vm,
// src/PVE/QemuMigrate.pm; pve-manager PVE/API2/Nodes.pm migrateall).
//
// POST .../migrate checks at once what migrate_vm checks before it forks:
// the target ("target is local node.", "no such cluster node 'x'":
// PVE::Cluster::check_node_exists), root-only options, the VM's config
// on this node and its lock, and that a running VM is migrated online
// ("can't migrate running VM without --online"; a stopped one asked
// online is migrated offline, with a warning). Then a qmigrate task:
// QemuMigrate's prepare refuses a VM whose disks are on local storage
// when it runs ("can't live migrate attached local disks without
// with-local-disks option"), phase1 writes "lock: migrate" into the
// config, the VM keeps running on its node while its memory is copied
// (an online migration: its guest, agent and commands go on), and
// phase3_cleanup moves the config to the target node
// (move_config_to_node) and clears the lock: from then on the old node
// answers "Configuration file ... does not exist" and
// /cluster/resources lists the VM on the new one.
//
// POST /nodes/{node}/migrateall is a migrateall task that starts one
// migrate_vm per guest of the node (templates too; online for a running
// VM), at most maxworkers (max-workers in PVE 9; default 1) at a time,
// warns for those it could not start, and waits for them all.

// migrateTask starts a qmigrate task of v from node to target. Call with
// s.mu held.
func (s *Server) migrateTask(c *call, v *vm, node, target string, online, withLocal bool) (string, error) {
	if target == node {
		return "", paramErr("target", "target is local node.")
	}
	if s.node(target) == nil {
		return "", dieErr("no such cluster node '%s'", target)
	}
	if err := v.checkLock(); err != nil {
		return "", dieErr("%s", err)
	}
	running := v.status == "running"
	if running && !online {
		return "", dieErr("can't migrate running VM without --online")
	}
	warn := !running && online
	online = running
	vmid := v.vmid
	var started time.Time
	spec := taskSpec{node: node, typ: "qmigrate", id: strconv.Itoa(vmid)}
	spec.begin = func(t *task) error {
		started = time.Now()
		if warn {
			t.logf("VM isn't running. Doing offline migration instead.")
		}
		v, ok := s.vms[vmid]
		if !ok || v.node != node || v.ct {
			return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		if s.nodeOffline(target) {
			// QemuMigrate's prepare tests the ssh connection first.
			return errors.New("Can't connect to destination address using public key")
		}
		for _, k := range v.driveKeys() {
			vol := volumeID(v.conf[k])
			if vol == "none" || vol == "cdrom" || strings.HasPrefix(vol, "/") || !strings.Contains(vol, ":") {
				continue
			}
			st := s.storage(storageOf(vol))
			if st != nil && st.shared {
				continue
			}
			if online && !withLocal {
				return errors.New("can't live migrate attached local disks without with-local-disks option")
			}
			// Storage migration (pvesm export/import) is not simulated.
			return fmt.Errorf("pvesim: migrating the local disk '%s' (%s) is not simulated", vol, k)
		}
		t.logf("starting migration of VM %d to node '%s' (%s)", vmid, target, s.nodeIP(target))
		v.conf["lock"] = "migrate"
		if online {
			t.logf("starting online/live migration on unix:/run/qemu-server/%d.migrate", vmid)
		}
		return nil
	}
	spec.undo = func() {
		if v, ok := s.vms[vmid]; ok && v.node == node && v.conf["lock"] == "migrate" {
			delete(v.conf, "lock")
		}
	}
	spec.work = func(t *task) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		v, ok := s.vms[vmid]
		if !ok || v.node != node || v.conf["lock"] != "migrate" {
			return fmt.Errorf("migration aborted: VM %d changed meanwhile", vmid)
		}
		if online && v.status != "running" {
			spec.undo()
			return fmt.Errorf("migration problems: VM %d stopped during the migration", vmid)
		}
		// phase3_cleanup: the config moves to the target node, then the
		// lock goes (the guest runs on there).
		v.node = target
		delete(v.conf, "lock")
		d := time.Since(started).Round(time.Second)
		t.logf("migration finished successfully (duration %02d:%02d:%02d)", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
		return nil
	}
	return s.runTask(c, spec), nil
}

// nodeOffline tells whether a node is down (Faults.OfflineNodes). Call
// with s.mu held.
func (s *Server) nodeOffline(name string) bool {
	return slices.Contains(s.faults.OfflineNodes, name)
}

// nodeIP is a node's address as its migrations log it.
func (s *Server) nodeIP(name string) string {
	for i, n := range s.nodes {
		if n.name == name {
			return fmt.Sprintf("10.0.0.%d", 11+i)
		}
	}
	return "0.0.0.0"
}

// POST /nodes/{node}/qemu/{vmid}/migrate
func hMigrate(c *call) (any, error) {
	s := c.s
	for _, k := range []string{"force", "migration_type", "migration_network"} {
		if c.has(k) && c.authid != "root@pam" {
			return nil, paramErr(k, "Only root may use this option.")
		}
	}
	if c.has("targetstorage") {
		return nil, errors.New("pvesim: targetstorage (storage migration) is not simulated")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	return s.migrateTask(c, v, c.str("node"), c.str("target"), c.boolOr("online", false), c.boolOr("with-local-disks", false))
}

// POST /nodes/{node}/migrateall
func hMigrateAll(c *call) (any, error) {
	s := c.s
	node, target := c.str("node"), c.str("target")
	workers := c.intOr("max-workers", c.intOr("maxworkers", 1))
	withLocal := c.boolOr("with-local-disks", false)
	var only map[int]bool
	if c.has("vms") {
		only = map[int]bool{}
		for _, id := range splitList(c.str("vms")) {
			n, err := strconv.Atoi(id)
			if err != nil {
				return nil, paramErr("vms", fmt.Sprintf("invalid format - value does not look like a valid VM ID\n"))
			}
			only[n] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node(target) == nil {
		return nil, dieErr("no such cluster node '%s'", target)
	}
	// VM.Migrate on / or on each VM named (the schema lets every user in).
	if s.access.check(c.authid, "/", "VM.Migrate") != nil {
		if only == nil {
			return nil, s.access.check(c.authid, "/", "VM.Migrate")
		}
		for _, id := range slices.Sorted(maps.Keys(only)) {
			if err := s.access.check(c.authid, "/vms/"+strconv.Itoa(id), "VM.Migrate"); err != nil {
				return nil, err
			}
		}
	}
	return s.runTask(c, taskSpec{node: node, typ: "migrateall", delay: new(time.Duration), work: func(t *task) error {
		s.mu.Lock()
		var ids []int
		for _, id := range slices.Sorted(maps.Keys(s.vms)) {
			v := s.vms[id]
			if v.node == node && !v.ct && (only == nil || only[id]) {
				ids = append(ids, id)
			}
		}
		s.mu.Unlock()
		if len(ids) == 0 {
			s.mu.Lock()
			t.logf("no virtual guests matched, nothing to do..")
			s.mu.Unlock()
			return nil
		}
		var running []string
		startedN := 0
		for _, id := range ids {
			s.mu.Lock()
			v, ok := s.vms[id]
			var upid string
			err := fmt.Errorf("Configuration file '%s' does not exist", configFile(node, id))
			if ok && v.node == node {
				t.logf("Migrating VM %d", id)
				upid, err = s.migrateTask(c, v, node, target, v.status == "running", withLocal)
			}
			if err != nil {
				t.logf("%s", strings.TrimSpace(taskMessage(err)))
			} else {
				startedN++
				running = append(running, upid)
			}
			s.mu.Unlock()
			if err == nil {
				running = s.waitTasks(running, workers)
			}
		}
		s.waitTasks(running, 1)
		s.mu.Lock()
		defer s.mu.Unlock()
		if startedN == 0 {
			return errors.New("no migrations worker started...")
		}
		t.logf("All jobs finished, used %d workers in total.", startedN)
		return nil
	}}), nil
}

// waitTasks waits until fewer than n of the tasks run, and returns those
// still running.
func (s *Server) waitTasks(upids []string, n int) []string {
	for {
		s.mu.Lock()
		upids = slices.DeleteFunc(upids, func(u string) bool { return s.tasks[u] == nil || s.tasks[u].status == "stopped" })
		s.mu.Unlock()
		if len(upids) < n {
			return upids
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-s.ctx.Done():
			return nil
		}
	}
}
