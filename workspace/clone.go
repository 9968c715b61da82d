//go:build unix

package workspace

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"golang.org/x/sys/unix"
)

// CloneOptions are Clone's options.
type CloneOptions struct {
	// URL is the repository: https only, without credentials in it; or
	// an absolute path of a repository on this machine (IsLocal), which
	// the caller has checked may be read (localgit.go).
	URL string
	// Ref is a branch, a tag, a full ref name (refs/…) or a full commit
	// id; "" is the remote's default branch.
	Ref string
	// Dir is an existing, empty directory; Clone writes in it as its
	// owner.
	Dir string
	// Dial is the address policy (PublicDial when nil).
	Dial DialFunc
	// RootCAs are the certificate authorities trusted (the system's when
	// nil).
	RootCAs *x509.CertPool
	// Depth is how many commits of history to fetch: 1 when 0, all when
	// negative. A commit that no ref names needs its whole history.
	Depth int
	// MaxBytes caps the pack fetched and the files checked out, each
	// (DefaultMaxBytes when 0); MaxFiles the files checked out
	// (DefaultMaxFiles when 0).
	MaxBytes int64
	MaxFiles int
	// Timeout bounds the whole clone (10 minutes when 0).
	Timeout time.Duration
}

// Cloned says what Clone checked out.
type Cloned struct {
	Commit string `json:"commit"`
	// Ref is the full name of the ref the commit was found by ("" for a
	// commit id); Branch is set when it is a branch, checked out as such.
	Ref     string `json:"ref,omitempty"`
	Branch  string `json:"branch,omitempty"`
	Shallow bool   `json:"shallow,omitempty"`
	Files   int    `json:"files"`
	Bytes   int64  `json:"bytes"`
}

