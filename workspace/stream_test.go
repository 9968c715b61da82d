package workspace

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestStream: a tree's Stream is its Archive, written straight into a
// writer (WriteTo, io.Copy's choice) or read through a pipe (Read), with
// the same baseline; one whose reader stops early ends its archive with
// an error, and one never read says so.
func TestStream(t *testing.T) {
	repo := newRepo(t, map[string]string{"a.txt": "one\n", "d/b.txt": "two\n"})
	tr, err := Scan(context.Background(), repo, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	wantBase, err := tr.Archive(context.Background(), &want, ArchiveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, read := range map[string]func(s *Stream) ([]byte, error){
		"WriteTo": func(s *Stream) ([]byte, error) {
			var b bytes.Buffer
			_, err := io.Copy(&b, s) // a bytes.Buffer reads from, but WriterTo comes first
			return b.Bytes(), err
		},
		"Read": func(s *Stream) ([]byte, error) { return io.ReadAll(iotest.OneByteReader(s)) },
	} {
		t.Run(name, func(t *testing.T) {
			s := tr.Stream(context.Background(), ArchiveOptions{})
			got, err := read(s)
			s.Close()
			base, aerr := s.Result()
			if err != nil || aerr != nil {
				t.Fatalf("read: %v, archive: %v", err, aerr)
			}
			if !bytes.Equal(got, want.Bytes()) {
				t.Errorf("%d bytes, Archive wrote %d", len(got), want.Len())
			}
			if len(base.Files) != len(wantBase.Files) || base.Files[0] != wantBase.Files[0] {
				t.Errorf("baseline %+v, want %+v", base.Files, wantBase.Files)
			}
		})
	}
	t.Run("stopped", func(t *testing.T) {
		s := tr.Stream(context.Background(), ArchiveOptions{})
		if _, err := s.Read(make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if _, err := s.Result(); err == nil {
			t.Error("an archive whose reader stopped early ended without an error")
		}
	})
	t.Run("never read", func(t *testing.T) {
		s := tr.Stream(context.Background(), ArchiveOptions{})
		s.Close()
		if _, err := s.Result(); !errors.Is(err, errNotRead) {
			t.Errorf("Result of a stream never read: %v", err)
		}
	})
}
