//go:build linux

package local

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// memoryCharged reads what a sandbox's memory cgroup holds now.
func memoryCharged(t *testing.T, c cgroupSet) int64 {
	t.Helper()
	name := "memory.usage_in_bytes"
	if c.Version == 2 {
		name = "memory.current"
	}
	data, err := os.ReadFile(filepath.Join(c.Memory, name))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPutArchiveChargesTheJob: the workspace's pages (a tmpfs) that
// PutArchive writes count against the job's memory limit, not the
// server's: the helper that writes them is in the sandbox's cgroups.
func TestPutArchiveChargesTheJob(t *testing.T) {
	b := newBackend(t, 0)
	ctx := context.Background()
	inst, err := b.Create(ctx, sandbox.Spec{JobID: "job-charge", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(ctx, inst.ID()) })
	st, err := b.state(inst.(*sbox).dir, inst.ID())
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 16<<20)
	rand.Read(data)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "big.bin", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
	tw.Write(data)
	tw.Close()
	before := memoryCharged(t, st.Cgroup)
	got, err := inst.(sandbox.Archiver).PutArchive(ctx, &buf)
	if err != nil || got.Bytes != int64(len(data)) {
		t.Fatalf("PutArchive: %+v %v", got, err)
	}
	after := memoryCharged(t, st.Cgroup)
	if after-before < int64(len(data)) {
		t.Errorf("the job's memory cgroup grew by %d bytes for a %d-byte workspace: the copy was charged elsewhere", after-before, len(data))
	}
	if procs, _ := st.Cgroup.procs(); len(procs) != 0 {
		t.Errorf("the helper is still in the sandbox's groups: %v", procs)
	}
}
