package pvesim

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GET .../config: the config with the digest; integers, numbers and
// booleans as JSON numbers, the rest (memory included) as strings.
func hGetConfig(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	out := map[string]any{"digest": v.digest()}
	var props map[string]*Prop
	if c.m.Returns != nil {
		props = c.m.Returns.Properties
	}
	for k, val := range v.conf {
		out[k] = typedValue(props[k], val)
	}
	return out, nil
}

// typedValue renders a config value the way PVE's config parser leaves
// it: numbers for integer, number and boolean options.
func typedValue(p *Prop, val string) any {
	if p == nil {
		return val
	}
	switch p.Type {
	case "integer", "boolean":
		if n, err := strconv.ParseInt(val, 10, 64); err == nil {
			return n
		}
	case "number":
		if f, err := strconv.ParseFloat(val, 64); err == nil {
			return f
		}
	}
	return val
}

// configMeta are parameters of the config calls that are not options.
var configMeta = map[string]bool{
	"node": true, "vmid": true, "delete": true, "digest": true, "skiplock": true,
	"background_delay": true, "revert": true, "force": true,
}

var newDiskRe = regexp.MustCompile(`^([a-z][a-z0-9\-_.]*[a-z0-9]):(\d+(?:\.\d+)?)(,.*)?$`)

// setConfig is POST (a qmconfig task) or PUT (synchronous) .../config.
func setConfig(c *call, async bool) (any, error) {
	s := c.s
	s.mu.Lock()
	v, err := c.loadVMToChange()
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	vmid, node := v.vmid, v.node
	changes := map[string]string{}
	for k := range c.params {
		if !configMeta[k] {
			changes[k] = c.str(k)
		}
	}
	deletes := splitList(c.str("delete"))
	for _, d := range deletes {
		if _, both := changes[d]; both {
			s.mu.Unlock()
			return nil, paramErr("delete", fmt.Sprintf("you can't use '-%s' and -delete %s' at the same time", d, d))
		}
	}
	digest := c.str("digest")
	// apply runs with s.mu held.
	apply := func(t *task) error {
		v, ok := s.vms[vmid]
		if !ok || v.node != node {
			return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
		}
		if v.clones > 0 {
			return lockTimeout(vmid)
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		if digest != "" && digest != v.digest() {
			return errors.New("detected modified configuration - file changed by other user? Try again.")
		}
		for _, d := range deletes {
			delete(v.conf, d)
			if t != nil {
				t.logf("delete: %s", d)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(changes)) {
			val := changes[k]
			switch {
			case strings.HasPrefix(k, "net"):
				if netMAC(val) == "" {
					val = withNewMAC(val)
				}
			case k == "tags":
				val = normalizeTags(val)
			case diskKeyRe.MatchString(k):
				if m := newDiskRe.FindStringSubmatch(val); m != nil {
					// "local-lvm:4" allocates a new 4 GiB volume.
					size, _ := strconv.ParseFloat(m[2], 64)
					val = fmt.Sprintf("%s:vm-%d-disk-%d,size=%s%s", m[1], vmid, v.nextDiskIndex(), formatSize(int64(size*(1<<30))), m[3])
				}
			}
			v.conf[k] = val
			if t != nil {
				t.logf("update VM %d: -%s %s", vmid, k, val)
			}
		}
		return nil
	}
	if !async {
		defer s.mu.Unlock()
		if err := apply(nil); err != nil {
			return nil, dieErr("%s", err)
		}
		return nil, nil
	}
	upid := s.startTask(c, node, "qmconfig", strconv.Itoa(vmid), func(t *task) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		return apply(t)
	}, nil)
	s.mu.Unlock()
	if !c.has("background_delay") {
		return upid, nil
	}
	// Wait a little for the task: if it ends in time, answer as PUT would.
	deadline := time.Now().Add(time.Duration(c.int("background_delay")) * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		t := s.tasks[upid]
		status, exit := t.status, t.exitstatus
		s.mu.Unlock()
		if status == "stopped" {
			if exit != "OK" {
				return nil, dieErr("%s", exit)
			}
			return nil, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return upid, nil
}

func (v *vm) nextDiskIndex() int {
	i := 0
	for _, k := range v.disks() {
		if strings.Contains(v.conf[k], fmt.Sprintf("vm-%d-disk-", v.vmid)) {
			i++
		}
	}
	return i
}
