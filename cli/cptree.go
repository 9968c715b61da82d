package cli

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/delegate-dev/delegate"
)

// cp -r: a directory's tree into or out of a kept sandbox, as a tar
// stream (delegate.SandboxArchives). As cp -r does, a destination that is
// a directory already receives the tree under the source's base name.
// Links come in as links; on the way out a link is refused, as jobs apply
// refuses one, and nothing is written: the tree is written into a new
// directory beside the destination, renamed into place once all of it is
// read.

// treeCount is what a copy of a tree wrote.
type treeCount struct {
	files, dirs int
	bytes       int64
}

func (c treeCount) String() string {
	return fmt.Sprintf("%d files, %d directories, %d bytes", c.files, c.dirs, c.bytes)
}

// archivesOf is svc's tree copies, or why there are none.
func archivesOf(svc delegate.SandboxService) (delegate.SandboxArchives, error) {
	ar, ok := svc.(delegate.SandboxArchives)
	if !ok {
		return nil, errors.New("this delegate cannot copy a directory's tree (cp -r): copy its files one by one")
	}
	return ar, nil
}

// workspaceRel is a sandbox path as a name relative to /workspace ("" for
// /workspace itself).
func workspaceRel(p string) (string, error) {
	abs, err := delegate.WorkspacePath(p)
	if err != nil {
		return "", usagef("ID:PATH: %v", err)
	}
	if abs == delegate.Workspace {
		return "", nil
	}
	return strings.TrimPrefix(abs, delegate.Workspace+"/"), nil
}

