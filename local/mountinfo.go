package local

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/<pid>/mountinfo.
type mountEntry struct {
	ID           int
	Parent       int
	Root         string // the path inside the filesystem that is mounted
	MountPoint   string
	FSType       string
	Source       string
	SuperOptions []string
}

// parseMountinfo reads the format described in proc(5):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 2 {
			return nil, fmt.Errorf("mountinfo: malformed line %q", line)
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("mountinfo: malformed ids in %q", line)
		}
		e := mountEntry{
			ID:         id,
			Parent:     parent,
			Root:       unescapeMountPath(f[3]),
			MountPoint: unescapeMountPath(f[4]),
			FSType:     g[0],
			Source:     unescapeMountPath(g[1]),
		}
		if len(g) > 2 {
			e.SuperOptions = strings.Split(g[2], ",")
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	return out, nil
}

// unescapeMountPath undoes the kernel's octal escapes (\040 for a space,
// \011, \012, \134) so paths with odd characters compare correctly.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// hasOption reports whether opts contains o exactly.
func hasOption(opts []string, o string) bool {
	for _, x := range opts {
		if x == o {
			return true
		}
	}
	return false
}
