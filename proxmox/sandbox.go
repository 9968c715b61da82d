package proxmox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// vmSandbox is one job's VM.
type vmSandbox struct {
	b    *Backend
	vmid int
	// node is where the VM was made or found. A VM migrates: where says
	// where it is now, and onNode follows it.
	node  string
	owner owner
	// kept: the VM runs more than one command (Spec.MultiExec): each
	// command's directory is removed once its result is read. A VM that
	// runs one command is destroyed after it, directory and all.
	kept bool
	// nic: the VM has a network, over which its workspace may travel
	// (transfer.go).
	nic bool
}

var _ sandbox.Instance = (*vmSandbox)(nil)

func (s *vmSandbox) ID() string { return sandboxID(s.vmid, s.owner.job) }

// Destroy implements sandbox.Instance: the VM goes, wherever it is now.
func (s *vmSandbox) Destroy(ctx context.Context) error {
	if s.b.vms.nodeOf(s.vmid) == "" {
		s.b.vms.remember(s.vmid, s.node)
	}
	err := s.b.vms.destroy(ctx, s.vmid, s.owner)
	if err == nil {
		s.b.ckpts.dropArchives(s.vmid)
	}
	return err
}

// errNotThere: the node does not have the VM (any more).
var errNotThere = errors.New("the VM is not on this node")

// where is the node the VM is on, as this server last saw it.
func (s *vmSandbox) where() string {
	if n := s.b.vms.nodeOf(s.vmid); n != "" {
		return n
	}
	return s.node
}

// onNode makes call on the VM's node. A node that no longer has the VM
// ("Configuration file ... does not exist") lost it to a migration, or
// it is gone: it is looked for in the cluster's listing, and if it is on
// another node and still this sandbox's, call is made again there;
// sandbox.ErrGone if it is nowhere.
func (s *vmSandbox) onNode(ctx context.Context, call func(node string) error) error {
	node := s.where()
	err := call(node)
	if err == nil || !(pve.IsNotFound(err) || errors.Is(err, errNotThere)) {
		return err
	}
	moved, ferr := s.b.vms.follow(ctx, s.vmid, s.owner, node)
	switch {
	case ferr != nil:
		return ferr
	case !moved:
		return err
	}
	return call(s.where())
}

// result is how a command run through the agent ended.
type result struct {
	code   int
	stdout []byte
	stderr []byte
	// truncated: the agent kept only the first 16 MiB of the output.
	truncated bool
}

// run executes argv in the guest (no shell unless argv says so) and waits
// for it.
func (s *vmSandbox) run(ctx context.Context, argv []string) (result, error) {
	pid, err := s.start(ctx, argv, nil)
	if err != nil {
		return result{}, err
	}
	return s.wait(ctx, pid, argv[0])
}

// start starts argv in the guest, stdin (if not nil) its standard input.
func (s *vmSandbox) start(ctx context.Context, argv []string, stdin []byte) (int, error) {
	var pid int
	err := s.onNode(ctx, func(node string) (err error) {
		pid, err = s.b.c.AgentExec(ctx, node, s.vmid, argv, stdin)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("run %s in VM %d: %w", argv[0], s.vmid, agentHint(err))
	}
	return pid, nil
}

// wait polls a command the agent started (pid, named name) to its end.
func (s *vmSandbox) wait(ctx context.Context, pid int, name string) (result, error) {
	wait := 20 * time.Millisecond
	for {
		r, done, err := s.status(ctx, pid, name)
		if err != nil || done {
			return r, err
		}
		select {
		case <-ctx.Done():
			return result{}, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, s.b.cfg.PollInterval)
	}
}

// status reads a command's status once: done when it has exited.
func (s *vmSandbox) status(ctx context.Context, pid int, name string) (result, bool, error) {
	var st pve.ExecStatus
	err := s.onNode(ctx, func(node string) (err error) {
		st, err = s.b.c.AgentExecStatus(ctx, node, s.vmid, pid)
		return err
	})
	if err != nil {
		return result{}, false, fmt.Errorf("run %s in VM %d: %w", name, s.vmid, err)
	}
	if !st.Exited {
		return result{}, false, nil
	}
	r := result{code: -1, stdout: st.Stdout, stderr: st.Stderr, truncated: st.StdoutTruncated}
	if st.ExitCode != nil {
		r.code = *st.ExitCode
	}
	return r, true, nil
}

// runOK is run for a command that must succeed.
func (s *vmSandbox) runOK(ctx context.Context, argv []string) ([]byte, error) {
	r, err := s.run(ctx, argv)
	if err != nil {
		return nil, err
	}
	if r.code != 0 {
		return nil, fmt.Errorf("%s in VM %d exited %d: %s", argv[0], s.vmid, r.code, strings.TrimSpace(string(r.stderr)))
	}
	if r.truncated {
		// What follows the cut is lost: a partial answer is no answer.
		return nil, fmt.Errorf("%s in VM %d wrote more than the guest agent keeps (%d bytes): its output is cut", argv[0], s.vmid, len(r.stdout))
	}
	return r.stdout, nil
}

func checkWorkspacePath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || !strings.HasPrefix(p, workspace+"/") || strings.ContainsRune(p, 0) {
		return fmt.Errorf("path %q must be a clean absolute path inside %s", p, workspace)
	}
	return nil
}

