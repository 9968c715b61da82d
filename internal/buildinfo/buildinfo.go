// Package buildinfo says which delegate this binary is, once, for every
// place that shows it: `delegate --version`, the MCP serverInfo, the
// delegate_build_info metric and the dashboard's footer.
//
// The version is, in order: what the build set with
//
//	go build -ldflags "-X github.com/delegate-dev/delegate/internal/buildinfo.version=v1.2.3" ./cmd/delegate
//
// else the main module's version that the go command stamped (v1.2.3 for
// `go install …@v1.2.3`; a pseudo-version such as
// v0.0.0-20261126064500-7d6751c87e78+dirty for a build in a git checkout),
// else "devel-" and the VCS revision the go command recorded, else "dev".
package buildinfo

import (
	"runtime/debug"
	"strings"
	"sync"
)

// version is set by the linker (-ldflags -X); empty otherwise.
var version string

// Info is what a binary says about its build.
type Info struct {
	// Version is the one version string shown everywhere.
	Version string
	// Revision is the VCS commit the binary was built from ("unknown"
	// when the build did not record one), with "+dirty" when the work
	// tree had changes.
	Revision string
	// GoVersion is the Go toolchain that built it (go1.26.8).
	GoVersion string
}

// Get returns this binary's build information (read once).
func Get() Info { return get() }

// Version is Get().Version.
func Version() string { return get().Version }

var get = sync.OnceValue(func() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, bi)
})

// resolve works out the Info from the linker's version (ldflags) and the
// build information the go command embedded (nil when there is none).
func resolve(ldflags string, bi *debug.BuildInfo) Info {
	info := Info{Version: strings.TrimSpace(ldflags), Revision: "unknown"}
	if bi == nil {
		if info.Version == "" {
			info.Version = "dev"
		}
		return info
	}
	info.GoVersion = bi.GoVersion
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		info.Revision = rev
		if dirty {
			info.Revision += "+dirty"
		}
	}
	switch {
	case info.Version != "":
	case bi.Main.Version != "" && bi.Main.Version != "(devel)":
		info.Version = bi.Main.Version
	case rev != "":
		info.Version = "devel-" + rev[:min(len(rev), 12)]
		if dirty {
			info.Version += "+dirty"
		}
	default:
		info.Version = "dev"
	}
	return info
}
