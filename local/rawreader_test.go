//go:build linux

package local

import (
	"bytes"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"testing"
)

// TestRawReader: the extract helper's stdin reader gives a pipe's bytes
// as they were written, in pieces of any size, then io.EOF when the
// writer closes; an empty read reads nothing. The writer is another
// process, as the extract helper's is (the server): one in this process
// could be stopped by a garbage collection while the reader waits in a
// read the runtime does not see, and the collection waits for it (it hung
// in the first of 200 runs so).
func TestRawReader(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	writer := exec.Command(os.Args[0])
	writer.Env = append(os.Environ(), testHelperEnv+"=pieces")
	writer.Stdout = pw
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	defer writer.Wait()
	r := rawReader(pr.Fd())
	if n, err := r.Read(nil); n != 0 || err != nil {
		t.Fatalf("an empty read: %d, %v", n, err)
	}
	got, err := io.ReadAll(r)
	var want bytes.Buffer
	writePieces(&want)
	if err != nil || !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("read %d bytes (%v), want the %d written", len(got), err, want.Len())
	}
}

// writePieces writes 3 MiB of random bytes to w in pieces of random
// sizes, the same each time (the helper "pieces").
func writePieces(w io.Writer) error {
	data := make([]byte, 3<<20)
	rand.New(rand.NewSource(1)).Read(data)
	rng := rand.New(rand.NewSource(2))
	for rest := data; len(rest) > 0; {
		n := min(len(rest), 1+rng.Intn(200<<10))
		if _, err := w.Write(rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}
