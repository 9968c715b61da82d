package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// collectArtifacts copies the files matching the manifest's globs out of
// the sandbox into the content-addressed artifact store. A file over a
// cap is listed with the reason it was skipped, not silently dropped.
func (r *finisher) collectArtifacts(ctx context.Context, id string, m delegate.Manifest, sb sandbox.Instance) {
	files, err := sb.ListFiles(ctx, sandbox.ListOptions{Regular: true})
	if err != nil {
		r.log.Warn("list artifacts", "job", id, "err", err)
		r.progress.report(id, fmt.Sprintf("artifacts could not be listed: %v", err), nil, m.StatusMode != delegate.StatusModeSimple, time.Now().UTC())
		return
	}
	var total, listed int64
	var wanted []string
	var picked []sandbox.FileInfo
	for _, f := range files {
		name := strings.TrimPrefix(f.Path, delegate.Workspace+"/")
		if name == f.Path || !delegate.MatchArtifact(m.Artifacts, name) {
			continue
		}
		picked = append(picked, f)
		if f.Size <= r.cfg.ArtifactMaxFile && listed+f.Size <= r.cfg.ArtifactMaxTotal {
			wanted, listed = append(wanted, f.Path), listed+f.Size
		}
	}
	together := r.readTogether(ctx, id, sb, wanted)
	for _, f := range picked {
		name := strings.TrimPrefix(f.Path, delegate.Workspace+"/")
		a := delegate.Artifact{Name: name, Size: f.Size}
		b, read := together[f.Path]
		switch {
		case f.Size > r.cfg.ArtifactMaxFile || read && b.size > r.cfg.ArtifactMaxFile:
			a.Skipped = fmt.Sprintf("larger than the %d MiB per-file cap", r.cfg.ArtifactMaxFile>>20)
		case total+f.Size > r.cfg.ArtifactMaxTotal:
			a.Skipped = fmt.Sprintf("over the %d MiB per-job cap", r.cfg.ArtifactMaxTotal>>20)
		case read:
			a.Size, a.SHA256 = b.size, b.sum
			total += a.Size
		default:
			data, err := sb.ReadFile(ctx, f.Path, 0, r.cfg.ArtifactMaxFile+1)
			if err != nil {
				a.Skipped = fmt.Sprintf("could not be read: %v", err)
				break
			}
			if int64(len(data)) > r.cfg.ArtifactMaxFile {
				a.Skipped = fmt.Sprintf("larger than the %d MiB per-file cap", r.cfg.ArtifactMaxFile>>20)
				break
			}
			sum, err := r.storeBlob(ctx, data)
			if err != nil {
				r.log.Error("store artifact", "job", id, "name", name, "err", err)
				a.Skipped = "could not be stored on the server"
				break
			}
			a.Size, a.SHA256 = int64(len(data)), sum
			total += a.Size
		}
		if err := r.addArtifact(ctx, id, a); err != nil {
			r.log.Error("record artifact", "job", id, "name", name, "err", err)
		}
	}
}

// storedBlob is an artifact read and stored (readTogether): its sha256
// and size, or only its size when over the per-file cap.
type storedBlob struct {
	sum  string
	size int64
}

// readTogether reads and stores the files at paths in one go where the
// instance can (sandbox.FilesReader: a Proxmox VM sends them in one
// archive over HTTP, where one by one each is an exec in the guest and
// its polls), by path. Where it cannot, or something fails, it returns
// nil, and each is read on its own (what it stored is then unused,
// content-addressed blobs that pruning removes).
func (r *finisher) readTogether(ctx context.Context, id string, sb sandbox.Instance, paths []string) map[string]storedBlob {
	fr, ok := sb.(sandbox.FilesReader)
	if !ok || len(paths) == 0 {
		return nil
	}
	got := map[string]storedBlob{}
	err := fr.ReadFiles(ctx, paths, func(p string, rd io.Reader) error {
		data, err := io.ReadAll(io.LimitReader(rd, r.cfg.ArtifactMaxFile+1))
		if err != nil {
			return err
		}
		b := storedBlob{size: int64(len(data))}
		if b.size <= r.cfg.ArtifactMaxFile {
			if b.sum, err = r.storeBlob(ctx, data); err != nil {
				return err
			}
		}
		got[p] = b
		return nil
	})
	if err != nil {
		r.log.Warn("artifacts: reading them together failed: one by one instead", "job", id, "err", err)
		return nil
	}
	return got
}

// storeBlob keeps data under its sha256, once: in the store where it
// keeps contents (delegate.BlobStore: every server sharing it reads
// them), else a file of the artifact directory.
func (r *finisher) storeBlob(ctx context.Context, data []byte) (string, error) {
	h := sha256.Sum256(data)
	sum := hex.EncodeToString(h[:])
	if blobs, ok := r.store.(delegate.BlobStore); ok {
		return sum, blobs.PutBlob(ctx, sum, data)
	}
	path := blobPath(r.cfg.ArtifactDir, sum)
	if _, err := os.Stat(path); err == nil {
		// Reused: a prune leaves a file this recent alone (blobGrace),
		// though the job has not recorded it yet.
		now := time.Now()
		if err := os.Chtimes(path, now, now); err == nil {
			return sum, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	// The server's alone, also if the directory was there before, made
	// by someone else or with a looser mode.
	for _, d := range []string{r.cfg.ArtifactDir, filepath.Dir(path)} {
		if err := os.Chmod(d, 0o700); err != nil {
			return "", err
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return sum, os.Rename(tmp.Name(), path)
}

var sha256RE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{64}$`) })

func blobPath(dir, sum string) string {
	return filepath.Join(dir, sum[:2], sum)
}
