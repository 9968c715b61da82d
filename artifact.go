package delegate

import (
	"context"
	"errors"
	"path"
	"strings"
	"time"
)

// Artifact is a file collected from a job's workspace, stored by hash.
type Artifact struct {
	Name   string `json:"name"` // path relative to /workspace
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	// Skipped says why the file was not kept (over a size cap...).
	Skipped string `json:"skipped,omitempty"`
}

// ArtifactStore records the artifacts collected from jobs (their content
// is kept by hash, apart).
type ArtifactStore interface {
	// AddArtifact records (or replaces) a collected artifact.
	AddArtifact(ctx context.Context, id string, a Artifact) error
	// Artifacts lists a job's artifacts by name.
	Artifacts(ctx context.Context, id string) ([]Artifact, error)
	// Artifact returns one of them by name (a *NotFoundError, ErrNotFound,
	// when the job has none of that name): a reader of each of 10,000
	// artifacts must not read the whole list each time.
	Artifact(ctx context.Context, id, name string) (Artifact, error)
}

// BlobStore is a store that keeps artifacts' contents itself, by sha256,
// where every server sharing it reads them (PostgreSQL). Without one, an
// engine keeps them in its artifact directory (Config.ArtifactDir).
type BlobStore interface {
	// PutBlob keeps data under sum (its sha256, hex), once; kept again,
	// it is marked as used now (a prune spares it a while: the job that
	// keeps it may not name it yet).
	PutBlob(ctx context.Context, sum string, data []byte) error
	// Blob returns the content kept under sum (ErrNotFound: none).
	Blob(ctx context.Context, sum string) ([]byte, error)
	// DropBlobs removes the contents of sums that no job names and that
	// were last kept longer than grace ago, by the store's clock, and
	// says how many and their bytes; dry, it only counts them.
	DropBlobs(ctx context.Context, sums []string, grace time.Duration, dry bool) (n int, bytes int64, err error)
}

// ValidArtifactGlob checks an artifact pattern: relative to /workspace,
// path.Match syntax per segment, and "**" for any number of directories.
func ValidArtifactGlob(g string) error {
	if g == "" || len(g) > 1024 || strings.ContainsRune(g, 0) {
		return errors.New("must be a non-empty glob of at most 1024 bytes")
	}
	g = strings.TrimPrefix(g, Workspace+"/")
	if path.IsAbs(g) {
		return errors.New("must be relative to /workspace (like out/*.txt or **/*.log)")
	}
	for _, seg := range strings.Split(g, "/") {
		if seg == ".." {
			return errors.New("must stay inside /workspace (no ..)")
		}
		if seg == "**" {
			continue
		}
		if _, err := path.Match(seg, ""); err != nil {
			return errors.New("is not a valid glob (path.Match syntax, plus ** for any directories)")
		}
	}
	return nil
}

// MatchArtifact reports whether name (relative to /workspace) matches
// one of the globs.
func MatchArtifact(globs []string, name string) bool {
	parts := strings.Split(name, "/")
	for _, g := range globs {
		g = strings.TrimPrefix(g, Workspace+"/")
		if matchSegments(strings.Split(g, "/"), parts) {
			return true
		}
	}
	return false
}

func matchSegments(pattern, name []string) bool {
	for len(pattern) > 0 {
		if pattern[0] == "**" {
			for i := 0; i <= len(name); i++ {
				if matchSegments(pattern[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pattern[0], name[0]); !ok {
			return false
		}
		pattern, name = pattern[1:], name[1:]
	}
	return len(name) == 0
}
