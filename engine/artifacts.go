package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
	var total int64
	for _, f := range files {
		name := strings.TrimPrefix(f.Path, delegate.Workspace+"/")
		if name == f.Path || !delegate.MatchArtifact(m.Artifacts, name) {
			continue
		}
		a := delegate.Artifact{Name: name, Size: f.Size}
		switch {
		case f.Size > r.cfg.ArtifactMaxFile:
			a.Skipped = fmt.Sprintf("larger than the %d MiB per-file cap", r.cfg.ArtifactMaxFile>>20)
		case total+f.Size > r.cfg.ArtifactMaxTotal:
			a.Skipped = fmt.Sprintf("over the %d MiB per-job cap", r.cfg.ArtifactMaxTotal>>20)
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
