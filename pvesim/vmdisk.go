package pvesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A VM's disk, as far as the simulator keeps one: its guest's
// /workspace (the rest of a guest is its template's root file system,
// which nothing changes). What the guest wrote there outlives a stop, as
// a real disk's contents do: when a guest stops, its workspace is saved
// in the simulator's disk directory (disks/<vmid>/disk), and the next
// guest of the VM starts with it. A snapshot keeps a copy of the disk as
// it was (disks/<vmid>/snap-<name>), which a rollback makes the disk
// again; deleting the snapshot or destroying the VM removes what it held.
//
// Files are kept with the guest's own user and group ids (a guest's
// sandbox maps them onto a slot of host ids of its own, and the next
// guest of the VM has another slot): saved, a file of guest uid 1000 is
// owned by 1000, and it is owned by the new guest's BASE+1000 once copied
// in. The disk directory is the simulator's (mode 0700), not the guests'.
// Special files (the real agent's socket in /workspace/.qga) are not
// kept. Only guests of the simulator's own sandbox backend have disks.
type diskStore struct {
	dir string // "": not modelled (guests of another backend)

	mu    sync.Mutex
	locks map[int]*sync.Mutex // one per VM: a save, a restore or a copy at a time
}

func newDiskStore(dir string) *diskStore {
	return &diskStore{dir: dir, locks: map[int]*sync.Mutex{}}
}

// lock takes a VM's disk; the caller calls the function it returns.
func (d *diskStore) lock(vmid int) func() {
	d.mu.Lock()
	m := d.locks[vmid]
	if m == nil {
		m = &sync.Mutex{}
		d.locks[vmid] = m
	}
	d.mu.Unlock()
	m.Lock()
	return m.Unlock
}

func (d *diskStore) vmDir(vmid int) string { return filepath.Join(d.dir, strconv.Itoa(vmid)) }
func (d *diskStore) disk(vmid int) string  { return filepath.Join(d.vmDir(vmid), "disk") }
func (d *diskStore) snap(vmid int, name string) string {
	return filepath.Join(d.vmDir(vmid), "snap-"+name)
}

// guestDisk is where a running guest's disk is on the host: its
// workspace, and the host ids its guest ids start at.
type guestDisk struct {
	ws   string
	base int
}