// Clone fetches a repository at a ref over https into an empty directory
// and checks it out, with go-git in this process: no git binary, no hook,
// no submodule (a submodule is an empty directory), no credentials of the
// server's (no ssh keys, no credential helper, no netrc, no cookies, no
// proxy from the environment); every connection goes through Dial. It
// fetches the one commit with Depth commits of history where the remote
// allows it (a branch, a tag, an advertised commit), and falls back to the
// whole history for a commit no ref names. The result is a plain git work
// tree (a .git directory, an index, HEAD on the branch or detached), to
// Scan and Archive like any other.
func Clone(ctx context.Context, opts CloneOptions) (*Cloned, error) {
	u, err := checkURL(opts.URL)
	if err != nil {
		return nil, err
	}
	if opts.Dial == nil {
		opts.Dial = PublicDial
	}
	if opts.Depth == 0 {
		opts.Depth = 1
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxFiles == 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	rootfd, st, err := openRoot(opts.Dir, "")
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootfd)
	id, err := identityFor(st.Uid, st.Gid)
	if err != nil {
		return nil, err
	}
	var res *Cloned
	err = runAs(id, func() error {
		fd, err := reopenAs(rootfd, opts.Dir)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if names, err := readDirNames(fd); err != nil || len(names) > 0 {
			return fmt.Errorf("%s: not an empty directory", opts.Dir)
		}
		c := &cloner{opts: opts, url: u, b: newBeneath(fd)}
		defer c.b.close()
		res, err = c.clone(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// checkURL accepts https URLs with a host and no credentials.
func checkURL(raw string) (*url.URL, error) {
	if IsLocal(raw) {
		return &url.URL{Path: raw}, nil // a path: see localgit.go
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %q: %w", ErrBadURL, raw, err)
	case u.Scheme != "https":
		return nil, fmt.Errorf("%w: %q: only https URLs are fetched (no ssh, git, file or http)", ErrBadURL, raw)
	case u.User != nil:
		return nil, fmt.Errorf("%w: credentials in the URL are refused (they would be stored and logged with it)", ErrBadURL)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("%w: %q has no host", ErrBadURL, raw)
	case u.Fragment != "" || u.RawQuery != "":
		return nil, fmt.Errorf("%w: %q: no query or fragment", ErrBadURL, raw)
	}
	return u, nil
}

type cloner struct {
	opts CloneOptions
	url  *url.URL
	b    *beneath
}

// CheckRef asks the remote which commit a ref names, without fetching
// anything (its advertised refs only): for submission, so that an unknown
// ref or an unreachable host is a field error before a job is stored. A
// commit id is returned as given (whether the remote has it shows only
// when it is fetched). Dir, Depth and the caps are not used.
func CheckRef(ctx context.Context, opts CloneOptions) (commit, ref string, err error) {
	u, err := checkURL(opts.URL)
	if err != nil {
		return "", "", err
	}
	if opts.Dial == nil {
		opts.Dial = PublicDial
	}
	if opts.Timeout == 0 {
		opts.Timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	sess, done, err := uploadSession(opts)
	if err != nil {
		return "", "", err
	}
	defer done()
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", u.Redacted(), err)
	}
	want, name, err := resolveRef(ar, opts.Ref)
	if err != nil {
		return "", "", err
	}
	if p, ok := ar.Peeled[name]; ok {
		want = p // an annotated tag's commit
	}
	return want.String(), name, nil
}

// httpClient is the only way out: the caller's dial, no proxy from the
// environment, no cookie jar, https redirects only.
func httpClient(opts CloneOptions) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil, // not the server's HTTPS_PROXY
			DialContext:           opts.Dial,
			TLSClientConfig:       &tls.Config{RootCAs: opts.RootCAs, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:     true,
			TLSHandshakeTimeout:   30 * time.Second,
			ResponseHeaderTimeout: 2 * time.Minute,
			MaxIdleConnsPerHost:   2,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Scheme != "https" {
				return fmt.Errorf("%w: redirected to %s", ErrBadURL, req.URL.Redacted())
			}
			if len(via) >= 5 {
				return errors.New("too many redirects")
			}
			return nil
		},
	}
}

// uploadSession opens the upload-pack session a clone fetches through:
// over https, or a local repository's (localgit.go). done closes it.
func uploadSession(opts CloneOptions) (sess transport.UploadPackSession, done func(), err error) {
	if IsLocal(opts.URL) {
		// Read with the server's identity, off a clone's thread (runAs).
		sess, err = offThread(func() (transport.UploadPackSession, error) { return localSession(opts.URL) })
		if err != nil {
			return nil, nil, err
		}
		return sess, func() { sess.Close() }, nil
	}
	hc := httpClient(opts)
	ep, err := transport.NewEndpoint(opts.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrBadURL, err)
	}
	sess, err = githttp.NewClient(hc).NewUploadPackSession(ep, nil)
	if err != nil {
		return nil, nil, err
	}
	return sess, func() { sess.Close(); hc.CloseIdleConnections() }, nil
}

func (c *cloner) clone(ctx context.Context) (*Cloned, error) {
	sess, done, err := uploadSession(c.opts)
	if err != nil {
		return nil, err
	}
	defer done()
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.url.Redacted(), err)
	}
	want, refName, err := resolveRef(ar, c.opts.Ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.url.Redacted(), err)
	}

	if err := c.b.mkdirAll(".git", 0o755); err != nil {
		return nil, err
	}
	gfs, done, err := gitDirFS(c.b, c.opts.Dir)
	if err != nil {
		return nil, err
	}
	defer done()
	s := filesystem.NewStorage(gfs, cache.NewObjectLRUDefault())
	defer s.Close()
	if err := s.Init(); err != nil {
		return nil, err
	}
	cfg := config.NewConfig()
	cfg.Remotes["origin"] = &config.RemoteConfig{Name: "origin", URLs: []string{c.opts.URL},
		Fetch: []config.RefSpec{"+refs/heads/*:refs/remotes/origin/*"}}
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}

	res := &Cloned{Ref: refName}
	shallow, err := c.fetch(ctx, sess, ar, s, []plumbing.Hash{want}, c.opts.Depth)
	if err != nil && refName == "" {
		// A commit no ref names: servers refuse it unless configured to
		// (uploadpack.allowAnySHA1InWant); its history holds it.
		var all []plumbing.Hash
		for name, h := range ar.References {
			if strings.HasPrefix(name, "refs/heads/") || strings.HasPrefix(name, "refs/tags/") {
				all = append(all, h)
			}
		}
		shallow, err = c.fetch(ctx, sess, ar, s, dedupe(all), -1)
	}
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", c.url.Redacted(), err)
	}
	res.Shallow = shallow
	commit, err := peel(s, want)
	if err != nil {
		if refName == "" {
			return nil, fmt.Errorf("%w: commit %s is not in %s", ErrUnknownRef, want, c.url.Redacted())
		}
		return nil, err
	}
	res.Commit = commit.Hash.String()

	switch {
	case strings.HasPrefix(refName, "refs/heads/"):
		res.Branch = strings.TrimPrefix(refName, "refs/heads/")
		err = errors.Join(
			s.SetReference(plumbing.NewHashReference(plumbing.ReferenceName(refName), commit.Hash)),
			s.SetReference(plumbing.NewHashReference(plumbing.ReferenceName("refs/remotes/origin/"+res.Branch), commit.Hash)),
			s.SetReference(plumbing.NewSymbolicReference(plumbing.HEAD, plumbing.ReferenceName(refName))))
	case refName != "":
		err = errors.Join(
			s.SetReference(plumbing.NewHashReference(plumbing.ReferenceName(refName), want)),
			s.SetReference(plumbing.NewHashReference(plumbing.HEAD, commit.Hash)))
	default:
		err = s.SetReference(plumbing.NewHashReference(plumbing.HEAD, commit.Hash))
	}
	if err != nil {
		return nil, err
	}
	if err := c.checkout(ctx, s, commit, res); err != nil {
		return nil, err
	}
	return res, nil
}

