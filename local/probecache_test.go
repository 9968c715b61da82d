//go:build linux

package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProbeRecorded: New probes the helpers once, records it under the key
// of what the result depends on, and skips the probe while the key holds;
// a changed helper binary is probed again, and a record of another key
// (another boot) is not believed. The helper here is a script that fails
// the probe, so New fails exactly when it probes. Nothing of it is in
// the backend's directory.
func TestProbeRecorded(t *testing.T) {
	canRun(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	uids, err := parseUIDRange(DefaultUIDs)
	if err != nil {
		t.Fatal(err)
	}
	// A passing probe is recorded.
	dir := t.TempDir()
	if _, err := New(Config{Dir: dir, SelfExe: self}); err != nil {
		t.Fatalf("New: %v", err)
	}
	key, err := probeKey(self, uids)
	if err != nil {
		t.Fatal(err)
	}
	if !probedBefore(probeRecordDir, key) {
		t.Fatal("no record of the probe that passed")
	}
	if !strings.Contains(key, "exe="+self+" ") || !strings.Contains(key, "boot=") {
		t.Fatalf("the record's key names neither the binary nor the boot:\n%s", key)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("in the backend's directory: %v", ents)
	}

	// A helper that fails the probe.
	bad := filepath.Join(t.TempDir(), "helper")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho no; exit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	badKey := func() string {
		k, err := probeKey(bad, uids)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(probeRecord(probeRecordDir, k)) })
		return k
	}
	bdir := t.TempDir()
	if _, err := New(Config{Dir: bdir, SelfExe: bad}); err == nil || !strings.Contains(err.Error(), "the sandbox probe") {
		t.Fatalf("New with a failing helper: %v, want the probe's failure", err)
	}
	key = badKey()
	if probedBefore(probeRecordDir, key) {
		t.Fatal("a failed probe was recorded")
	}
	// Its key recorded as passed: New believes the record...
	if err := recordProbe(probeRecordDir, key); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: bdir, SelfExe: bad}); err != nil {
		t.Fatalf("New with the probe recorded under its key: %v", err)
	}
	// ... until the binary changes (its times, here): then it probes.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(bad, later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: bdir, SelfExe: bad}); err == nil || !strings.Contains(err.Error(), "the sandbox probe") {
		t.Fatalf("New after the helper changed: %v, want the probe's failure", err)
	}
	// A record of another key (another boot, say) is not believed, even
	// under the file name of this one's.
	key = badKey()
	if err := os.WriteFile(probeRecord(probeRecordDir, key), []byte(strings.Replace(key, "boot=", "boot=x", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: bdir, SelfExe: bad}); err == nil {
		t.Fatal("New believed a record of another boot")
	}
}
