//go:build linux

package local

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestRecordModes: a sandbox's records (state, command, output, status
// lines, pids, exit) are the server's alone, whatever the umask, and the
// sandboxes directory too, even if it was made readable by others. The
// sandbox directory itself is 0710 for init's group only, which can
// search it but read nothing in it.
func TestRecordModes(t *testing.T) {
	canRun(t)
	for _, umask := range []int{0, 0o022} {
		t.Run(os.FileMode(umask).String(), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			dir := filepath.Join(t.TempDir(), "sandboxes")
			if err := os.Mkdir(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(dir, 0o777)
			b, err := New(Config{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			spec := defaultSpec()
			spec.Network = b.Capabilities().NetworkEgress // its records too
			sb := create(t, b, spec)
			p := start(t, sb, "/bin/sh", "-c", "echo step > $DELEGATE_STATUS_FILE; echo out")
			finish(t, p)
			// The events file is written as the shim reads the status
			// channel; give it a moment.
			waitFor(5*time.Second, func() bool { _, err := os.Stat(sb.path(fileEvents)); return err == nil })

			if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
				t.Errorf("sandboxes directory: mode %v, want 0700", st.Mode().Perm())
			}
			st, err := os.Stat(sb.dir)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o710 || st.Sys().(*syscall.Stat_t).Gid != stateOf(t, sb).HostUID || st.Sys().(*syscall.Stat_t).Uid != 0 {
				t.Errorf("sandbox directory: mode %v, owner %d:%d", st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Uid, st.Sys().(*syscall.Stat_t).Gid)
			}
			// Mount points the sandbox itself uses are not records.
			mounts := []string{dirWorkspace, dirRootfs, dirTemplate}
			var seen []string
			err = filepath.WalkDir(sb.dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil || path == sb.dir {
					return err
				}
				if d.IsDir() && slices.Contains(mounts, d.Name()) {
					return filepath.SkipDir
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				seen = append(seen, d.Name())
				want := os.FileMode(0o600)
				switch {
				case d.IsDir() && d.Name() == dirChannel:
					want = 0o755 // the status channel's tmpfs, which init crosses
				case d.Name() == filepath.Base(filePasswd) || d.Name() == filepath.Base(fileGroup):
					want = 0o644 // the job's passwd and group, from the host's (passwd_linux.go)
				case d.IsDir():
					want = 0o700
				}
				if info.Mode().Perm() != want {
					t.Errorf("%s: mode %v, want %v", d.Name(), info.Mode().Perm(), want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			// (The C shim writes a log only when it has something to say;
			// the walk above checks it whenever it is there.)
			for _, f := range []string{fileState, fileExec, fileExit, fileOutput, fileEvents, dirChannel, filepath.Base(fileStatusFIFO), fileShimPID, fileInitPID,
				filepath.Base(filePasswd), filepath.Base(fileGroup)} {
				if !slices.Contains(seen, f) {
					t.Errorf("%s was not checked (files: %v)", f, seen)
				}
			}
		})
	}
}
