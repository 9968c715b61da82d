//go:build linux

package local

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

// benchTree writes files files of size bytes each (100 per directory)
// under a new directory, and returns it.
func benchTree(b *testing.B, files, size int) string {
	b.Helper()
	dir := b.TempDir()
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	for i := range files {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.Mkdir(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d.txt", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkWorkspaceImport is the engine's import of a 10,000-file,
// 100 MB tree into a local sandbox (workspace.Scan, Archive on the
// server, PutArchive's helper unpacking it in the sandbox's cgroups), and
// beside it, as the baseline, GNU tar copying the same tree into a tmpfs
// (tar -c | tar -x). It reports both and their ratio.
//
//	go test -run '^$' -bench WorkspaceImport -benchtime 5x ./local/
func BenchmarkWorkspaceImport(b *testing.B) {
	be := newBackend(b, 0)
	dir := benchTree(b, 10_000, 10_000)
	ctx := context.Background()
	var imp, base time.Duration
	for b.Loop() {
		b.StopTimer()
		sb, dst, end := importRound(b, be)
		b.StartTimer()

		t0 := time.Now()
		tree, err := workspace.Scan(ctx, dir, workspace.ScanOptions{})
		if err != nil {
			b.Fatal(err)
		}
		src := tree.Stream(ctx, workspace.ArchiveOptions{})
		got, err := sb.(sandbox.Archiver).PutArchive(ctx, src)
		src.Close()
		if _, aerr := src.Result(); err != nil || aerr != nil || got.Files != 10_000 {
			b.Fatalf("PutArchive: %+v %v %v", got, err, aerr)
		}
		imp += time.Since(t0)

		t1 := time.Now()
		tar := exec.Command("/bin/sh", "-c", `tar -C "$0" -cf - . | tar -C "$1" -xf -`, dir, dst)
		if out, err := tar.CombinedOutput(); err != nil {
			b.Fatalf("tar: %v %s", err, out)
		}
		base += time.Since(t1)

		b.StopTimer()
		end()
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(imp.Seconds()/n, "import-s")
	b.ReportMetric(base.Seconds()/n, "tar|tar-s")
	b.ReportMetric(imp.Seconds()/base.Seconds(), "ratio")
}

// BenchmarkWorkspaceExtract is the other half of the import alone: the
// extract helper unpacking the archive of the 10,000-file, 100 MB tree
// (Archive's stream, from a file) into a sandbox's workspace
// (PutArchive), beside GNU tar unpacking the same file into a tmpfs
// (tar -x), alternating; it reports both, their ratio, and the CPU
// of each (the helper's and tar's processes, from the kernel's
// accounting: the steadier figure on a shared host).
//
//	go test -run '^$' -bench WorkspaceExtract -benchtime 15x ./local/
func BenchmarkWorkspaceExtract(b *testing.B) {
	be := newBackend(b, 0)
	dir := benchTree(b, 10_000, 10_000)
	ctx := context.Background()
	tree, err := workspace.Scan(ctx, dir, workspace.ScanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	archive := filepath.Join(b.TempDir(), "tree.tar")
	f, err := os.Create(archive)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := tree.Archive(ctx, f, workspace.ArchiveOptions{}); err != nil {
		b.Fatal(err)
	}
	f.Close()
	var helper, tar, helperCPU, tarCPU time.Duration
	for b.Loop() {
		b.StopTimer()
		sb, dst, end := importRound(b, be)
		src, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		c0 := childrenCPU()
		t0 := time.Now()
		got, err := sb.(sandbox.Archiver).PutArchive(ctx, src)
		if err != nil || got.Files != 10_000 {
			b.Fatalf("PutArchive: %+v %v", got, err)
		}
		helper += time.Since(t0)
		c1 := childrenCPU()
		helperCPU += c1 - c0
		t1 := time.Now()
		if out, err := exec.Command("tar", "-C", dst, "-xf", archive).CombinedOutput(); err != nil {
			b.Fatalf("tar: %v %s", err, out)
		}
		tar += time.Since(t1)
		tarCPU += childrenCPU() - c1

		b.StopTimer()
		src.Close()
		end()
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(helper.Seconds()*1000/n, "helper-ms")
	b.ReportMetric(tar.Seconds()*1000/n, "tar-x-ms")
	b.ReportMetric(helper.Seconds()/tar.Seconds(), "ratio")
	b.ReportMetric(helperCPU.Seconds()*1000/n, "helper-cpu-ms")
	b.ReportMetric(tarCPU.Seconds()*1000/n, "tar-x-cpu-ms")
	b.ReportMetric(helperCPU.Seconds()/tarCPU.Seconds(), "cpu-ratio")
}

// importRound makes what a round of BenchmarkWorkspaceImport and
// BenchmarkWorkspaceExtract imports into, outside their timers: a sandbox,
// and a tmpfs (dst) for their tar baseline; end unmounts and destroys
// them (outside the timer too).
func importRound(b *testing.B, be *Backend) (sb sandbox.Instance, dst string, end func()) {
	b.Helper()
	ctx := context.Background()
	sb, err := be.Create(ctx, sandbox.Spec{CPU: 2, MemoryBytes: 1 << 30, DiskBytes: 512 << 20})
	if err != nil {
		b.Fatal(err)
	}
	dst = filepath.Join(b.TempDir(), "tmpfs")
	os.Mkdir(dst, 0o755)
	if err := exec.Command("mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", dst).Run(); err != nil {
		sb.Destroy(ctx)
		b.Fatal(err)
	}
	return sb, dst, func() {
		exec.Command("umount", dst).Run()
		sb.Destroy(ctx)
	}
}

// childrenCPU is the CPU time (user and system) of this process's
// children that have been waited for.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWorkspaceChanges is the engine's reading of a job's changes
// from a local sandbox whose imported 10,000-file, 100 MB tree has 10
// files modified: DirChanges, the old side read from the source
// (ReadOld) and the JSON the store keeps; and the baseline, a walk that
// stats every file of the workspace (what any comparison must do).
//
//	go test -run '^$' -bench WorkspaceChanges -benchtime 5x ./local/
func BenchmarkWorkspaceChanges(b *testing.B) {
	be := newBackend(b, 0)
	src := benchTree(b, 10_000, 10_000)
	ctx := context.Background()
	sb, err := be.Create(ctx, sandbox.Spec{CPU: 2, MemoryBytes: 1 << 30, DiskBytes: 512 << 20})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sb.Destroy(ctx) })
	tree, err := workspace.Scan(ctx, src, workspace.ScanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	pr, pw := io.Pipe()
	var baseline *workspace.Baseline
	go func() {
		var err error
		baseline, err = tree.Archive(ctx, pw, workspace.ArchiveOptions{})
		pw.CloseWithError(err)
	}()
	if _, err := sb.(sandbox.Archiver).PutArchive(ctx, pr); err != nil {
		b.Fatal(err)
	}
	for i := range 10 {
		p := fmt.Sprintf("/workspace/d%03d/f%04d.txt", i*10, i*1000)
		if err := sb.WriteFile(ctx, p, []byte("changed\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	dir := sb.(sandbox.HostWorkspace).WorkspaceDir()
	var changes, walk time.Duration
	for b.Loop() {
		t0 := time.Now()
		cs, err := workspace.DirChanges(ctx, baseline, dir, workspace.ChangesOptions{})
		if err != nil || len(cs.Changes) != 10 {
			b.Fatalf("DirChanges: %d changes, %v", len(cs.Changes), err)
		}
		if err := cs.ReadOld(ctx, src, ""); err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(cs); err != nil {
			b.Fatal(err)
		}
		changes += time.Since(t0)
		t1 := time.Now()
		n := 0
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil {
				if _, err := d.Info(); err == nil {
					n++
				}
			}
			return nil
		})
		walk += time.Since(t1)
		if n < 10_000 {
			b.Fatalf("walked %d entries", n)
		}
	}
	n := float64(b.N)
	b.ReportMetric(changes.Seconds()*1000/n, "changes-ms")
	b.ReportMetric(walk.Seconds()*1000/n, "walk-ms")
	b.ReportMetric(changes.Seconds()/walk.Seconds(), "ratio")
}
