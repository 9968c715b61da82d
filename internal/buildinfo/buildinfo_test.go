package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "7d6751c87e783313f4826df2a68dc40575e868ff"
	for _, tc := range []struct {
		name    string
		ldflags string
		bi      *debug.BuildInfo
		want    Info
	}{
		{"no build info", "", nil, Info{Version: "dev", Revision: "unknown"}},
		{"ldflags alone", "v1.2.3", nil, Info{Version: "v1.2.3", Revision: "unknown"}},
		{"ldflags win over the module version", "v1.2.3",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261126064500-7d6751c87e78"}, Settings: vcs(rev, "false")},
			Info{Version: "v1.2.3", Revision: rev, GoVersion: "go1.26.8"}},
		{"go install @version", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}},
			Info{Version: "v1.4.0", Revision: "unknown", GoVersion: "go1.26.8"}},
		{"git checkout, stamped", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261126064500-7d6751c87e78+dirty"}, Settings: vcs(rev, "true")},
			Info{Version: "v0.0.0-20261126064500-7d6751c87e78+dirty", Revision: rev + "+dirty", GoVersion: "go1.26.8"}},
		{"revision without a module version", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")},
			Info{Version: "devel-7d6751c87e78", Revision: rev, GoVersion: "go1.26.8"}},
		{"dirty revision", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")},
			Info{Version: "devel-7d6751c87e78+dirty", Revision: rev + "+dirty", GoVersion: "go1.26.8"}},
		{"-buildvcs=false", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			Info{Version: "dev", Revision: "unknown", GoVersion: "go1.26.8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolve(tc.ldflags, tc.bi); got != tc.want {
				t.Errorf("resolve(%q, …) = %+v, want %+v", tc.ldflags, got, tc.want)
			}
		})
	}
}

// TestGetIsStable: every caller sees the same Info.
func TestGetIsStable(t *testing.T) {
	a, b := Get(), Get()
	if a != b || a.Version == "" || Version() != a.Version {
		t.Fatalf("Get() = %+v then %+v, Version() = %q", a, b, Version())
	}
}
