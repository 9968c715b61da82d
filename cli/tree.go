package cli

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/delegate-dev/delegate"
)

// treeFiles reads the directory dir as the manifest files that put its
// tree under remote in /workspace ("" or ".": /workspace itself). It is
// the one place where `--file DIR` becomes part of a job, so that it can
// become a workspace source (whose changes come back) in one change.
//
// It reads as the user who runs the command, who named the directory: no
// workspace roots apply. Symbolic links travel as links, never followed
// (a link to ~/.ssh stays a link, resolved inside the sandbox, where the
// host's files are not); a regular file keeps its execute bit, as git
// does (0755 or 0644). Empty directories, sockets, FIFOs and devices
// have no place in a manifest: skipped lists them.
func treeFiles(dir, remote string) (files []delegate.File, skipped []string, err error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, nil, err
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("%s: not a directory", dir)
	}
	var total int64
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		target := path.Join(remote, filepath.ToSlash(rel))
		switch t := d.Type(); {
		case t.IsDir():
			return nil
		case t&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			files = append(files, delegate.File{Path: target, Link: link})
		case t.IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			if total += info.Size(); total > delegate.MaxFileBytesTotal {
				return fmt.Errorf("more than the %d MiB of files a job takes", delegate.MaxFileBytesTotal>>20)
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			mode := ""
			if info.Mode().Perm()&0o111 != 0 {
				mode = "0755"
			}
			files = append(files, delegate.File{Path: target, Content: base64.StdEncoding.EncodeToString(data), Mode: mode})
		default:
			skipped = append(skipped, p)
			return nil
		}
		if len(files) > delegate.MaxFiles {
			return fmt.Errorf("more than the %d files a job takes", delegate.MaxFiles)
		}
		return nil
	})
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return nil, nil, err // it names the path
		}
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	return files, skipped, nil
}
