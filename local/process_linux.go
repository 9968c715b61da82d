//go:build linux

package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// process is a command of a sandbox. done is set when this server
// started the shim (its child); a process found again after a restart has
// none and polls its directory instead. dir holds its files: the sandbox
// directory for a sandbox's one command, execs/<id> for one of many.
type process struct {
	s    *sbox
	id   string
	dir  string
	done chan struct{}
	// recorded is closed once the shim of a kept sandbox's command has
	// recorded its end (nil for a sandbox's one command).
	recorded chan struct{}
	// told is what the shim wrote on its pipe before it closed it (nil
	// when there is no pipe): the command's exit record, from a C shim;
	// read only after recorded is closed.
	told    []byte
	shimErr error // how the shim exited; read only after done is closed
}

// maxToldExit bounds what Exec reads of a shim's pipe: an exit record is
// at most 9000 bytes (write_exit in shim_linux.c).
const maxToldExit = 16 << 10

func (p *process) path(name string) string { return filepath.Join(p.dir, name) }

var _ sandbox.Process = (*process)(nil)

func (p *process) ID() string { return p.id }

// ReadOutput implements sandbox.Process.
func (p *process) ReadOutput(ctx context.Context, offset int64, max int) ([]sandbox.Output, error) {
	data, err := p.readLog(fileOutput, offset, max)
	if err != nil || len(data) == 0 {
		return nil, err
	}
	return splitStreams(p.path(fileStreams), offset, data)
}

// splitStreams cuts data, the output from offset on, into pieces by the
// stream records in the file at path (streams.go). Without the file (the
// shim of a server from before the streams were told apart) it is all
// Combined.
func splitStreams(path string, offset int64, data []byte) ([]sandbox.Output, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return []sandbox.Output{{Stream: sandbox.Combined, Data: data}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", fileStreams, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", fileStreams, err)
	}
	n := st.Size() / streamRecordSize // a record being written is not there yet
	var rerr error
	at := func(i int64) int64 {
		var b [streamRecordSize]byte
		if _, err := f.ReadAt(b[:], i*streamRecordSize); err != nil {
			rerr = err
			return 0
		}
		off, _ := decodeStreamRecord(b[:])
		return off
	}
	// The last record at or before offset says the stream of data[0]:
	// a binary search, for a job switching streams often has many.
	first := int64(sort.Search(int(n), func(i int) bool { return at(int64(i)) > offset })) - 1
	if rerr != nil {
		return nil, fmt.Errorf("read %s: %w", fileStreams, rerr)
	}
	var (
		outs []sandbox.Output
		pos  = offset // where the piece being cut starts
		cur  = sandbox.Combined
		end  = offset + int64(len(data))
		buf  = make([]byte, 512*streamRecordSize)
	)
	for i := max(first, 0); i < n && pos < end; {
		k, err := f.ReadAt(buf[:min(int64(len(buf)), (n-i)*streamRecordSize)], i*streamRecordSize)
		if k < streamRecordSize && err != nil {
			return nil, fmt.Errorf("read %s: %w", fileStreams, err)
		}
		for j := 0; j+streamRecordSize <= k && pos < end; j, i = j+streamRecordSize, i+1 {
			off, s := decodeStreamRecord(buf[j:])
			if off > pos {
				cut := min(off, end)
				outs = sandbox.Append(outs, cur, data[pos-offset:cut-offset])
				pos = cut
			}
			cur = s
		}
	}
	if pos < end {
		outs = sandbox.Append(outs, cur, data[pos-offset:])
	}
	return outs, nil
}

// readExit returns the recorded exit, os.ErrNotExist while there is none,
// or sandbox.ErrGone when the sandbox itself has disappeared.
func (p *process) readExit() (sandbox.Exit, error) {
	var r exitRecord
	if told := p.toldExit(); len(told) > 0 && json.Unmarshal(told, &r) == nil {
		return p.withMisses(r.exit()), nil // as the shim told it, before the file
	}
	r = exitRecord{}
	if err := readJSON(p.path(fileExit), &r); err != nil {
		if errors.Is(err, os.ErrNotExist) && p.s.gone() {
			return sandbox.Exit{}, fmt.Errorf("sandbox %s: %w", p.s.id, sandbox.ErrGone)
		}
		return sandbox.Exit{}, err
	}
	return p.withMisses(r.exit()), nil
}

