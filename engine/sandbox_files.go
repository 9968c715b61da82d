package engine

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// sandboxFiles is the part that serves the files of a kept sandbox's
// workspace (part of delegate.SandboxService): read, write, list, each on
// the machine the keeper finds (resumed if it was paused).
type sandboxFiles struct {
	keeper sandboxUser
}

// sandboxUser is what the files ask of the keeper: a live sandbox's
// machine, and what a failed call on it means.
type sandboxUser interface {
	instance(ctx context.Context, id string, command bool) (*delegate.Sandbox, sandbox.Instance, error)
	failed(ctx context.Context, sb *delegate.Sandbox, err error) bool
}

// ReadSandboxFile reads part of a file of a sandbox's workspace.
func (k *sandboxFiles) ReadSandboxFile(ctx context.Context, id, path string, offset, length int64) (*delegate.FileContent, error) {
	if offset < 0 {
		return nil, &delegate.FieldError{Field: "offset", Rule: fmt.Sprintf("must be 0 or more (got %d)", offset)}
	}
	if length <= 0 || length > delegate.MaxFileRead {
		return nil, &delegate.FieldError{Field: "length", Rule: fmt.Sprintf("must be between 1 and %d bytes (got %d): read a larger file in parts, from offset", delegate.MaxFileRead, length)}
	}
	p, err := workspacePath("path", path)
	if err != nil {
		return nil, err
	}
	sb, inst, err := k.keeper.instance(ctx, id, false)
	if err != nil {
		return nil, err
	}
	size := int64(-1)
	if infos, err := inst.ListFiles(ctx, sandbox.ListOptions{Dir: parentDir(p), Depth: 1}); err == nil {
		for _, f := range infos {
			if f.Path == p {
				size = f.Size
			}
		}
	}
	data, err := inst.ReadFile(ctx, p, offset, length)
	if err != nil {
		return nil, k.fileError(ctx, sb, "path", p, err)
	}
	fc := &delegate.FileContent{Data: data, Offset: offset, Size: size}
	fc.EOF = size >= 0 && offset+int64(len(data)) >= size
	if size < 0 {
		fc.EOF = int64(len(data)) < length
	}
	return fc, nil
}

// WriteSandboxFile writes a file of a sandbox's workspace.
func (k *sandboxFiles) WriteSandboxFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error {
	if int64(len(data)) > delegate.MaxFileBytesTotal {
		return &delegate.FieldError{Field: "content", Rule: fmt.Sprintf("must be at most %d MiB", delegate.MaxFileBytesTotal>>20)}
	}
	if mode&^fs.ModePerm != 0 {
		return &delegate.FieldError{Field: "mode", Rule: "must be permissions only, like 0644 or 0755"}
	}
	p, err := workspacePath("path", path)
	if err != nil {
		return err
	}
	sb, inst, err := k.keeper.instance(ctx, id, false)
	if err != nil {
		return err
	}
	if err := inst.WriteFile(ctx, p, data, mode); err != nil {
		return k.fileError(ctx, sb, "path", p, err)
	}
	return nil
}

// ListSandboxFiles lists a directory of a sandbox's workspace.
func (k *sandboxFiles) ListSandboxFiles(ctx context.Context, id string, opts delegate.FileListOptions) (*delegate.FileListing, error) {
	if opts.Depth < 0 || opts.Depth > delegate.MaxFileDepth {
		return nil, &delegate.FieldError{Field: "depth", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxFileDepth, opts.Depth)}
	}
	if opts.Limit < 0 || opts.Limit > delegate.MaxFileLimit {
		return nil, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxFileLimit, opts.Limit)}
	}
	dir := delegate.Workspace
	if opts.Path != "" && opts.Path != delegate.Workspace && opts.Path != "." {
		p, err := workspacePath("path", opts.Path)
		if err != nil {
			return nil, err
		}
		dir = p
	}
	depth, limit := max(opts.Depth, 1), opts.Limit
	if limit == 0 {
		limit = delegate.DefaultFileLimit
	}
	sb, inst, err := k.keeper.instance(ctx, id, false)
	if err != nil {
		return nil, err
	}
	infos, err := inst.ListFiles(ctx, sandbox.ListOptions{Dir: dir, Depth: depth, Limit: limit})
	out := &delegate.FileListing{Entries: []delegate.FileInfo{}, Truncated: errors.Is(err, sandbox.ErrTruncated)}
	if err != nil && !out.Truncated {
		return nil, k.fileError(ctx, sb, "path", dir, err)
	}
	for _, f := range infos {
		out.Entries = append(out.Entries, delegate.FileInfo{Path: f.Path, Type: delegate.FileType(f.Mode), Size: f.Size,
			Mode: f.Mode, ModTime: f.ModTime.UTC().Truncate(time.Millisecond), Link: f.Link})
	}
	return out, nil
}