// joinScript assembles a file from parts written by the agent. It is a
// constant: the paths and mode arrive as arguments, never inside the script.
const joinScript = `mode=$1 out=$2; shift 2
mkdir -p -- "${out%/*}" && cat -- "$@" > "$out" && chmod "$mode" -- "$out"; rc=$?
rm -f -- "$@"; exit $rc`

// linkScript makes a symbolic link whose target is the content of a part
// written by the agent (the target, the job's text, stays off the
// argument list, as contents do).
const linkScript = `out=$1 part=$2
target=$(cat -- "$part") && mkdir -p -- "${out%/*}" && ln -s -- "$target" "$out"; rc=$?
rm -f -- "$part"; exit $rc`

// WriteFile implements sandbox.Instance. file-write carries at most
// pve.MaxFileWrite bytes and only overwrites, so the file is written in
// parts in guestDir (where no one but root reaches them) and joined in
// the guest.
func (s *vmSandbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	if err := checkWorkspacePath(p); err != nil {
		return err
	}
	var nonce [6]byte
	rand.Read(nonce[:])
	name := func(i int) string { return fmt.Sprintf("%s/part-%s.%04d", guestDir, hex.EncodeToString(nonce[:]), i) }
	if err := s.writeParts(ctx, data, name); err != nil {
		return fmt.Errorf("write %s in VM %d: %w", p, s.vmid, err)
	}
	args := []string{"/bin/sh", "-c", joinScript, "delegate-join", strconv.FormatUint(uint64(mode.Perm()), 8), p}
	for i := 0; i == 0 || i*pve.MaxFileWrite < len(data); i++ {
		args = append(args, name(i))
	}
	if mode&fs.ModeSymlink != 0 {
		args = []string{"/bin/sh", "-c", linkScript, "delegate-link", p, name(0)}
	}
	if _, err := s.runOK(ctx, args); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// ReadFile implements sandbox.Instance (the agent reads at most 16 MiB).
func (s *vmSandbox) ReadFile(ctx context.Context, p string, offset, max int64) ([]byte, error) {
	if err := checkWorkspacePath(p); err != nil {
		return nil, err
	}
	if offset < 0 || max < 0 {
		return nil, fmt.Errorf("read %s: negative offset %d or max %d", p, offset, max)
	}
	if offset+max > pve.MaxFileRead {
		// Past what one agent/file-read returns: dd reads the part.
		out, err := s.runOK(ctx, []string{"/bin/dd", "if=" + p, "iflag=skip_bytes,count_bytes", "skip=" + strconv.FormatInt(offset, 10),
			"count=" + strconv.FormatInt(max, 10), "status=none"})
		if err != nil {
			return nil, fmt.Errorf("read %s in VM %d: %w", p, s.vmid, err)
		}
		return out, nil
	}
	var fc pve.FileContent
	err := s.onNode(ctx, func(node string) (err error) {
		fc, err = s.b.c.AgentFileRead(ctx, node, s.vmid, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s in VM %d: %w", p, s.vmid, err)
	}
	data := fc.Data[min(offset, int64(len(fc.Data))):]
	return data[:min(max, int64(len(data)))], nil
}

// ListFiles implements sandbox.Files with find(1) in the guest, which
// does not follow links: one NUL-separated record per entry (type, mode,
// size, mtime, path, link target).
func (s *vmSandbox) ListFiles(ctx context.Context, opts sandbox.ListOptions) ([]sandbox.FileInfo, error) {
	dir := opts.Dir
	if dir == "" {
		dir = workspace
	}
	if dir != workspace {
		if err := checkWorkspacePath(dir); err != nil {
			return nil, err
		}
	}
	argv := []string{"/usr/bin/find", dir, "-mindepth", "1"}
	if opts.Depth > 0 {
		argv = append(argv, "-maxdepth", strconv.Itoa(opts.Depth))
	}
	if opts.Regular {
		argv = append(argv, "-type", "f")
	}
	argv = append(argv, "-printf", `%y %m %s %T@ %p\0%l\0`)
	out, err := s.runOK(ctx, argv)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	recs := bytes.Split(out, []byte{0})
	var files []sandbox.FileInfo
	for i := 0; i+1 < len(recs); i += 2 {
		f, ok := parseFindRecord(string(recs[i]), string(recs[i+1]))
		if !ok || checkWorkspacePath(f.Path) != nil {
			continue
		}
		if opts.Limit > 0 && len(files) == opts.Limit {
			return files, sandbox.ErrTruncated
		}
		files = append(files, f)
	}
	slices.SortFunc(files, func(a, b sandbox.FileInfo) int { return strings.Compare(a.Path, b.Path) })
	return files, nil
}

// Pause implements sandbox.Pauser: the VM is suspended (its RAM kept; its
// guest agent answers nothing until Resume).
func (s *vmSandbox) Pause(ctx context.Context) error {
	return s.power(ctx, "pause", s.b.c.SuspendVM)
}

// Resume implements sandbox.Pauser.
//
// A paused guest's clock stood still (kvmclock stops with the vCPUs, and
// Proxmox does not set the guest's time on resume), up to the 24 h a
// paused sandbox may last: the guest's time is set from the server's
// (one exec of setClockScript) before the next command, which would
// otherwise see its certificates not yet valid and its builds' files
// from the future.
func (s *vmSandbox) Resume(ctx context.Context) error {
	if err := s.power(ctx, "resume", s.b.c.ResumeVM); err != nil {
		return err
	}
	r, err := s.run(ctx, []string{"/bin/sh", "-c", setClockScript, "delegate-clock", strconv.FormatInt(time.Now().Unix(), 10)})
	if err == nil && r.code != 0 {
		err = fmt.Errorf("exit %d: %s", r.code, strings.TrimSpace(string(r.stderr)))
	}
	if err != nil {
		s.b.log.Warn("could not set the clock of a resumed VM: its commands see the time it was paused at", "vmid", s.vmid, "err", err)
	}
	return nil
}

// setClockScript sets the guest's clock to the Unix time $1 (GNU and
// busybox date both read @SECONDS), and the hardware clock from it where
// there is one. A constant: the time is an argument.
const setClockScript = `date -u -s "@$1" >/dev/null || exit 1; command -v hwclock >/dev/null 2>&1 && hwclock -w >/dev/null 2>&1; exit 0`

// power runs a suspend or resume task on the VM, if it is still this
// sandbox's.
func (s *vmSandbox) power(ctx context.Context, what string, call func(context.Context, string, int) (string, error)) error {
	err := s.onNode(ctx, func(node string) error {
		if ok, found, err := s.b.vms.owned(ctx, node, s.vmid, s.owner); err != nil {
			return err
		} else if !found {
			return fmt.Errorf("node %s: %w", node, errNotThere)
		} else if !ok {
			return sandbox.ErrGone
		}
		upid, err := call(ctx, node, s.vmid)
		if err == nil {
			logTask(s.b.log, what, s.vmid, s.owner.job, upid)
			err = s.b.c.WaitTask(ctx, node, upid)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s VM %d: %w", what, s.vmid, err)
	}
	return nil
}

// killScript kills a command's session: the pid its launcher recorded
// ($1, the output file's .pid) leads it. A constant: the path arrives as
// an argument.
const killScript = `p=$(cat -- "$1" 2>/dev/null) && kill -s KILL -- "-$p" "$p" 2>/dev/null; exit 0`

// parseFindRecord reads "TYPE MODE SIZE MTIME PATH" and the link target
// that find -printf '%y %m %s %T@ %p\0%l\0' wrote.
func parseFindRecord(rec, link string) (sandbox.FileInfo, bool) {
	fields := strings.SplitN(rec, " ", 5)
	if len(fields) != 5 {
		return sandbox.FileInfo{}, false
	}
	perm, err1 := strconv.ParseUint(fields[1], 8, 32)
	size, err2 := strconv.ParseInt(fields[2], 10, 64)
	secs, err3 := strconv.ParseFloat(fields[3], 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return sandbox.FileInfo{}, false
	}
	mode := fs.FileMode(perm & 0o777)
	if perm&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if perm&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if perm&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	switch fields[0] {
	case "d":
		mode |= fs.ModeDir
	case "l":
		mode |= fs.ModeSymlink
	case "p":
		mode |= fs.ModeNamedPipe
	case "s":
		mode |= fs.ModeSocket
	case "c":
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case "b":
		mode |= fs.ModeDevice
	}
	f := sandbox.FileInfo{Path: fields[4], Size: size, Mode: mode,
		ModTime: time.Unix(0, int64(secs*1e9)).UTC()}
	if mode&fs.ModeSymlink != 0 {
		f.Link = link
	}
	return f, true
}

// deadlineSeconds is how long the guest's watchdog waits: whole seconds
// until the deadline, at least one; 0 when there is none.
func deadlineSeconds(deadline, now time.Time) int64 {
	if deadline.IsZero() {
		return 0
	}
	return max(1, int64(math.Ceil(deadline.Sub(now).Seconds())))
}

// Process implements sandbox.Instance: execID is "pid:N:L:RUN" (L the
// bytes of output kept, 0 for all; RUN the command's bundle, whose
// directory holds its files), or "pid:N" and "pid:N:L" for a command an
// older delegate started, whose files are in legacyGuestDir.
func (s *vmSandbox) Process(ctx context.Context, execID string) (sandbox.Process, error) {
	pid, limit, run, err := parseExecID(execID)
	if err != nil {
		return nil, fmt.Errorf("proxmox: process %q: %w", execID, sandbox.ErrGone)
	}
	return newProcess(s, pid, limit, run), nil
}

// runNameRe: a command's bundle, "cmd-" in guestDir or an older
// delegate's "run-" in legacyGuestDir.
var runNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(cmd|run)-[0-9a-f]{16}$`) })

func parseExecID(id string) (pid int, limit int64, run string, err error) {
	f := strings.Split(id, ":")
	if len(f) < 2 || len(f) > 4 || f[0] != "pid" {
		return 0, 0, "", errors.New("not a process id")
	}
	if pid, err = strconv.Atoi(f[1]); err != nil || pid <= 0 {
		return 0, 0, "", errors.New("not a process id")
	}
	if len(f) > 2 {
		if limit, err = strconv.ParseInt(f[2], 10, 64); err != nil || limit < 0 {
			return 0, 0, "", errors.New("not a process id")
		}
	}
	if len(f) > 3 {
		if !runNameRe().MatchString(f[3]) {
			return 0, 0, "", errors.New("not a process id")
		}
		run = guestDir + "/" + f[3]
		if strings.HasPrefix(f[3], "run-") {
			run = legacyGuestDir + "/" + f[3]
		}
	}
	return pid, limit, run, nil
}

// readScript is one poll of a running job, in one agent call: the size
// of its output, the output, the status lines and the stream records
// (streams.go) from given offsets, its exit status if it ended, and
// whether its runner still lives. A header line gives the lengths (and
// the size of the stream records, -1 when there are none), so any bytes
// pass. The exit status and the runner's liveness are read before the
// output, and the output before its stream records: a poll that says the
// job ended holds all of its output, and a record of every byte of it.
// Arguments: output file, events file, output offset and count, events
// offset and count, pid, records offset and count.
const readScript = `o=$1 e=$2 f="${1%/*}/.read.$$"
a=1; kill -0 "$7" 2>/dev/null || a=0
x=$(cat -- "$o.exit" 2>/dev/null)
tail -c +"$3" -- "$o" 2>/dev/null | head -c "$4" > "$f.o"
tail -c +"$5" -- "$e" 2>/dev/null | head -c "$6" > "$f.e"
r=-1; [ -e "$o.streams" ] && r=$(($(wc -c <"$o.streams")))
tail -c +"$8" -- "$o.streams" 2>/dev/null | head -c "$9" > "$f.s"
printf '%s %s %s %s %s %s %s\n' $(($(wc -c 2>/dev/null <"$o" || echo 0))) $(($(wc -c < "$f.o"))) $(($(wc -c < "$f.e"))) "$a" "${x:--}" $(($(wc -c < "$f.s"))) "$r"
cat -- "$f.o" "$f.e" "$f.s"; rm -f -- "$f.o" "$f.e" "$f.s"`

// recordsChunk is the most of the stream records a poll reads.
const recordsChunk = 64 << 10

// Default amounts a poll reads of each stream (the engine's own chunks).
const (
	outputChunk = 256 << 10
	eventsChunk = 64 << 10
)

// process is the job's command in a VM. Its output, status lines and
// exit status are read together (see readScript): each poll is one agent
// call, shared by ReadOutput, ReadEvents and Wait.
type process struct {
	s     *vmSandbox
	pid   int
	limit int64 // output kept (0: all)
	// run is the command's bundle ("" for a command of an older
	// delegate); output and events are its files.
	run            string
	output, events string

	// started is when Exec started it (zero for a process found again).
	started time.Time

	mu              sync.Mutex
	polls           int           // Wait's polls so far
	exit            *sandbox.Exit // once known (the agent forgets a pid it reported)
	killed          bool
	snap            *snapshot // the latest poll, until its parts are used
	polled          time.Time // when the latest poll answered
	outMax          int       // what ReadOutput asks for at once
	nextOut, nextEv int64     // where the next reads will start
	streams         streamRecs
	// outDone and evDone: a read after the command's end found nothing
	// more; with its exit known too, its directory goes (cleaned).
	outDone, evDone, cleaned bool
}

func newProcess(s *vmSandbox, pid int, limit int64, run string) *process {
	p := &process{s: s, pid: pid, limit: limit, run: run, outMax: outputChunk, output: guestOutput, events: guestEvents}
	if run != "" {
		p.output, p.events = run+".d/output", run+".d/events"
	}
	return p
}

// snapshot is one poll's answer.
type snapshot struct {
	outOff, evOff int64
	out, ev       []byte
	outUsed       bool
	evUsed        bool
	outSize       int64
	alive         bool
	code          *int
	deadline      bool // the guest's watchdog killed the command
	// records: the output's stream records were read to their end (or
	// there are none, and noStreams is set: no perl in the guest).
	records, noStreams bool
}

func (p *process) ID() string {
	id := "pid:" + strconv.Itoa(p.pid)
	switch {
	case p.run != "":
		id += ":" + strconv.FormatInt(p.limit, 10) + ":" + path.Base(p.run)
	case p.limit > 0:
		id += ":" + strconv.FormatInt(p.limit, 10)
	}
	return id
}

// keep is how much of a read of max bytes from offset the output limit
// lets through.
func (p *process) keep(offset int64, max int) int {
	if p.limit <= 0 {
		return max
	}
	return int(min(int64(max), p.limit-min(offset, p.limit)))
}

// poll reads the guest once (the caller holds p.mu).
func (p *process) poll(ctx context.Context, outOff, evOff int64, outMax, evMax int) (*snapshot, error) {
	out, err := p.s.runOK(ctx, []string{"/bin/sh", "-c", readScript, "delegate-read", p.output, p.events,
		strconv.FormatInt(outOff+1, 10), strconv.Itoa(p.keep(outOff, outMax)), strconv.FormatInt(evOff+1, 10), strconv.Itoa(evMax), strconv.Itoa(p.pid),
		strconv.FormatInt(p.streams.read+int64(len(p.streams.partial))+1, 10), strconv.Itoa(recordsChunk)})
	if err != nil {
		return nil, err
	}
	head, body, ok := bytes.Cut(out, []byte{'\n'})
	f := strings.Fields(string(head))
	if !ok || len(f) != 7 {
		return nil, fmt.Errorf("read the job in VM %d: unexpected answer %q", p.s.vmid, head)
	}
	var n [3]int64
	for i := range n {
		if n[i], err = strconv.ParseInt(f[i], 10, 64); err != nil || n[i] < 0 {
			return nil, fmt.Errorf("read the job in VM %d: unexpected answer %q", p.s.vmid, head)
		}
	}
	recLen, err1 := strconv.ParseInt(f[5], 10, 64)
	recSize, err2 := strconv.ParseInt(f[6], 10, 64)
	if err1 != nil || err2 != nil || recLen < 0 || recSize < -1 {
		return nil, fmt.Errorf("read the job in VM %d: unexpected answer %q", p.s.vmid, head)
	}
	if int64(len(body)) != n[1]+n[2]+recLen {
		return nil, fmt.Errorf("read the job in VM %d: %d bytes, want %d", p.s.vmid, len(body), n[1]+n[2]+recLen)
	}
	if err := p.streams.add(body[n[1]+n[2]:]); err != nil {
		return nil, fmt.Errorf("read the job in VM %d: %w", p.s.vmid, err)
	}
	snap := &snapshot{outOff: outOff, evOff: evOff, out: body[:n[1]], ev: body[n[1] : n[1]+n[2]], outSize: n[0], alive: f[3] == "1",
		noStreams: recSize < 0, records: recSize < 0 || p.streams.read == recSize}
	code, mark, _ := strings.Cut(f[4], ":")
	if n, err := strconv.Atoi(code); err == nil {
		snap.code, snap.deadline = &n, mark == "deadline"
	}
	p.snap, p.polled = snap, time.Now()
	return snap, nil
}

// fresh: a poll younger than this is good for the reads that follow it
// (the engine reads events and output one after the other).
func (p *process) fresh() bool {
	return p.snap != nil && time.Since(p.polled) < p.s.b.cfg.PollInterval/2
}

// ReadOutput implements sandbox.Process.
func (p *process) ReadOutput(ctx context.Context, offset int64, max int) ([]sandbox.Output, error) {
	if offset < 0 || max <= 0 {
		return nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed || (p.cleaned && offset >= p.nextOut) {
		// The VM is stopped, or the command's files are gone once read to
		// their end: what was read is all there is.
		return nil, nil
	}
	if offset < p.streams.from {
		// Read again from before the records kept: read them all again.
		p.streams, p.snap = streamRecs{}, nil
	}
	p.outMax = max
	snap := p.snap
	if !p.fresh() || snap.outUsed || snap.outOff != offset || len(snap.out) > max {
		var err error
		if snap, err = p.poll(ctx, offset, p.nextEv, max, eventsChunk); err != nil {
			return nil, err
		}
	}
	snap.outUsed = true
	if len(snap.out) == 0 {
		p.outDone = p.outDone || snap.code != nil
		p.clean(ctx)
		return nil, nil
	}
	outs := []sandbox.Output{{Stream: sandbox.Combined, Data: snap.out}}
	if !snap.noStreams {
		outs = p.streams.split(offset, snap.out, snap.records)
	}
	for _, o := range outs {
		offset += int64(len(o.Data))
	}
	p.nextOut = offset
	return outs, nil
}

// ReadEvents implements sandbox.Process.
func (p *process) ReadEvents(ctx context.Context, offset int64, max int) ([]byte, error) {
	if offset < 0 || max <= 0 {
		return nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed || (p.cleaned && offset >= p.nextEv) {
		return nil, nil
	}
	snap := p.snap
	if !p.fresh() || snap.evUsed || snap.evOff != offset || len(snap.ev) > max {
		var err error
		if snap, err = p.poll(ctx, p.nextOut, offset, p.outMax, max); err != nil {
			return nil, err
		}
	}
	snap.evUsed = true
	p.nextEv = offset + int64(len(snap.ev))
	if len(snap.ev) == 0 && snap.code != nil {
		p.evDone = true
		p.clean(ctx)
	}
	return snap.ev, nil
}

// clean removes a command's directory in the guest (its inputs, output,
// events, status FIFO and exit status) once its result is read: its
// exit known, and its output and status lines read to their end. A kept
// VM runs many commands, each of which would leave its output on the
// guest's disk. A failure is only logged: the VM goes in the end. p.mu
// held.
func (p *process) clean(ctx context.Context) {
	if p.run == "" || !p.s.kept || p.cleaned || p.exit == nil || !p.outDone || !p.evDone {
		return
	}
	p.cleaned = true
	if _, err := p.s.run(ctx, []string{"/bin/rm", "-rf", "--", p.run + ".d"}); err != nil {
		p.s.b.log.Info("could not remove a command's directory in its VM", "vmid", p.s.vmid, "dir", p.run+".d", "err", err)
	}
}

// Wait implements sandbox.Process: it polls until the command has
// exited, using the engine's reads when they come often enough. An agent
// that stays silent for AgentLostAfter loses the job.
func (p *process) Wait(ctx context.Context) (sandbox.Exit, error) {
	lastSeen := time.Now()
	for {
		p.mu.Lock()
		if p.exit != nil {
			e := *p.exit
			p.mu.Unlock()
			return e, nil
		}
		if p.killed {
			p.mu.Unlock()
			return p.record(sandbox.Exit{Code: 137, Signal: "killed", Killed: true}), nil
		}
		var err error
		snap, next := p.snap, p.polled.Add(p.interval())
		if snap == nil && !p.started.IsZero() {
			next = p.started.Add(p.interval())
		}
		if (snap == nil && p.started.IsZero()) || !time.Now().Before(next) {
			snap, err = p.poll(ctx, p.nextOut, p.nextEv, p.outMax, eventsChunk)
			p.polls++
			next = time.Now().Add(p.interval())
		}
		p.mu.Unlock()
		switch {
		case err == nil && snap == nil:
			// Too early for the first look at a command just started.
		case err == nil:
			lastSeen = time.Now()
			if e, done := p.ended(ctx, snap); done {
				e = p.record(e)
				p.mu.Lock()
				p.clean(ctx)
				p.mu.Unlock()
				return e, nil
			}
		case pve.IsVMNotRunning(err) || pve.IsNotFound(err):
			// On the node it is on now (a VM that migrated is followed).
			if p.isKilled() {
				continue
			}
			return sandbox.Exit{}, fmt.Errorf("VM %d stopped while the job ran: %w", p.s.vmid, err)
		case errors.Is(err, sandbox.ErrGone):
			if p.isKilled() {
				continue
			}
			return sandbox.Exit{}, fmt.Errorf("VM %d is gone while the job ran: %w", p.s.vmid, err)
		case time.Since(lastSeen) > p.s.b.cfg.AgentLostAfter:
			return sandbox.Exit{}, fmt.Errorf("the guest agent of VM %d has not answered for %s: %w", p.s.vmid, p.s.b.cfg.AgentLostAfter, err)
		}
		select {
		case <-ctx.Done():
			return sandbox.Exit{}, ctx.Err()
		case <-time.After(max(time.Until(next), 10*time.Millisecond)):
		}
	}
}

// interval is the pause before Wait's next poll (p.mu held). A command
// just started is looked at sooner: a short one (an echo) has ended a
// tenth of a second after its start, and waiting a whole PollInterval for
// it would make it take ten times as long. The pauses double from there.
func (p *process) interval() time.Duration {
	if p.started.IsZero() {
		return p.s.b.cfg.PollInterval
	}
	return min(p.s.b.cfg.PollInterval, firstPoll<<min(p.polls, 8))
}

// firstPoll is when a new command is first looked at.
const firstPoll = 100 * time.Millisecond

// ended reads a poll: the exit status file says how the job ended; a
// runner that is gone without one (it was killed, or could not start)
// is asked of the agent.
func (p *process) ended(ctx context.Context, snap *snapshot) (sandbox.Exit, bool) {
	if snap.code != nil {
		e := sandbox.Exit{Code: *snap.code, OutputBytes: snap.outSize, Truncated: p.limit > 0 && snap.outSize > p.limit}
		if snap.deadline {
			e.DeadlineExceeded, e.Signal = true, "killed"
		}
		return e, true
	}
	if snap.alive {
		return sandbox.Exit{}, false
	}
	var st pve.ExecStatus
	err := p.s.onNode(ctx, func(node string) (err error) {
		st, err = p.s.b.c.AgentExecStatus(ctx, node, p.s.vmid, p.pid)
		return err
	})
	if err == nil && !st.Exited {
		return sandbox.Exit{}, false // not reaped yet
	}
	e := sandbox.Exit{Code: -1, OutputBytes: snap.outSize, Truncated: p.limit > 0 && snap.outSize > p.limit, Reason: fmt.Sprintf("the job's process in VM %d ended without an exit status", p.s.vmid)}
	if err == nil {
		switch {
		case st.ExitCode != nil:
			e.Code = *st.ExitCode
		case st.Signal != nil:
			e.Code, e.Signal = 128+*st.Signal, "signal "+strconv.Itoa(*st.Signal)
		}
		if msg := strings.TrimSpace(string(st.Stderr)); msg != "" {
			e.Reason = msg
		} else if st.ExitCode != nil || st.Signal != nil {
			e.Reason = ""
		}
	}
	return e, true
}

func (p *process) isKilled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}

func (p *process) record(e sandbox.Exit) sandbox.Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit == nil {
		p.exit = &e
	}
	return *p.exit
}

// Kill implements sandbox.Process: the VM is stopped at once; the guest
// is not trusted to kill its own processes.
func (p *process) Kill(ctx context.Context) error {
	p.mu.Lock()
	if p.exit != nil || p.killed {
		p.mu.Unlock()
		return nil
	}
	p.killed = true
	p.mu.Unlock()
	if p.run != "" {
		// One command of the VM's: its session (its process group, which
		// the launcher made with setsid) is killed, and the VM's other
		// commands go on. A command that already ended has nothing left
		// to kill.
		if _, err := p.s.run(ctx, []string{"/bin/sh", "-c", killScript, "delegate-kill", p.output + ".pid"}); err != nil {
			return fmt.Errorf("kill the command in VM %d: %w", p.s.vmid, err)
		}
		return nil
	}
	// A command of an older delegate, which ran alone in its VM: the VM is
	// stopped, only if it is still this job's.
	err := p.s.onNode(ctx, func(node string) error {
		if ok, found, err := p.s.b.vms.owned(ctx, node, p.s.vmid, p.s.owner); err != nil || !ok {
			if err == nil && !found {
				err = fmt.Errorf("node %s: %w", node, errNotThere)
			}
			return err
		}
		upid, err := p.s.b.c.StopVM(ctx, node, p.s.vmid)
		if err == nil {
			logTask(p.s.b.log, "stop", p.s.vmid, p.s.owner.job, upid)
			err = p.s.b.c.WaitTask(ctx, node, upid)
		}
		return err
	})
	if err != nil && !pve.IsVMNotRunning(err) && !pve.IsNotFound(err) && !errors.Is(err, sandbox.ErrGone) {
		return fmt.Errorf("stop VM %d: %w", p.s.vmid, err)
	}
	return nil
}
