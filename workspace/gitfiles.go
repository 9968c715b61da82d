//go:build unix

package workspace

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// readHead reads the commit a work tree has checked out, and its branch,
// from .git/HEAD and the ref it names (a loose ref or packed-refs),
// beneath the tree like every other read. The commit is "" before the
// first one.
func readHead(b *beneath) (head, branch string, err error) {
	data, err := b.readFile(".git/HEAD", 4096)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "", "", nil
		}
		return "", "", fmt.Errorf("read .git/HEAD: %w", err)
	}
	s := strings.TrimSpace(string(data))
	if isHash(s) {
		return s, "", nil
	}
	ref, ok := strings.CutPrefix(s, "ref: ")
	if !ok {
		return "", "", fmt.Errorf(".git/HEAD holds %.40q, neither a commit nor a ref", s)
	}
	branch = strings.TrimPrefix(ref, "refs/heads/")
	for range 5 {
		if !validRef(ref) {
			return "", "", fmt.Errorf(".git/HEAD names %q, not a valid ref", ref)
		}
		v, err := readRef(b, ref)
		if err != nil {
			return "", "", err
		}
		next, sym := strings.CutPrefix(v, "ref: ")
		if !sym {
			return v, branch, nil
		}
		ref = next
	}
	return "", "", fmt.Errorf(".git/HEAD: symbolic refs nested too deep")
}

// readRef returns a ref's value (a hash, or "ref: …"), "" when it does
// not exist (a branch before its first commit).
func readRef(b *beneath, ref string) (string, error) {
	data, err := b.readFile(".git/"+ref, 4096)
	if err == nil {
		v := strings.TrimSpace(string(data))
		if isHash(v) || strings.HasPrefix(v, "ref: ") {
			return v, nil
		}
		return "", fmt.Errorf(".git/%s holds %.40q, not a commit", ref, v)
	}
	if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
		return "", fmt.Errorf("read .git/%s: %w", ref, err)
	}
	packed, err := b.readFile(".git/packed-refs", 256<<20)
	if errors.Is(err, unix.ENOENT) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("read .git/packed-refs: %w", err)
	}
	for _, line := range strings.Split(string(packed), "\n") {
		h, name, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && name == ref && isHash(h) {
			return h, nil
		}
	}
	return "", nil
}

func isHash(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// validRef checks a ref name by git's rules (git-check-ref-format) that
// matter here: under refs/, no "..", no component starting with "." or
// ending with ".lock", no control characters or any of ~^:?*[\ and space.
func validRef(ref string) bool {
	if !strings.HasPrefix(ref, "refs/") || strings.HasSuffix(ref, "/") || strings.HasSuffix(ref, ".") ||
		strings.Contains(ref, "..") || strings.Contains(ref, "@{") || strings.Contains(ref, "//") {
		return false
	}
	for _, c := range ref {
		if c < 0x20 || c == 0x7f || strings.ContainsRune(" ~^:?*[\\", c) {
			return false
		}
	}
	for _, comp := range strings.Split(ref, "/") {
		if comp == "" || strings.HasPrefix(comp, ".") || strings.HasSuffix(comp, ".lock") {
			return false
		}
	}
	return true
}
