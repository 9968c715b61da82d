package local

// cgroupSet names a sandbox's cgroups: one directory per controller (in
// cgroup v2 all three are the same directory). It is stored in state.json
// so that a restarted server finds the groups it must kill and remove.
type cgroupSet struct {
	Version int    `json:"version"` // 1 or 2
	Memory  string `json:"memory"`
	CPU     string `json:"cpu"`
	Pids    string `json:"pids"`
	// Freezer is the group Pause freezes (v2: the sandbox's own group;
	// v1: one in the freezer hierarchy, which the helpers do not place
	// processes in: Pause moves them); "" where there is none.
	Freezer string `json:"freezer,omitempty"`
}

// dirs returns each distinct directory once, in a fixed order.
func (c cgroupSet) dirs() []string {
	var out []string
	for _, d := range []string{c.Memory, c.CPU, c.Pids} {
		if d == "" {
			continue
		}
		dup := false
		for _, o := range out {
			dup = dup || o == d
		}
		if !dup {
			out = append(out, d)
		}
	}
	return out
}
