package sandboxtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// tarEntry is one entry of an archive a test builds.
type tarEntry struct {
	name string
	typ  byte
	mode int64
	body string // a file's content, a link's target
}

// mtime is every entry's modification time: nanoseconds included, which
// the changes of a workspace rely on.
var mtime = time.Unix(1700000000, 123456789)

func makeTar(t *testing.T, gz bool, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var z *gzip.Writer
	if gz {
		z = gzip.NewWriter(&buf)
		w = z
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, ModTime: mtime, Format: tar.FormatPAX}
		switch e.typ {
		case tar.TypeReg:
			hdr.Size = int64(len(e.body))
		case tar.TypeSymlink, tar.TypeLink:
			hdr.Linkname = e.body
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			io.WriteString(tw, e.body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if z != nil {
		z.Close()
	}
	return buf.Bytes()
}

// readTar reads an archive GetArchive returned, by clean name.
func readTar(t *testing.T, r io.Reader) map[string]tarEntry {
	t.Helper()
	got := map[string]tarEntry{}
	mtimes := map[string]time.Time{}
	_, err := sandbox.ReadArchive(context.Background(), r, func(e sandbox.ArchiveEntry) error {
		te := tarEntry{name: e.Name, typ: e.Header.Typeflag, mode: e.Header.Mode & 0o7777}
		switch e.Header.Typeflag {
		case tar.TypeSymlink:
			te.body = e.Header.Linkname
		case tar.TypeReg, tar.TypeRegA:
			te.typ = tar.TypeReg
			data, err := io.ReadAll(e.Body)
			if err != nil {
				return err
			}
			te.body = string(data)
		}
		got[e.Name] = te
		mtimes[e.Name] = e.Header.ModTime
		return nil
	})
	if err != nil {
		t.Fatalf("GetArchive's stream: %v", err)
	}
	for name, mt := range mtimes {
		if name == "run.sh" && !mt.Equal(mtime) {
			t.Errorf("run.sh came back with mtime %v, want %v (to the nanosecond)", mt, mtime)
		}
	}
	return got
}

// archive: a project goes in through PutArchive (gzip or not) with its
// modes, links and nanosecond times, as the job's user, special files and
// hard links skipped; it comes back through GetArchive as the job left
// it; and archives that break the rules are refused, nothing written
// through a link.
func (s *suite) archive(t *testing.T) {
	ctx := context.Background()
	sb := s.create(t, "job-archive")
	a, ok := sb.(sandbox.Archiver)
	if !ok {
		t.Skip("the backend's instances are not Archivers")
	}
	project := makeTar(t, true,
		tarEntry{"src/", tar.TypeDir, 0o755, ""},
		tarEntry{"src/main.go", tar.TypeReg, 0o644, "package main\n"},
		tarEntry{"./run.sh", tar.TypeReg, 0o755, "#!/bin/sh\necho hi\n"},
		tarEntry{"link", tar.TypeSymlink, 0o777, "src/main.go"},
		tarEntry{"fifo", tar.TypeFifo, 0o644, ""},
		tarEntry{"hard", tar.TypeLink, 0o644, "run.sh"},
		tarEntry{".git/HEAD", tar.TypeReg, 0o644, "ref: refs/heads/main\n"},
	)
	got, err := a.PutArchive(ctx, bytes.NewReader(project))
	if err != nil {
		t.Fatalf("PutArchive: %v", err)
	}
	if got.Files != 4 || got.Dirs != 1 || got.Bytes != int64(len("package main\n#!/bin/sh\necho hi\nref: refs/heads/main\n")) || len(got.Skipped) != 2 {
		t.Errorf("PutArchive says %+v; want 4 files (a link among them), 1 directory, the bytes of 3 files, 2 skipped", got)
	}
	// More can come in a second archive, plain this time.
	if _, err := a.PutArchive(ctx, bytes.NewReader(makeTar(t, false, tarEntry{"src/util.go", tar.TypeReg, 0o600, "package main // util\n"}))); err != nil {
		t.Fatalf("PutArchive of a plain tar: %v", err)
	}
	files, err := sb.ListFiles(ctx, sandbox.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]sandbox.FileInfo{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	for p, want := range map[string]string{"/workspace/src/main.go": "-rw-r--r--", "/workspace/run.sh": "-rwxr-xr-x",
		"/workspace/src/util.go": "-rw-------", "/workspace/src": "drwxr-xr-x", "/workspace/.git/HEAD": "-rw-r--r--"} {
		if f, ok := byPath[p]; !ok || f.Mode.String() != want {
			t.Errorf("%s is listed as %v (present %v), want %s", p, f.Mode, ok, want)
		}
	}
	if f := byPath["/workspace/link"]; f.Mode&fs.ModeSymlink == 0 || f.Link != "src/main.go" {
		t.Errorf("link is listed as %+v, want a link to src/main.go", f)
	}
	for _, p := range []string{"/workspace/fifo", "/workspace/hard"} {
		if _, ok := byPath[p]; ok {
			t.Errorf("%s was written; special files and hard links are skipped", p)
		}
	}
	if s.h.Commands {
		// The job's user owns what came in, and may change it.
		p, exit := s.run(t, sb, sandbox.Command{Args: sh(`cat src/main.go && echo more >>src/main.go && ln run.sh hard2 && rm src/util.go &&
			[ "$(id -u)" = "$(stat -c %u run.sh)" ] && [ "$(id -u)" = "$(stat -c %u src)" ] && echo owner-ok`)})
		out, errs := output(t, p)
		if exit.Code != 0 || out != "package main\nowner-ok\n" {
			t.Errorf("a command in the workspace: exit %d, stdout %q, stderr %q", exit.Code, out, errs)
		}
	}
	rc, err := a.GetArchive(ctx)
	if err != nil {
		t.Fatalf("GetArchive: %v", err)
	}
	back := readTar(t, rc)
	rc.Close()
	if s.h.Hidden != "" {
		for name := range back {
			if h := strings.TrimPrefix(s.h.Hidden, "/workspace/"); name == h || strings.HasPrefix(name, h+"/") {
				delete(back, name)
			}
		}
	}
	want := map[string]tarEntry{
		"src":         {"src", tar.TypeDir, 0o755, ""},
		"src/main.go": {"src/main.go", tar.TypeReg, 0o644, "package main\n"},
		"src/util.go": {"src/util.go", tar.TypeReg, 0o600, "package main // util\n"},
		"run.sh":      {"run.sh", tar.TypeReg, 0o755, "#!/bin/sh\necho hi\n"},
		"link":        {"link", tar.TypeSymlink, 0o777, "src/main.go"},
		".git":        {".git", tar.TypeDir, 0o755, ""},
		".git/HEAD":   {".git/HEAD", tar.TypeReg, 0o644, "ref: refs/heads/main\n"},
	}
	if s.h.Commands {
		want["src/main.go"] = tarEntry{"src/main.go", tar.TypeReg, 0o644, "package main\nmore\n"}
		want["hard2"] = tarEntry{"hard2", tar.TypeReg, 0o755, "#!/bin/sh\necho hi\n"}
		delete(want, "src/util.go")
	}
	for name, w := range want {
		g, ok := back[name]
		if name == ".git" && ok {
			g.mode = w.mode // made implicitly: its mode is the backend's
		}
		if name == "link" {
			g.mode = w.mode // a link's mode is the system's
		}
		if !ok || g != w {
			t.Errorf("GetArchive: %s is %+v (present %v), want %+v", name, g, ok, w)
		}
	}
	var extra []string
	for name := range back {
		if _, ok := want[name]; !ok {
			extra = append(extra, name)
		}
	}
	if slices.Sort(extra); len(extra) > 0 {
		t.Errorf("GetArchive has entries that are not in the workspace: %v", extra)
	}

	for _, tc := range []struct {
		name    string
		entries []tarEntry
	}{
		{"climbs out", []tarEntry{{"../escape", tar.TypeReg, 0o644, "x"}}},
		{"absolute", []tarEntry{{"/etc/escape", tar.TypeReg, 0o644, "x"}}},
		{"not clean", []tarEntry{{"a//b/../c", tar.TypeReg, 0o644, "x"}}},
		{"through a link", []tarEntry{{"out", tar.TypeSymlink, 0o777, "/tmp"}, {"out/pwned", tar.TypeReg, 0o644, "x"}}},
		{"under a file", []tarEntry{{"f", tar.TypeReg, 0o644, "x"}, {"f/g", tar.TypeReg, 0o644, "x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fresh := s.create(t, "job-archive-bad")
			_, err := fresh.(sandbox.Archiver).PutArchive(ctx, bytes.NewReader(makeTar(t, false, tc.entries...)))
			if !errors.Is(err, sandbox.ErrBadArchive) {
				t.Fatalf("PutArchive: %v, want ErrBadArchive", err)
			}
			// The entry, or the part of its path in the way.
			if name := tc.entries[len(tc.entries)-1].name; !strings.Contains(err.Error(), name) && !strings.Contains(err.Error(), path.Dir(name)+":") {
				t.Errorf("the error %q names neither the entry nor what is in its way", err)
			}
			if s.h.Commands {
				p, exit := s.run(t, fresh, sandbox.Command{Args: sh(`test ! -e /tmp/pwned && test ! -e /workspace/out/pwned`)})
				if exit.Code != 0 {
					out, errs := output(t, p)
					t.Errorf("something was written through the link: %q %q", out, errs)
				}
			}
		})
	}
}
