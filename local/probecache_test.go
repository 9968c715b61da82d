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
// a changed helper binary is probed again. The helper here is a script
// that fails the probe, so New fails exactly when it probes.
func TestProbeRecorded(t *testing.T) {
	canRun(t)
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A passing probe is recorded.
	if _, err := New(Config{Dir: dir, SelfExe: self}); err != nil {
		t.Fatalf("New: %v", err)
	}
	rec, err := os.ReadFile(filepath.Join(dir, fileProbed))
	if err != nil {
		t.Fatalf("no record of the probe: %v", err)
	}
	if !strings.Contains(string(rec), "exe="+self+" ") || !strings.Contains(string(rec), "boot=") {
		t.Fatalf("the record's key names neither the binary nor the boot:\n%s", rec)
	}

	// A helper that fails the probe.
	bad := filepath.Join(t.TempDir(), "helper")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho no; exit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bdir := t.TempDir()
	if _, err := New(Config{Dir: bdir, SelfExe: bad}); err == nil || !strings.Contains(err.Error(), "the sandbox probe") {
		t.Fatalf("New with a failing helper: %v, want the probe's failure", err)
	}
	if _, err := os.Stat(filepath.Join(bdir, fileProbed)); !os.IsNotExist(err) {
		t.Fatalf("a failed probe was recorded: %v", err)
	}
	// Its key recorded as passed: New believes the record...
	uids, err := parseUIDRange(DefaultUIDs)
	if err != nil {
		t.Fatal(err)
	}
	key, err := probeKey(bad, uids)
	if err != nil {
		t.Fatal(err)
	}
	if err := recordProbe(bdir, key); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: bdir, SelfExe: bad}); err != nil {
		t.Fatalf("New with the probe recorded under its key: %v", err)
	}
	// ... until the binary changes (its change time, here): then it probes.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(bad, later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: bdir, SelfExe: bad}); err == nil || !strings.Contains(err.Error(), "the sandbox probe") {
		t.Fatalf("New after the helper changed: %v, want the probe's failure", err)
	}
	// A record of another key (another boot, say) is not believed.
	if err := recordProbe(bdir, strings.Replace(key, "boot=", "boot=x", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: bdir, SelfExe: bad}); err == nil {
		t.Fatal("New believed a record of another boot")
	}
}
