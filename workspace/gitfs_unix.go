//go:build unix

package workspace

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/go-git/go-billy/v5"
	"github.com/go-git/go-billy/v5/osfs"
	"golang.org/x/sys/unix"
)

// gitDirFS gives go-git the .git directory of a tree whose root b holds,
// opened beneath it. go-git opens files by path: through
// /proc/self/fd/N, the path starts at the descriptor, so the identity
// the package runs as needs no right on the directories above the tree,
// and the directory cannot be swapped after it was opened. (Without
// /proc, the path is dir/.git.) BoundOS keeps links inside .git from
// leading out of it. The returned func closes the descriptor.
func gitDirFS(b *beneath, dir string) (billy.Filesystem, func(), error) {
	fd, err := openBeneath(b.root, ".git", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, nil, pathErr("open", ".git", err)
	}
	base := fmt.Sprintf("/proc/self/fd/%d", fd)
	if _, err := os.Stat(base); err != nil {
		base = filepath.Join(dir, ".git")
	}
	return osfs.New(base, osfs.WithBoundOS()), func() { unix.Close(fd) }, nil
}
