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
	spec := sandbox.Spec{CPU: 2, MemoryBytes: 1 << 30, DiskBytes: 512 << 20}
	var imp, base time.Duration
	for b.Loop() {
		b.StopTimer()
		sb, err := be.Create(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		dst := filepath.Join(b.TempDir(), "tmpfs")
		os.Mkdir(dst, 0o755)
		if err := exec.Command("mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", dst).Run(); err != nil {
			b.Fatal(err)
		}
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
		exec.Command("umount", dst).Run()
		sb.Destroy(ctx)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(imp.Seconds()/n, "import-s")
	b.ReportMetric(base.Seconds()/n, "tar|tar-s")
	b.ReportMetric(imp.Seconds()/base.Seconds(), "ratio")
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
