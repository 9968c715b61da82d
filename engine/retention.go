package engine

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/delegate-dev/delegate"
)

var _ delegate.RetentionService = (*Engine)(nil)

// blobGrace: an artifact file written or reused this recently is never
// removed by a prune, though no job names it yet: a job collecting its
// artifacts writes (or finds, and touches) the file before it records it.
const blobGrace = 10 * time.Minute

// GC removes what ended more than the retention ago, and the artifact
// files no job left names (delegate gc; the engine runs it every
// PruneInterval). With retention off it removes nothing.
func (e *Engine) GC(ctx context.Context, opts delegate.PruneOptions) (*delegate.Pruned, error) {
	if e.cfg.Retention < 0 {
		return &delegate.Pruned{}, nil
	}
	start := time.Now()
	before := start.Add(-e.cfg.Retention).UTC()
	p, err := e.store.Prune(ctx, before, opts)
	if p != nil {
		p.Before = before
	}
	if err != nil {
		return p, err
	}
	if blobs, ok := e.store.(delegate.BlobStore); ok {
		n, size, err := blobs.DropBlobs(ctx, p.Artifacts, blobGrace, opts.DryRun)
		if err != nil {
			return p, err
		}
		p.ArtifactFiles += n
		p.ArtifactBytes += size
	}
	for _, sum := range p.Artifacts {
		if !sha256RE().MatchString(sum) {
			continue // not a file of ours: never a path
		}
		path := blobPath(e.cfg.ArtifactDir, sum)
		st, err := os.Stat(path)
		if err != nil || st.ModTime().After(start.Add(-blobGrace)) {
			continue
		}
		if !opts.DryRun {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				e.log.Warn("prune: remove an artifact file", "path", path, "err", err)
				continue
			}
		}
		p.ArtifactFiles++
		p.ArtifactBytes += st.Size()
	}
	return p, nil
}

// prune is the background GC, logged when it removed something.
func (e *Engine) prune(ctx context.Context) {
	p, err := e.GC(ctx, delegate.PruneOptions{})
	switch {
	case err != nil && ctx.Err() == nil:
		e.log.Warn("prune jobs past their retention", "err", err)
	case err == nil && p.Jobs+p.Sandboxes+p.Networks+p.ArtifactFiles > 0:
		e.log.Info("pruned jobs past their retention", "before", p.Before, "jobs", p.Jobs, "sandboxes", p.Sandboxes,
			"networks", p.Networks, "bytes", p.Bytes, "artifact_files", p.ArtifactFiles, "artifact_bytes", p.ArtifactBytes)
	}
}
