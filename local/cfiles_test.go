package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCFilesByRole: the C helpers keep one file per role, each beside its
// Go twin of the same name (shim_linux.c and shim_linux.go, …), with
// what they share in helper_linux.h, which names every one of them; and
// none grows back into the one large file they were (issue 33).
func TestCFilesByRole(t *testing.T) {
	files, err := filepath.Glob("*.c")
	if err != nil || len(files) == 0 {
		t.Fatalf("no C files: %v", err)
	}
	header, err := os.ReadFile("helper_linux.h")
	if err != nil {
		t.Fatal(err)
	}
	const maxLines = 800
	for _, f := range files {
		twin := strings.TrimSuffix(f, ".c") + ".go"
		if f == "helper_linux.c" {
			twin = "reexec.go" // the dispatch, and small tools
		}
		if _, err := os.Stat(twin); err != nil {
			t.Errorf("%s has no Go twin %s", f, twin)
		}
		if !strings.Contains(string(header), f) {
			t.Errorf("helper_linux.h does not list %s", f)
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(data), "\n"); n > maxLines {
			t.Errorf("%s has %d lines, more than %d: split it by role", f, n, maxLines)
		}
		if !strings.HasPrefix(string(data), "//go:build linux && cgo\n") {
			t.Errorf("%s does not start with the build constraint of the C helpers (linux && cgo)", f)
		}
	}
}