// workspacePath resolves a path of the workspace (relative to it, or
// absolute inside it), naming the field when it leaves it.
func workspacePath(field, p string) (string, error) {
	abs, err := delegate.WorkspacePath(p)
	if err != nil {
		return "", &delegate.FieldError{Field: field, Rule: err.Error()}
	}
	return abs, nil
}

func parentDir(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return delegate.Workspace
}

// fileError names the path of a file operation the backend refused: a
// missing file, a link out, not a regular file (the backend's words).
func (k *sandboxFiles) fileError(ctx context.Context, sb *delegate.Sandbox, field, p string, err error) error {
	if k.keeper.failed(ctx, sb, err) {
		return &endedError{fmt.Sprintf("sandbox %s is gone (its machine is): open a new one", sb.ID)}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return &delegate.NotFoundError{Resource: "file", ID: p, Of: "the sandbox"}
	}
	return &delegate.FieldError{Field: field, Rule: err.Error()}
}

// PutSandboxArchive implements delegate.SandboxArchives: a tar stream
// unpacked into the sandbox's workspace, by the backend's rules
// (sandbox.Archiver: names relative and clean, nothing through a link).
func (k *sandboxFiles) PutSandboxArchive(ctx context.Context, id string, tar io.Reader) error {
	sb, ar, err := k.archiver(ctx, id)
	if err != nil {
		return err
	}
	if _, err := ar.PutArchive(ctx, tar); err != nil {
		return k.fileError(ctx, sb, "path", delegate.Workspace, err)
	}
	return nil
}

// GetSandboxArchive implements delegate.SandboxArchives: the sandbox's
// workspace as a tar stream, or only the directory dir's where the
// backend packs one (sandbox.DirArchiver), its names then made relative
// to /workspace again.
func (k *sandboxFiles) GetSandboxArchive(ctx context.Context, id, dir string) (io.ReadCloser, error) {
	sb, ar, err := k.archiver(ctx, id)
	if err != nil {
		return nil, err
	}
	if dir != "" && dir != "." {
		if !fs.ValidPath(dir) {
			return nil, &delegate.FieldError{Field: "path", Rule: fmt.Sprintf("%q must be a clean path relative to %s", dir, delegate.Workspace)}
		}
		if da, ok := ar.(sandbox.DirArchiver); ok {
			rc, err := da.GetDirArchive(ctx, dir)
			if err != nil {
				return nil, k.fileError(ctx, sb, "path", path.Join(delegate.Workspace, dir), err)
			}
			return prefixed(rc, dir), nil
		}
	}
	rc, err := ar.GetArchive(ctx)
	if err != nil {
		return nil, k.fileError(ctx, sb, "path", delegate.Workspace, err)
	}
	return rc, nil
}

// prefixed is the tar stream rc (gzip or not) with dir put before each
// name: a directory's tree as a part of the workspace's.
func prefixed(rc io.ReadCloser, dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(func() error {
			br := bufio.NewReader(rc)
			var r io.Reader = br
			if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
				zr, err := gzip.NewReader(br)
				if err != nil {
					return err
				}
				r = zr
			}
			tr, tw := tar.NewReader(r), tar.NewWriter(pw)
			for {
				hdr, err := tr.Next()
				if err == io.EOF {
					return tw.Close()
				}
				if err != nil {
					return err
				}
				name := path.Join(dir, hdr.Name)
				if hdr.Typeflag == tar.TypeDir {
					name += "/"
				}
				hdr.Name = name
				if err := tw.WriteHeader(hdr); err != nil {
					return err
				}
				if _, err := io.Copy(tw, tr); err != nil {
					return err
				}
			}
		}())
	}()
	return &prefixReader{PipeReader: pr, src: rc}
}

// prefixReader closes the stream it rewrites with itself.
type prefixReader struct {
	*io.PipeReader
	src io.Closer
}

func (p *prefixReader) Close() error {
	p.PipeReader.Close()
	return p.src.Close()
}

// archiver is a live kept sandbox's machine, as one that copies trees.
func (k *sandboxFiles) archiver(ctx context.Context, id string) (*delegate.Sandbox, sandbox.Archiver, error) {
	sb, inst, err := k.keeper.instance(ctx, id, false)
	if err != nil {
		return nil, nil, err
	}
	ar, ok := inst.(sandbox.Archiver)
	if !ok {
		return nil, nil, fmt.Errorf("sandbox %s: its backend (%s) cannot copy a directory's tree: copy its files one by one", id, sb.Backend)
	}
	return sb, ar, nil
}
