package proxmox_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
)

// readAll reads paths with the VM's sandbox.FilesReader, by path: each
// file's sha256.
func readAll(t *testing.T, sb sandbox.Instance, paths []string) map[string]string {
	t.Helper()
	fr, ok := sb.(sandbox.FilesReader)
	if !ok {
		t.Fatal("a VM's sandbox is no sandbox.FilesReader")
	}
	got := map[string]string{}
	err := fr.ReadFiles(context.Background(), paths, func(p string, r io.Reader) error {
		h := sha256.New()
		if _, err := io.Copy(h, r); err != nil {
			return err
		}
		got[p] = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// filesInGuest writes n random files of size bytes in /workspace/out of
// the VM, and a link and a directory there, and returns the files'
// sha256 by path.
func filesInGuest(t *testing.T, sb sandbox.Instance, n, size int) map[string]string {
	t.Helper()
	exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", fmt.Sprintf(
		`mkdir -p /workspace/out/dir && cd /workspace/out && ln -s /etc/passwd link && i=0; while [ $i -lt %d ]; do i=$((i+1)); head -c %d /dev/urandom >"f $i.bin"; done; sha256sum *.bin`, n, size)},
		OutputLimit: 1 << 20})
	if exit.Code != 0 {
		t.Fatalf("%+v %s", exit, out)
	}
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if sum, name, ok := strings.Cut(line, "  "); ok {
			sums["/workspace/out/"+name] = sum
		}
	}
	if len(sums) != n {
		t.Fatalf("sha256sum said %q", out)
	}
	return sums
}

// TestFilesOverHTTP (issue 39, 7): a VM with a network sends the files
// asked for (a job's artifacts, as the engine collects them) in one
// archive over HTTP, with the transfer's own token: a PUT, no
// agent/file-read, three execs (the packing, the sending, the removal of
// the list's parts is in the packing) whatever their number; without a
// network, or where the guest does not reach the server, the archive
// comes through the agent. A name that is gone, a link and a directory
// are left out; nothing is left in the guest.
func TestFilesOverHTTP(t *testing.T) {
	for _, c := range []struct {
		name       string
		reach, nic bool
		put        bool
	}{
		{"over HTTP", true, true, true},
		{"no network", true, false, false},
		{"no route", false, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig := newXferRig(t, c.reach, "http://"+guestCallback)
			sb := rig.vm(t, c.nic)
			sums := filesInGuest(t, sb, 20, 150<<10)
			var paths []string
			for p := range sums {
				paths = append(paths, p)
			}
			paths = append(paths, "/workspace/out/link", "/workspace/out/dir", "/workspace/out/gone")

			n0 := len(rig.sim.Requests())
			got := readAll(t, sb, paths)
			all, calls, _, reads := agentCalls(rig.sim, n0)
			t.Logf("3 MB in 20 files: %d agent calls (%d of them polls), file-reads %v; served %v", all, all-calls, reads, rig.served())
			if fmt.Sprint(got) != fmt.Sprint(sums) {
				t.Errorf("read %v, want %v", got, sums)
			}
			served := rig.served()
			if put := len(served) == 1 && served[0] == "PUT 204"; put != c.put {
				t.Errorf("the callback server served %v (put %v)", served, c.put)
			}
			if c.put && (len(reads) != 0 || calls != 3) {
				t.Errorf("over HTTP: %d agent calls but polls, file-reads %v; want a file-write (the list) and two execs (pack, send)", calls, reads)
			}
			if !c.put && len(reads) != 1 {
				t.Errorf("through the agent: file-reads %v, want one (the archive)", reads)
			}
			if _, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "ls -A /var/tmp/delegate | grep -v '^cmd-'; true"}}); strings.TrimSpace(out) != "" {
				t.Errorf("left in the guest: %s", out)
			}
		})
	}
}

// TestArtifactsTogether (issue 39, item 7): the engine collects a job's
// artifacts from its VM in one archive (sandbox.FilesReader), not with
// an exec of dd each, and keeps each one whole; one over the per-file
// cap is listed as skipped.
func TestArtifactsTogether(t *testing.T) {
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{ArtifactMaxFile: 200 << 10})
	m := delegate.Manifest{AgentType: delegate.AgentScript, Artifacts: []string{"out/*"},
		Task: `mkdir -p out && for i in 1 2 3 4 5 6 7 8; do head -c 50000 /dev/urandom >out/a$i.bin; done; head -c 300000 /dev/urandom >out/big.bin; cd out && sha256sum a*.bin`}
	j, err := s.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n0 := len(sim.Requests())
	if got := s.wait(t, j.ID); got.Status != delegate.StatusSuccess {
		t.Fatalf("%s: %s", got.Status, got.Error)
	}
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(s.output(t, j.ID)), "\n") {
		if sum, name, ok := strings.Cut(line, "  "); ok {
			sums["out/"+name] = sum
		}
	}
	arts, err := s.eng.Artifacts(context.Background(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, a := range arts {
		switch {
		case a.Name == "out/big.bin":
			if !strings.Contains(a.Skipped, "per-file cap") {
				t.Errorf("big.bin: %+v", a)
			}
		case a.SHA256 != sums[a.Name] || a.Skipped != "":
			t.Errorf("%s: %+v, its sha256 in the VM %s", a.Name, a, sums[a.Name])
		default:
			kept++
		}
	}
	var each int // reads of one artifact: an exec of dd, or a file-read
	for _, r := range sim.Requests()[n0:] {
		if strings.HasSuffix(r.Path, "/agent/exec") && strings.Contains(fmt.Sprint(r.Params["command"]), "/bin/dd") ||
			strings.HasSuffix(r.Path, "/agent/file-read") && strings.HasPrefix(fmt.Sprint(r.Params["file"]), "/workspace/out/") {
			each++
		}
	}
	if kept != 8 || each != 0 {
		t.Errorf("%d artifacts kept (want 8), %d reads of one artifact (want none: one archive)", kept, each)
	}
}

// TestDirArchive (issue 40, item 3): the tree of one directory of the
// workspace comes alone (cp -r out of a sandbox), over HTTP where the VM
// reaches the server, its names relative to that directory; one that is
// not there is fs.ErrNotExist, one reached through a link is refused.
func TestDirArchive(t *testing.T) {
	rig := newXferRig(t, true, "http://"+guestCallback)
	sb := rig.vm(t, true)
	if exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c",
		"cd /workspace && mkdir -p data/sub && echo a >data/sub/a.txt && echo b >top.txt && ln -s data linked"}}); exit.Code != 0 {
		t.Fatalf("%+v %s", exit, out)
	}
	ctx := context.Background()
	da := sb.(sandbox.DirArchiver)
	rc, err := da.GetDirArchive(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
	rc.Close()
	slices.Sort(names)
	if fmt.Sprint(names) != "[./ ./sub/ ./sub/a.txt]" {
		t.Errorf("the tree of data: %v", names)
	}
	if got := rig.served(); len(got) != 1 || got[0] != "PUT 204" {
		t.Errorf("the callback server served %v, want a PUT", got)
	}
	if _, err := da.GetDirArchive(ctx, "nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a directory that is not there: %v", err)
	}
	if _, err := da.GetDirArchive(ctx, "linked"); err == nil || errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "a link") {
		t.Errorf("a link to a directory: %v", err)
	}
}
