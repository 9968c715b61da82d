package pvesim

import (
	"fmt"
	"strings"
)

// Releases are the PVE releases the simulator can behave like.
func Releases() []string { return []string{"8.2", "8.4", "9.1"} }

// release is what differs between the PVE releases the simulator knows.
type release struct {
	name    string // "9.1"
	major   int
	version string // pve-manager's version, as /version reports it
	// maxPost is pve-http-server's cap on a request body: 64 KiB until
	// libpve-http-server-perl 5.2.1 (fix #6230, April 2025, first in PVE
	// 8.4), 512 KiB since (src/PVE/APIServer/AnyEvent.pm $limit_max_post).
	maxPost int
}

func parseRelease(v string) (release, error) {
	switch strings.TrimSpace(v) {
	case "8.2":
		return release{name: "8.2", major: 8, version: "8.2.4", maxPost: 64 << 10}, nil
	case "8.4":
		return release{name: "8.4", major: 8, version: "8.4.1", maxPost: 512 << 10}, nil
	case "", "9.1":
		return release{name: "9.1", major: 9, version: "9.1.1", maxPost: 512 << 10}, nil
	}
	return release{}, fmt.Errorf("pvesim: PVE version %q: must be one of %s", v, strings.Join(Releases(), ", "))
}
