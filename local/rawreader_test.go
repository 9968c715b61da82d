//go:build linux

package local

import (
	"bytes"
	"io"
	"math/rand"
	"os"
	"testing"
)

// TestRawReader: the extract helper's stdin reader gives a pipe's bytes
// as they were written, in pieces of any size, then io.EOF when the
// writer closes; an empty read reads nothing.
func TestRawReader(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	want := make([]byte, 3<<20)
	rand.New(rand.NewSource(1)).Read(want)
	go func() {
		rng := rand.New(rand.NewSource(2))
		for rest := want; len(rest) > 0; {
			n := min(len(rest), 1+rng.Intn(200<<10))
			pw.Write(rest[:n])
			rest = rest[n:]
		}
		pw.Close()
	}()
	r := rawReader(pr.Fd())
	if n, err := r.Read(nil); n != 0 || err != nil {
		t.Fatalf("an empty read: %d, %v", n, err)
	}
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want the %d written", len(got), err, len(want))
	}
}
