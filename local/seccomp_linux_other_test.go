//go:build linux && !amd64

package local

import "testing"

func TestSeccompUnsupported(t *testing.T) {
	if err := seccompSupported(); err == nil {
		t.Fatal("seccompSupported is nil on a non-amd64 build")
	}
}