// hostDisk finds a new guest's workspace on the host and its slot of
// host ids (the local backend's sandbox directory belongs to group BASE:
// local/doc.go).
func (s *Server) hostDisk(sandboxID string) (guestDisk, error) {
	dir := filepath.Join(s.guestDir, sandboxID)
	fi, err := os.Stat(dir)
	if err != nil {
		return guestDisk{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return guestDisk{}, errors.New("pvesim: no owner of the guest's directory")
	}
	return guestDisk{ws: filepath.Join(dir, "workspace"), base: int(st.Gid)}, nil
}

// save keeps a stopped guest's workspace as its VM's disk. Call with the
// VM's disk locked.
func (d *diskStore) save(vmid int, g guestDisk) error {
	dst := d.disk(vmid)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return copyTree(g.ws, dst, -g.base)
}

// restore gives a booting guest its VM's disk (nothing if the VM has
// none yet). Call with the VM's disk locked.
func (d *diskStore) restore(vmid int, g guestDisk) error {
	src := d.disk(vmid)
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return copyTree(src, g.ws, g.base)
}

// copyTree copies the directory tree src into dst (made if missing;
// an existing dst keeps its own owner and mode), adding shift to every
// owner's uid and gid (ids that would leave 0..65535 of the guest become
// its nobody, 65534): regular files, directories and symbolic links,
// with their modes and modification times; other files and the real
// agent's directory are left out.
func copyTree(src, dst string, shift int) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	var dirs []string // modification times are set once their contents are written
	err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		if rel == ".qga" {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st == nil {
			return fmt.Errorf("%s: no owner", p)
		}
		to := filepath.Join(dst, rel)
		switch {
		case fi.IsDir():
			if err := os.Mkdir(to, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			dirs = append(dirs, rel)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFile(p, to); err != nil {
				return err
			}
		default:
			return nil
		}
		return setAttrs(to, fi, st, shift)
	})
	if err != nil {
		return fmt.Errorf("pvesim: copy a guest's disk: %w", err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		fi, err := os.Lstat(filepath.Join(src, dirs[i]))
		if err != nil {
			return fmt.Errorf("pvesim: copy a guest's disk: %w", err)
		}
		if err := os.Chtimes(filepath.Join(dst, dirs[i]), fi.ModTime(), fi.ModTime()); err != nil {
			return fmt.Errorf("pvesim: copy a guest's disk: %w", err)
		}
	}
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// setAttrs gives a copy its original's owner (shifted), mode and
// modification time; a link's own.
func setAttrs(to string, fi fs.FileInfo, st *syscall.Stat_t, shift int) error {
	id := func(n uint32) int {
		v := int(n) + shift
		if shift < 0 && (v < 0 || v > 65535) {
			return 65534
		}
		return v
	}
	if err := os.Lchown(to, id(st.Uid), id(st.Gid)); err != nil {
		return err
	}
	mt := unix.NsecToTimespec(fi.ModTime().UnixNano())
	if fi.Mode()&fs.ModeSymlink != 0 {
		return unix.UtimesNanoAt(unix.AT_FDCWD, to, []unix.Timespec{mt, mt}, unix.AT_SYMLINK_NOFOLLOW)
	}
	// After the chown, which clears setuid and setgid bits.
	if err := os.Chmod(to, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	if fi.IsDir() {
		return nil
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, to, []unix.Timespec{mt, mt}, 0)
}

// snapshotDisk keeps a copy of a VM's disk as snapshot name: the running
// guest's workspace (g), else what its last guest saved. With freeze,
// the guest's file systems are frozen around the copy as qemu-server
// freezes them around a snapshot without RAM when the agent is enabled
// (src/PVE/QemuConfig.pm __snapshot_check_freeze_needed, __snapshot_freeze;
// src/PVE/QemuServer/Agent.pm guest_fs_freeze_applicable): the simulator
// freezes the guest's processes instead (its cgroup freezer), so nothing
// writes during the cut, and never asks qemu-ga for guest-fsfreeze-freeze,
// which would freeze the host's. A guest whose agent does not answer is
// not frozen, with qemu-server's message. paused: the VM was suspended,
// and stays so.
func (s *Server) snapshotDisk(t *task, vmid int, name string, g *guest, freeze, paused bool) error {
	if s.disks.dir == "" {
		return nil
	}
	if freeze {
		if err := s.pingAgent(s.ctx, vmid); err != nil {
			t.logf("skipping guest filesystem freeze - agent configured but not running?")
			freeze = false
		}
	}
	unlock := s.disks.lock(vmid)
	defer unlock()
	dst := s.disks.snap(vmid, name)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if g == nil || g.disk == nil {
		src := s.disks.disk(vmid)
		if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
			return os.MkdirAll(dst, 0o700)
		}
		return copyTree(src, dst, 0)
	}
	pz, canFreeze := g.sb.(interface {
		Pause(context.Context) error
		Resume(context.Context) error
	})
	if freeze && !paused && canFreeze {
		if err := pz.Pause(s.ctx); err != nil {
			t.logf("guest-fsfreeze-freeze problems - %v", err)
		} else {
			defer func() {
				if err := pz.Resume(context.WithoutCancel(s.ctx)); err != nil {
					t.logf("guest-fsfreeze-thaw problems - %v", err)
				}
			}()
		}
	}
	return copyTree(g.disk.ws, dst, -g.disk.base)
}

// rollbackDisk makes snapshot name's copy the VM's disk again (the VM is
// stopped: its guest saved the disk as it stopped).
func (s *Server) rollbackDisk(vmid int, name string) error {
	if s.disks.dir == "" {
		return nil
	}
	unlock := s.disks.lock(vmid)
	defer unlock()
	src, dst := s.disks.snap(vmid, name), s.disks.disk(vmid)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		return nil // taken before disks were kept: an empty disk
	}
	return copyTree(src, dst, 0)
}

// dropSnapshotDisk removes a deleted snapshot's copy.
func (s *Server) dropSnapshotDisk(vmid int, name string) {
	if s.disks.dir == "" {
		return
	}
	unlock := s.disks.lock(vmid)
	defer unlock()
	if err := os.RemoveAll(s.disks.snap(vmid, name)); err != nil {
		s.log.Error("pvesim: remove a snapshot's disk", "vmid", vmid, "snapshot", name, "err", err)
	}
}

// dropDisks removes a destroyed VM's disk and snapshots.
func (s *Server) dropDisks(vmid int) {
	if s.disks.dir == "" {
		return
	}
	unlock := s.disks.lock(vmid)
	defer unlock()
	if err := os.RemoveAll(s.disks.vmDir(vmid)); err != nil {
		s.log.Error("pvesim: remove a VM's disk", "vmid", vmid, "err", err)
	}
}