// withMisses adds to the command's end the caches it had an empty one
// of, as Exec recorded them (exec.json).
func (p *process) withMisses(e sandbox.Exit) sandbox.Exit {
	var rec execRecord
	if readJSON(p.path(fileExec), &rec) == nil {
		e.CacheMisses = rec.CacheMisses
	}
	return e
}

// toldExit is what the shim wrote on its pipe, once it has closed it.
func (p *process) toldExit() []byte {
	if p.recorded == nil {
		return nil
	}
	select {
	case <-p.recorded:
		return p.told
	default:
		return nil
	}
}

// exit is the record as Wait returns it.
func (r exitRecord) exit() sandbox.Exit {
	if r.Signal == "" && r.Signo > 0 {
		r.Signal = syscall.Signal(r.Signo).String()
	}
	return sandbox.Exit{
		Code:        r.Code,
		Signal:      r.Signal,
		OOMKilled:   r.OOMKilled,
		OutputBytes: r.OutputBytes,
		Truncated:   r.Truncated,
		Killed:      r.Killed,

		DeadlineExceeded: r.DeadlineExceeded,
		Reason:           r.Reason,
		EndedAt:          endedAt(r.EndedAt),
	}
}

// Wait implements sandbox.Process.
func (p *process) Wait(ctx context.Context) (sandbox.Exit, error) {
	if p.done != nil {
		// This server's child: its end, or (a kept sandbox's command,
		// whose shim stays while what the command left in the background
		// holds its output) the shim's word that it has recorded the end.
		select {
		case <-p.recorded:
		case <-p.done:
		case <-ctx.Done():
			return sandbox.Exit{}, ctx.Err()
		}
		if p.recorded != nil {
			// Closed once the command's caches are given back too
			// (execKept), which its shim's end does not wait for.
			select {
			case <-p.recorded:
			case <-ctx.Done():
				return sandbox.Exit{}, ctx.Err()
			}
		}
		exit, err := p.readExit()
		if errors.Is(err, os.ErrNotExist) {
			select {
			case <-p.done:
			case <-ctx.Done():
				return sandbox.Exit{}, ctx.Err()
			}
			if exit, err = p.readExit(); errors.Is(err, os.ErrNotExist) {
				what := "the sandbox shim ended"
				if p.shimErr != nil { // a shim this server started, and how it ended
					what += fmt.Sprintf(" (%v)", p.shimErr)
				}
				return sandbox.Exit{}, p.lostError(what)
			}
		}
		return exit, err
	}
	tick := time.NewTicker(sandbox.PollInterval)
	defer tick.Stop()
	for {
		exit, err := p.readExit()
		if !errors.Is(err, os.ErrNotExist) {
			return exit, err
		}
		pid, alive := shimAlive(p.dir)
		if !alive {
			// It may have recorded the exit just before it ended.
			if exit, err := p.readExit(); !errors.Is(err, os.ErrNotExist) {
				return exit, err
			}
			if pid != 0 {
				return sandbox.Exit{}, p.lostError(fmt.Sprintf("the sandbox shim (pid %d) is gone", pid))
			}
			if st, err := os.Stat(p.path(fileExec)); err != nil || time.Since(st.ModTime()) > shimGrace {
				return sandbox.Exit{}, p.lostError("the sandbox shim never started")
			}
		}
		select {
		case <-ctx.Done():
			return sandbox.Exit{}, ctx.Err()
		case <-tick.C:
		}
	}
}

// lostError explains a process whose end was not recorded, with the tail
// of the shim's log for whoever has to find out why.
func (p *process) lostError(what string) error {
	msg := fmt.Sprintf("sandbox %s: %s without recording how the command ended (killed or crashed); its result is lost", p.s.id, what)
	if log, err := os.ReadFile(p.path(fileShimLog)); err == nil && len(log) > 0 {
		tail := strings.TrimSpace(string(log[max(0, len(log)-500):]))
		msg += "; shim log: " + tail
	}
	return errors.New(msg)
}

// Kill implements sandbox.Process. It returns once every process of the
// command (of the sandbox, for its one command) has been sent SIGKILL;
// Wait then reports Killed. A kept sandbox's command is killed with
// what it started (its cgroup, its process group); the sandbox's other
// commands go on.
func (p *process) Kill(ctx context.Context) error {
	if p.s.gone() {
		return nil
	}
	st, _ := p.s.state()
	if p.dir != p.s.dir {
		return killExec(p.dir, p.id, st.Cgroup)
	}
	return killSandbox(p.s.dir, st.Cgroup)
}

// endedAt is a record's end time (zero for none).
func endedAt(ns int64) time.Time {
	if ns <= 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}
