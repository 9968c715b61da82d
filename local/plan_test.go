package local

import (
	"reflect"
	"strings"
	"testing"
)

func testPlan() *plan {
	return &plan{
		OutputLimit: 1 << 20, MaxEvents: 1 << 10, MaxStatusLine: 1 << 9, LatestEvery: 3, FloodPause: 4, Deadline: 1234567890123,
		Cgroup:     cgroupSet{Version: 1, Memory: "/m/sb", CPU: "/c/sb", Pids: "/p/sb", Freezer: "/f/sb"},
		HostIDBase: 1879048192, IDRange: slotSize, JobID: jobID,
		Args: []string{"/bin/sh", "-c", "echo 'a b'", ""}, Env: []string{"PATH=/bin", "SECRET=x=y"}, Dir: "/workspace",
		Seccomp: []byte{1, 2, 3, 4, 5, 6, 7, 8},
		Ops: []op{
			{code: opMount, n: 7, label: "mount /proc", s: [4]string{"proc", "rootfs/proc", "proc", ""}},
			{code: opSeccomp, label: "seccomp"},
			{code: opInput, n: jobID, label: "input", s: [4]string{"rootfs/run/delegate/inputs/script", "echo \x00 binary\xff", "", ""}},
		},
		Net:   netTool{Name: "pasta", Path: "/usr/bin/pasta"},
		Netns: true,
		Stdin: "/run/delegate/inputs/prompt",
		Mode:  modeCommand, Until: 1_800_000_000_000_000_000,
		ExecID: "ex-01234567", Channel: "../../channel/ex-01234567",
		Ahead:     1,
		SpareOps:  []op{{code: opBindKept, n: 1, label: "status channel", s: [4]string{"/run/delegate/status", "ex-01234567", "", ""}}},
		SpareIdle: 30000,
	}
}

func TestPlanRoundTrip(t *testing.T) {
	for _, p := range []*plan{testPlan(), {Args: []string{"x"}}} {
		got, err := unmarshalPlan(p.marshal())
		if err != nil {
			t.Fatal(err)
		}
		// Empty and nil lists decode alike.
		if len(p.Env) == 0 {
			got.Env = p.Env
		}
		if len(p.Seccomp) == 0 {
			got.Seccomp = p.Seccomp
		}
		if !reflect.DeepEqual(got, p) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, p)
		}
	}
}

// TestPlanRejects: a helper never acts on a plan it does not fully
// understand, and a bad length cannot make it allocate without bound.
func TestPlanRejects(t *testing.T) {
	good := testPlan().marshal()
	other := testPlan().marshal()
	other[4]++ // the version
	huge := (&plan{}).marshal()
	// The op count, before two empty strings, Netns, an empty string,
	// Mode, Until, three empty strings, Ahead, the spare ops' count and
	// SpareIdle.
	copy(huge[len(huge)-10*4-8-4-4:], []byte{0xff, 0xff, 0xff, 0x7f})
	hugeSpare := (&plan{}).marshal()
	copy(hugeSpare[len(hugeSpare)-4-4:], []byte{0xff, 0xff, 0xff, 0x7f})
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"cut short", good[:len(good)-1], "truncated"},
		{"trailing bytes", append(append([]byte(nil), good...), 0), "too many"},
		{"another version", other, "restart"},
		{"huge count", huge, "truncated"},
		{"huge count of spare ops", hugeSpare, "truncated"},
		{"more steps ahead than steps", func() []byte { p := testPlan(); p.Ahead = uint32(len(p.Ops) + 1); return p.marshal() }(), "steps ahead"},
		{"unknown mode", func() []byte { p := testPlan(); p.Mode = modeCommand + 1; return p.marshal() }(), "unknown mode"},
	}
	for _, tt := range tests {
		if _, err := unmarshalPlan(tt.data); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", tt.name, err, tt.want)
		}
	}
}
