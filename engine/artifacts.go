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

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// collectArtifacts copies the files matching the manifest's globs out of
// the sandbox into the content-addressed artifact store. A file over a
// cap is listed with the reason it was skipped, not silently dropped.
func (e *Engine) collectArtifacts(ctx context.Context, id string, m delegate.Manifest, sb sandbox.Sandbox) {
	files, err := sb.ListFiles(ctx)
	if err != nil {
		e.log.Warn("list artifacts", "job", id, "err", err)
		e.report(ctx, id, m, fmt.Sprintf("artifacts could not be listed: %v", err), nil)
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
		case f.Size > e.cfg.ArtifactMaxFile:
			a.Skipped = fmt.Sprintf("larger than the %d MiB per-file cap", e.cfg.ArtifactMaxFile>>20)
		case total+f.Size > e.cfg.ArtifactMaxTotal:
			a.Skipped = fmt.Sprintf("over the %d MiB per-job cap", e.cfg.ArtifactMaxTotal>>20)
		default:
			data, err := sb.ReadFile(ctx, f.Path, e.cfg.ArtifactMaxFile+1)
			if err != nil {
				a.Skipped = fmt.Sprintf("could not be read: %v", err)
				break
			}
			if int64(len(data)) > e.cfg.ArtifactMaxFile {
				a.Skipped = fmt.Sprintf("larger than the %d MiB per-file cap", e.cfg.ArtifactMaxFile>>20)
				break
			}
			sum, err := e.storeBlob(data)
			if err != nil {
				e.log.Error("store artifact", "job", id, "name", name, "err", err)
				a.Skipped = "could not be stored on the server"
				break
			}
			a.Size, a.SHA256 = int64(len(data)), sum
			total += a.Size
		}
		if err := e.store.AddArtifact(ctx, id, a); err != nil {
			e.log.Error("record artifact", "job", id, "name", name, "err", err)
		}
	}
}

// storeBlob writes data under its sha256, once.
func (e *Engine) storeBlob(data []byte) (string, error) {
	h := sha256.Sum256(data)
	sum := hex.EncodeToString(h[:])
	path := e.blobPath(sum)
	if _, err := os.Stat(path); err == nil {
		return sum, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	// The server's alone, also if the directory was there before, made
	// by someone else or with a looser mode.
	for _, d := range []string{e.cfg.ArtifactDir, filepath.Dir(path)} {
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

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (e *Engine) blobPath(sum string) string {
	return filepath.Join(e.cfg.ArtifactDir, sum[:2], sum)
}

// Artifacts lists a job's artifacts.
func (e *Engine) Artifacts(ctx context.Context, id string) ([]delegate.Artifact, error) {
	return e.store.Artifacts(ctx, id)
}

// ReadArtifact returns the content of a job's artifact, checked against
// its recorded sha256.
func (e *Engine) ReadArtifact(ctx context.Context, id, name string) (delegate.Artifact, []byte, error) {
	arts, err := e.store.Artifacts(ctx, id)
	if err != nil {
		return delegate.Artifact{}, nil, err
	}
	for _, a := range arts {
		if a.Name != name {
			continue
		}
		if a.Skipped != "" || !sha256RE.MatchString(a.SHA256) {
			return a, nil, &delegate.NotFoundError{Resource: "artifact", ID: name, Of: "job " + id, Reason: "not kept: " + a.Skipped}
		}
		data, err := os.ReadFile(e.blobPath(a.SHA256))
		if err != nil {
			return a, nil, fmt.Errorf("artifact %q of job %s: %w", name, id, err)
		}
		if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != a.SHA256 {
			return a, nil, fmt.Errorf("artifact %q of job %s is corrupt on disk (sha256 mismatch)", name, id)
		}
		return a, data, nil
	}
	if _, err := e.store.GetJob(ctx, id); err != nil {
		return delegate.Artifact{}, nil, err
	}
	return delegate.Artifact{}, nil, delegate.ArtifactNotFound(id, name)
}
