//go:build linux

package local

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
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

// TestPutArchiveOutlivesThreads: the extract helper's parent-death signal
// fires when the thread that forked it ends, and the server ends threads
// (a goroutine that made a network namespace exits locked to its thread):
// an extraction under way must survive other goroutines' threads ending.
// A workspace copy under load failed "the helper failed (signal: killed)".
func TestPutArchiveOutlivesThreads(t *testing.T) {
	b := newBackend(t, 0)
	ctx := context.Background()
	inst, err := b.Create(ctx, sandbox.Spec{JobID: "job-threads", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(ctx, inst.ID()) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi\n"))
	tw.Close()
	// The archive arrives while threads end: each goroutine below takes a
	// thread (it may be the one that forked the helper) and ends it.
	r, w := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 400 {
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					runtime.LockOSThread() // never unlocked: the thread ends
				}()
			}
			wg.Wait()
		}
	}()
	go func() {
		<-done
		w.Write(buf.Bytes())
		w.Close()
	}()
	got, err := inst.(sandbox.Archiver).PutArchive(ctx, r)
	if err != nil || got.Files != 1 {
		t.Fatalf("PutArchive while threads end: %+v %v", got, err)
	}
}
