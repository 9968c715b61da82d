//go:build unix && !linux

package workspace

import (
	"fmt"
	"os"
)

// identity: see ident_linux.go. Only Linux can change one thread's
// filesystem identity, so elsewhere a server running as root refuses
// trees that belong to another user instead of reading them as root.
type identity struct{ uid, gid uint32 }

func (id *identity) String() string {
	if id == nil {
		return "the server's user"
	}
	return fmt.Sprintf("uid %d", id.uid)
}

func identityFor(uid, gid uint32) (*identity, error) {
	if os.Geteuid() != 0 || uid == 0 {
		return nil, nil
	}
	return nil, fmt.Errorf("the directory belongs to uid %d: acting as another user needs Linux (a server running as root elsewhere cannot read it as its owner)", uid)
}

func runAs(id *identity, fn func() error) error {
	if id != nil {
		return fmt.Errorf("acting as %s needs Linux", id)
	}
	return fn()
}