// resolveRef finds what to fetch for ref among the advertised refs: the
// object to want and the full ref name ("" for a commit id).
func resolveRef(ar *packp.AdvRefs, ref string) (plumbing.Hash, string, error) {
	if ref == "" || ref == "HEAD" {
		if ar.Head == nil {
			return plumbing.ZeroHash, "", fmt.Errorf("%w: the remote has no default branch (HEAD)", ErrUnknownRef)
		}
		// The branch HEAD points to, from the symref capability, else
		// the first branch at the same commit.
		for _, v := range ar.Capabilities.Get(capability.SymRef) {
			if from, to, ok := strings.Cut(v, ":"); ok && from == "HEAD" && ar.References[to] == *ar.Head {
				return *ar.Head, to, nil
			}
		}
		names := make([]string, 0, len(ar.References))
		for n, h := range ar.References {
			if h == *ar.Head && strings.HasPrefix(n, "refs/heads/") {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		if len(names) > 0 {
			return *ar.Head, names[0], nil
		}
		return *ar.Head, "", nil
	}
	candidates := []string{ref}
	if !strings.HasPrefix(ref, "refs/") {
		candidates = []string{"refs/heads/" + ref, "refs/tags/" + ref}
	}
	for _, name := range candidates {
		if h, ok := ar.References[name]; ok {
			return h, name, nil
		}
	}
	if len(ref) == 40 && isHash(ref) {
		return plumbing.NewHash(ref), "", nil
	}
	if isHexPrefix(ref) {
		return plumbing.ZeroHash, "", fmt.Errorf("%w: %q: give a commit by its full 40-character id, or a branch or tag", ErrUnknownRef, ref)
	}
	return plumbing.ZeroHash, "", fmt.Errorf("%w: no branch or tag %q", ErrUnknownRef, ref)
}

func isHexPrefix(s string) bool {
	if len(s) < 4 || len(s) >= 40 {
		return false
	}
	return isHash(s + strings.Repeat("0", 40-len(s)))
}

func dedupe(hs []plumbing.Hash) []plumbing.Hash {
	seen := map[plumbing.Hash]bool{}
	var out []plumbing.Hash
	for _, h := range hs {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// fetch asks for wants with depth commits of history (all when < 0) and
// stores the pack; it tells whether the result is shallow.
func (c *cloner) fetch(ctx context.Context, sess transport.UploadPackSession, ar *packp.AdvRefs, s *filesystem.Storage, wants []plumbing.Hash, depth int) (bool, error) {
	if local, ok := sess.(*outside); ok && depth > 0 && advertised(ar, wants) {
		return local.shallowFetch(s, wants, depth, c.opts.MaxBytes)
	}
	req := packp.NewUploadPackRequestFromCapabilities(ar.Capabilities)
	req.Wants = wants
	shallow := false
	if depth > 0 && ar.Capabilities.Supports(capability.Shallow) {
		req.Depth = packp.DepthCommits(depth)
		if err := req.Capabilities.Set(capability.Shallow); err != nil {
			return false, err
		}
		shallow = true
	}
	if ar.Capabilities.Supports(capability.NoProgress) {
		req.Capabilities.Set(capability.NoProgress)
	}
	resp, err := sess.UploadPack(ctx, req)
	if err != nil {
		return false, err
	}
	defer resp.Close()
	var r io.Reader = resp
	switch {
	case req.Capabilities.Supports(capability.Sideband64k):
		r = sideband.NewDemuxer(sideband.Sideband64k, resp)
	case req.Capabilities.Supports(capability.Sideband):
		r = sideband.NewDemuxer(sideband.Sideband, resp)
	}
	lr := &capReader{r: r, left: c.opts.MaxBytes}
	if err := packfile.UpdateObjectStorage(s, lr); err != nil {
		if lr.over {
			return false, &CapError{What: "bytes of pack", Found: c.opts.MaxBytes + 1, Cap: c.opts.MaxBytes, More: true}
		}
		return false, err
	}
	if len(resp.Shallows) > 0 {
		if err := s.SetShallow(resp.Shallows); err != nil {
			return false, err
		}
	} else {
		shallow = false
	}
	return shallow, nil
}

// advertised: every one of wants is what a ref the remote advertises
// names.
func advertised(ar *packp.AdvRefs, wants []plumbing.Hash) bool {
	for _, w := range wants {
		found := false
		for _, h := range ar.References {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// capReader fails once more than left bytes were read.
type capReader struct {
	r    io.Reader
	left int64
	over bool
}

func (c *capReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		c.over = true
		return n, ErrOverCap
	}
	return n, err
}

// peel follows tags to the commit.
func peel(s *filesystem.Storage, h plumbing.Hash) (*object.Commit, error) {
	for range 10 {
		obj, err := s.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return nil, err
		}
		switch obj.Type() {
		case plumbing.CommitObject:
			return object.DecodeCommit(s, obj)
		case plumbing.TagObject:
			tag, err := object.DecodeTag(s, obj)
			if err != nil {
				return nil, err
			}
			h = tag.Target
		default:
			return nil, fmt.Errorf("%w: %s is a %s, not a commit", ErrUnknownRef, h, obj.Type())
		}
	}
	return nil, fmt.Errorf("%s: tags nested too deep", h)
}

// checkout writes the commit's tree into the directory (beneath it,
// without following links, as its owner) and the index that describes it.
func (c *cloner) checkout(ctx context.Context, s *filesystem.Storage, commit *object.Commit, res *Cloned) error {
	tree, err := commit.Tree()
	if err != nil {
		return err
	}
	idx := &index.Index{Version: 2}
	w := object.NewTreeWalker(tree, true, nil) // it refuses ".git", ".." and the like in names
	defer w.Close()
	for n := 0; ; n++ {
		if n&255 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		name, e, err := w.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := checkName(name); err != nil || inGit(name) {
			return fmt.Errorf("the tree holds %q: refused", name)
		}
		dir, _ := splitParent(name)
		switch e.Mode {
		case filemode.Dir:
			if err := c.b.mkdirAll(name, 0o755); err != nil {
				return err
			}
			continue
		case filemode.Submodule:
			if err := c.b.mkdirAll(name, 0o755); err != nil {
				return err
			}
			idx.Entries = append(idx.Entries, &index.Entry{Name: name, Hash: e.Hash, Mode: filemode.Submodule})
			continue
		}
		blob, err := object.GetBlob(s, e.Hash)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		res.Files++
		res.Bytes += blob.Size
		if res.Files > c.opts.MaxFiles {
			return &CapError{What: "files", Found: int64(res.Files), Cap: int64(c.opts.MaxFiles), More: true}
		}
		if res.Bytes > c.opts.MaxBytes {
			return &CapError{What: "bytes", Found: res.Bytes, Cap: c.opts.MaxBytes, More: true}
		}
		if err := c.b.mkdirAll(dir, 0o755); err != nil {
			return err
		}
		rd, err := blob.Reader()
		if err != nil {
			return err
		}
		switch e.Mode {
		case filemode.Symlink:
			var target bytes.Buffer
			_, err = io.Copy(&target, io.LimitReader(rd, 4096))
			if err == nil {
				err = c.b.symlink(name, target.String(), 0)
			}
		case filemode.Executable:
			err = c.b.createFile(name, rd, 0o755, 0, false)
		default:
			err = c.b.createFile(name, rd, 0o644, 0, false)
		}
		rd.Close()
		if err != nil {
			return err
		}
		st, err := c.b.lstat(name)
		if err != nil {
			return err
		}
		idx.Entries = append(idx.Entries, &index.Entry{
			Name: name, Hash: e.Hash, Mode: e.Mode, Size: uint32(st.Size),
			ModifiedAt: time.Unix(0, st.Mtim.Nano()), CreatedAt: time.Unix(0, st.Ctim.Nano()),
			Dev: uint32(st.Dev), Inode: uint32(st.Ino), UID: st.Uid, GID: st.Gid,
		})
	}
	sort.Slice(idx.Entries, func(i, j int) bool { return idx.Entries[i].Name < idx.Entries[j].Name })
	return s.SetIndex(idx)
}
