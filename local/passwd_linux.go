//go:build linux

package local

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// The sandbox's users and groups (host view): its /etc/passwd and
// /etc/group are files of its own, bound over the host's, in which the
// job's uid and gid 1000 are "sandbox" (USER and LOGNAME say so too), so
// that id, ls -l, whoami, ssh and git name the job's user as the job's,
// not as whichever host account has uid 1000. They keep the host's
// system accounts (ids below 1000, and nobody), which programs look up
// by name, without their groups' member lists, and nothing of the host's
// people: no account at or above 1000 but nobody. A template's root
// filesystem keeps its own files (its maker decides its users).
const (
	// jobUser names the job's uid and gid inside.
	jobUser = "sandbox"
	// filePasswd and fileGroup are kept on the channel's tmpfs, so that
	// the job's mount table shows "/passwd" of that tmpfs as their
	// source, not a path on the host.
	filePasswd = dirChannel + "/passwd"
	fileGroup  = dirChannel + "/group"
	// nobodyID is the overflow id, which host files owned by ids the
	// sandbox does not map (root's) show as.
	nobodyID = 65534
)

// sandboxAccounts derives the sandbox's passwd and group files from the
// host's.
func sandboxAccounts(hostPasswd, hostGroup []byte) (passwd, group []byte) {
	keep := func(src []byte, idField int, edit func(f [][]byte) [][]byte) (out []byte, nobody bool) {
		for line := range bytes.Lines(src) {
			line = bytes.TrimRight(line, "\n")
			f := bytes.Split(line, []byte(":"))
			if len(f) <= idField || len(f[0]) == 0 || f[0][0] == '#' || f[0][0] == '+' || f[0][0] == '-' {
				continue
			}
			id, err := strconv.Atoi(string(f[idField]))
			if err != nil || id < 0 || (id >= jobID && id != nobodyID) || string(f[0]) == jobUser {
				continue
			}
			nobody = nobody || id == nobodyID
			out = append(append(out, bytes.Join(edit(f), []byte(":"))...), '\n')
		}
		return out, nobody
	}
	passwd, nobody := keep(hostPasswd, 2, func(f [][]byte) [][]byte { return f })
	passwd = fmt.Appendf(passwd, "%s:x:%d:%d:delegate job:/workspace:/bin/sh\n", jobUser, jobID, jobID)
	if !nobody {
		passwd = fmt.Appendf(passwd, "nobody:x:%d:%d:nobody:/nonexistent:/usr/sbin/nologin\n", nobodyID, nobodyID)
	}
	group, nobody = keep(hostGroup, 2, func(f [][]byte) [][]byte {
		if len(f) >= 4 {
			f[3] = nil // members: the host's people
		}
		return f
	})
	group = fmt.Appendf(group, "%s:x:%d:\n", jobUser, jobID)
	if !nobody {
		group = fmt.Appendf(group, "nogroup:x:%d:\n", nobodyID)
	}
	return passwd, group
}

// writeAccounts writes the sandbox's passwd and group files into the
// channel's tmpfs of dir (a sandbox's directory, or one command's of
// many: makeStatusFIFO calls it), owned by root, readable by all. A host
// without the files gets the job's user and nobody alone.
func writeAccounts(dir string) error {
	hostPasswd, err := os.ReadFile("/etc/passwd")
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("accounts: %w", err)
	}
	hostGroup, err := os.ReadFile("/etc/group")
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("accounts: %w", err)
	}
	passwd, group := sandboxAccounts(hostPasswd, hostGroup)
	for name, data := range map[string][]byte{filePasswd: passwd, fileGroup: group} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return fmt.Errorf("accounts: %w", err)
		}
		if err := os.Chmod(p, 0o644); err != nil { // whatever the umask
			return fmt.Errorf("accounts: %w", err)
		}
	}
	return nil
}

// accountOps bind the sandbox's passwd and group over the host's in the
// root being built, when the host's are plain files (a link would lead
// the bind elsewhere) and the command's directory execDir (the shim's,
// which the ops' paths are relative to) has them (a sandbox made before
// it had them keeps the host's).
func accountOps(execDir string, add func(code opCode, n uint64, label string, s ...string), at func(p ...string) string) {
	for _, f := range []struct{ src, name string }{{filePasswd, "passwd"}, {fileGroup, "group"}} {
		if _, err := os.Lstat(filepath.Join(execDir, f.src)); err != nil {
			continue
		}
		if fi, err := os.Lstat(filepath.Join("/etc", f.name)); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		add(opMount, unix.MS_BIND, "accounts: bind /etc/"+f.name, f.src, at("etc", f.name))
		add(opReadOnly, 0, "accounts: make /etc/"+f.name+" read-only", at("etc", f.name))
	}
}
