// Package workspace brings a project into a sandbox and takes the job's
// changes out: pure functions over directories, tar streams and JSON
// values, with no knowledge of backends, the engine or the store. The
// engine calls them at its provisioning and collecting steps and moves
// the streams through the sandbox contract.
//
// # The flow, step by step
//
// At submission (nothing stored yet; every error is a field error, see
// below):
//
//	tree, err := workspace.Scan(ctx, dir, workspace.ScanOptions{
//		IncludeIgnored: m.Workspace.IncludeIgnored,
//		MaxBytes: min(capBytes, jobMemory/2), MaxFiles: capFiles,
//		Within: theAllowedRootDirIsUnder, // DELEGATE_WORKSPACE_ROOTS
//	})
//	// a git source: CheckRef(ctx, CloneOptions{URL, Ref}) resolves the
//	// ref from the remote's advertisement, without fetching.
//
// At provisioning, for a git source first:
//
//	res, err := workspace.Clone(ctx, workspace.CloneOptions{
//		URL: url, Ref: ref, Dir: emptyDirOwnedByAnUnprivilegedUser,
//		Dial: workspace.PublicDial, // or the egress policy's dial
//	})
//	// then Scan(res's Dir) as a dir source.
//
// then the copy; say "copying workspace (tree.Files files, tree.Bytes/1e6
// MB)" and list tree.Skipped (sockets, fifos, devices, mount points) in
// the timeline:
//
//	tree, err := workspace.Scan(ctx, dir, sameOptions) // again: it may have changed
//	pr, pw := io.Pipe()
//	go func() { base, err = tree.Archive(ctx, pw, workspace.ArchiveOptions{Gzip: remote}); pw.CloseWithError(err) }()
//	// local: workspace.Extract(ctx, pr, sandboxWorkspaceDir, opts) as the
//	//   directory's owner (the job's user), from a process in the job's
//	//   memory cgroup if the copy is to be charged to the job;
//	// Proxmox: pr's bytes, chunked through agent/file-write, then
//	//   `tar -xzf FILE -C /workspace` in the guest (GNU tar keeps the
//	//   nanosecond times of the pax stream, which the changes rely on).
//	// store base (*Baseline) as JSON with the job: the changes are
//	// computed against it, also after a restart.
//
// After the job (or a command in a kept sandbox):
//
//	cs, err := workspace.DirChanges(ctx, base, sandboxWorkspaceDir, workspace.ChangesOptions{}) // local
//	cs, err := workspace.ReadChanges(ctx, base, r, workspace.ChangesOptions{})                  // a stream
//	// r: from the guest, `tar -C /workspace -czf - --hard-dereference .`
//	err = cs.ReadOld(ctx, sourceDir, within) // the old side of the diff
//	// cs is JSON (contents in base64): store it, or keep the stream.
//
// For the user (CLI `delegate jobs diff ID`, `delegate jobs apply ID
// [--to DIR] [--branch] [--binary]`, an MCP tool):
//
//	page := cs.Diff(workspace.DiffOptions{Offset: off, Limit: 64 << 10}) // paged, capped
//	patch, err := cs.Patch(0)                                            // for git apply
//	done, err := workspace.Apply(ctx, dir, cs, workspace.ApplyOptions{Within: root})
//	commit, err := workspace.CommitBranch(ctx, dir, base, cs, workspace.BranchOptions{Name: "delegate/" + jobID})
//
// # Errors and the fields they belong to
//
// Every error wraps a sentinel for errors.Is; the message names the path
// and the rule. For manifest.workspace.dir: ErrNotAbsolute ("must be an
// absolute path"), ErrOutside (not under an allowed root),
// fs.ErrNotExist, ErrNotDirectory, ErrSymlink (the path, or a part of it
// under the allowed root, is a link; a loop too), ErrGitDir (a git
// directory or inside one), fs.ErrPermission
// (unreadable by the tree's owner), ErrOverCap (*CapError: "312.4 MiB
// found, over the cap of 256.0 MiB"), ErrChanged (*ChangedError: copy
// again). For manifest.workspace.git: ErrBadURL, ErrAddressRefused; for
// manifest.workspace.ref: ErrUnknownRef. Apply: *ConflictError (every
// path changed in the target since the import, nothing written),
// *RefusedError (links, setuid or setgid modes, paths out of the target or
// under .git, forged contents; nothing written). CommitBranch:
// ErrNoBaseCommit. A stream that is not a clean tar: ErrBadArchive.
//
// # Security model
//
//   - Every file beneath a tree is opened relative to a directory
//     descriptor with openat2 and RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
//     RESOLVE_NO_XDEV (elsewhere, or where openat2 is refused, one
//     component at a time with O_NOFOLLOW): no link is ever followed,
//     nothing leaves the tree or crosses a mount point, whatever the owner
//     swaps in meanwhile. Links are copied as links.
//   - Reads and writes happen as the owner of the tree's root, not as
//     root: on a goroutine locked to an OS thread of its own whose
//     filesystem identity (setfsuid, setfsgid, setgroups: the raw
//     per-thread system calls) is the owner's. The goroutine never
//     unlocks its thread, so the runtime ends the thread with it. A
//     server not running as root reads as itself. Outside Linux, a
//     root server refuses another user's tree.
//   - Each file is checked against what Scan saw (inode, size,
//     modification and change times) when it is opened and again after it
//     is read: the archive is what the scan saw, or a *ChangedError.
//     Like git, it cannot see a rewrite of the same size within the
//     filesystem's timestamp granularity.
//   - Nothing under a .git directory is ever a change (a job must not
//     plant hooks or core.fsmonitor): ReadChanges and DirChanges skip it,
//     Apply and CommitBranch refuse it, and a change that lies in a
//     directory that would hold HEAD, objects/ and refs/ once written (a
//     bare repository, to git). A .git is named as git's verify_path
//     reads names on macOS and Windows (case-folded, HFS+'s ignored code
//     points, NTFS's trailing dots and spaces and GIT~1).
//   - Apply writes no symbolic link; CommitBranch commits one only when
//     its target, resolved in the branch's tree with the links on the way
//     followed, stays in the work tree and out of .git.
//   - A source under an allowed root (Scan with Within), and the target
//     of Apply and CommitBranch, must be neither a git directory nor lie
//     in one (ErrGitDir): no .git among the components of its path as
//     given, as cleaned or with its links resolved, and no directory,
//     itself or above it, that holds HEAD, objects/ and refs/.
//   - The package never runs the git binary (a repository's configuration
//     can make git run programs): go-git reads the index and the ignore
//     rules, fetches over https and writes objects, in process, with no
//     hooks, no submodules and none of the server's credentials (no ssh
//     keys, credential helpers, netrc, cookies or proxy settings). Every
//     connection goes through the caller's DialFunc; PublicDial refuses
//     loopback, link-local, private and this host's own addresses, checked
//     on the address connected to, after DNS.
//   - Apply writes each file to a temporary name beside it and renames it
//     into place, after checking that every path it touches is as the
//     import found it, and that the owner may write there.
//
// # What is not here, and why
//
// The owner's global git excludes file (core.excludesFile) is not read: it
// lies outside the tree. A linked work tree (.git is a file) names a
// repository outside the tree: it comes in as a plain directory with its
// ignore rules. Caches, the manifest's fields and the CLI and MCP
// surfaces belong to the engine and the adapters.
package workspace