// copyTreeIn copies the local directory local into sandbox id at dst.
func (p *Program) copyTreeIn(ctx context.Context, cfg Config, local string, dst cpOperand) error {
	fi, err := os.Stat(local)
	if err != nil {
		return usageError{err}
	}
	if !fi.IsDir() {
		return usagef("%s: not a directory (cp -r copies a directory's tree; cp copies a file)", local)
	}
	abs, err := filepath.Abs(local)
	if err != nil {
		return usageError{err}
	}
	rel, err := workspaceRel(dst.path)
	if err != nil {
		return err
	}
	return p.withSandboxes(ctx, cfg, true, func(svc delegate.SandboxService) error {
		ar, err := archivesOf(svc)
		if err != nil {
			return err
		}
		if rel == "" {
			rel = filepath.Base(abs)
		} else if _, err := svc.ListSandboxFiles(ctx, dst.sandbox, delegate.FileListOptions{Path: rel, Depth: 1, Limit: 1}); err == nil {
			rel = path.Join(rel, filepath.Base(abs)) // a directory there: the tree goes in it
		}
		pr, pw := io.Pipe()
		var (
			wg   sync.WaitGroup
			n    treeCount
			werr error
		)
		wg.Go(func() {
			werr = writeTree(pw, abs, rel, &n)
			pw.CloseWithError(werr)
		})
		err = ar.PutSandboxArchive(ctx, dst.sandbox, pr)
		pr.CloseWithError(errors.New("the sandbox stopped reading"))
		wg.Wait()
		if werr != nil {
			return fmt.Errorf("%s: %w", local, werr)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(p.Stderr, "%s:%s: %s\n", dst.sandbox, safe(rel), n)
		return nil
	})
}

// writeTree writes the tree at root as a tar stream, its names under rel.
func writeTree(w io.Writer, root, rel string, n *treeCount) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		sub, _ := filepath.Rel(root, p)
		name := path.Join(rel, filepath.ToSlash(sub))
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil // a special file: nothing to copy
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = name, "", "", 0, 0
		hdr.Mode &= 0o777
		if fi.IsDir() {
			hdr.Name += "/"
			n.dirs++
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			if link != "" {
				n.files++
			}
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		m, err := io.CopyN(tw, f, hdr.Size)
		n.files, n.bytes = n.files+1, n.bytes+m
		if err != nil {
			return fmt.Errorf("%s: %w (did it change while it was copied?)", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// copyTreeOut copies the tree at src in its sandbox to the local dst.
func (p *Program) copyTreeOut(ctx context.Context, cfg Config, src cpOperand, dst string) error {
	rel, err := workspaceRel(src.path)
	if err != nil {
		return err
	}
	target := dst
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		base := path.Base(rel)
		if rel == "" {
			base = "workspace"
		}
		target = filepath.Join(dst, base)
	}
	if _, err := os.Lstat(target); err == nil {
		return usagef("%s: already there (cp -r writes a new directory)", target)
	}
	if fi, err := os.Stat(filepath.Dir(target)); err != nil || !fi.IsDir() {
		return usagef("%s: no such directory to copy into", filepath.Dir(target))
	}
	return p.withSandboxes(ctx, cfg, true, func(svc delegate.SandboxService) error {
		ar, err := archivesOf(svc)
		if err != nil {
			return err
		}
		// Only that directory's tree, where the backend packs one.
		rc, err := ar.GetSandboxArchive(ctx, src.sandbox, rel)
		var nf *delegate.NotFoundError
		if errors.As(err, &nf) && nf.Resource == "file" {
			return fmt.Errorf("%s:%s: no such directory in the sandbox's workspace", src.sandbox, safe(src.path))
		}
		if err != nil {
			return err
		}
		defer rc.Close()
		tmp, err := os.MkdirTemp(filepath.Dir(target), ".delegate-cp-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		n, err := readTree(rc, rel, tmp)
		if err != nil {
			return err
		}
		if n.files+n.dirs == 0 {
			return fmt.Errorf("%s:%s: no such directory in the sandbox's workspace", src.sandbox, safe(src.path))
		}
		if err := os.Rename(tmp, target); err != nil {
			return err
		}
		fmt.Fprintf(p.Stderr, "%s: %s\n", target, n)
		return nil
	})
}

// readTree writes the entries of a workspace's tar stream (gzip or not)
// under rel into dir: regular files and directories, with their
// permissions (no setuid, setgid or sticky bit) and times; a symbolic
// link is refused, as jobs apply refuses one.
func readTree(r io.Reader, rel, dir string) (treeCount, error) {
	var n treeCount
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return n, err
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	tr := tar.NewReader(r)
	type dirTime struct {
		path string
		hdr  *tar.Header
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, fmt.Errorf("the sandbox's archive: %w", err)
		}
		name := strings.TrimPrefix(path.Clean(strings.TrimPrefix(hdr.Name, "./")), "/")
		sub := name
		if rel != "" {
			var ok bool
			if sub, ok = strings.CutPrefix(name, rel+"/"); !ok && name != rel {
				continue
			}
			if name == rel {
				sub = "."
			}
		}
		if !filepath.IsLocal(sub) && sub != "." {
			return n, fmt.Errorf("the sandbox's archive names %q, outside the tree", hdr.Name)
		}
		local := filepath.Join(dir, filepath.FromSlash(sub))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(local, 0o700); err != nil {
				return n, err
			}
			dirs = append(dirs, dirTime{local, hdr})
			n.dirs++
		case tar.TypeReg, tar.TypeRegA:
			if sub == "." {
				return n, fmt.Errorf("%s: a file, not a directory (cp without -r copies a file)", name)
			}
			if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
				return n, err
			}
			f, err := os.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fs.FileMode(hdr.Mode)&0o777)
			if err != nil {
				return n, err
			}
			m, err := io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return n, err
			}
			os.Chtimes(local, hdr.ModTime, hdr.ModTime)
			n.files, n.bytes = n.files+1, n.bytes+m
		case tar.TypeSymlink:
			return n, fmt.Errorf("%s: a symbolic link (to %s): cp -r does not write links out, as jobs apply does not; "+
				"remove it in the sandbox, or copy the files beside it one by one", name, hdr.Linkname)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		os.Chmod(d.path, fs.FileMode(d.hdr.Mode)&0o777)
		os.Chtimes(d.path, d.hdr.ModTime, d.hdr.ModTime)
	}
	return n, nil
}
