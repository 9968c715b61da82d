//go:build linux

package local

import (
	"path/filepath"
	"strings"
	"sync"
)

// liveSet is what this server holds in memory of the sandboxes it
// serves: the processes it started itself (the shims are its children),
// by their directory, so that Wait blocks on them instead of polling;
// by kept sandbox directory, the id of a command directory made ahead
// of the sandbox's next command (makeSpareExecDir); and the ids of
// sandboxes being created, which List leaves out, so that a cleanup
// sweep cannot destroy one under Create's feet. Everything else of a
// sandbox is in its directory.
type liveSet struct {
	mu         sync.Mutex
	procs      map[string]*process
	spareExecs map[string]string
	creating   map[string]bool
}

func newLiveSet() *liveSet {
	return &liveSet{procs: map[string]*process{}, spareExecs: map[string]string{}, creating: map[string]bool{}}
}

// add records p, started in dir.
func (l *liveSet) add(dir string, p *process) {
	l.mu.Lock()
	l.procs[dir] = p
	l.mu.Unlock()
}

// get is the process this server started in dir, or nil.
func (l *liveSet) get(dir string) *process {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.procs[dir]
}

// drop forgets p, if it is still the one of dir.
func (l *liveSet) drop(dir string, p *process) {
	l.mu.Lock()
	if l.procs[dir] == p {
		delete(l.procs, dir)
	}
	l.mu.Unlock()
}

// forget forgets a destroyed sandbox: its processes (the sandbox's, and
// each command's of a kept one) and a command directory made ahead.
func (l *liveSet) forget(dir string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for d := range l.procs {
		if d == dir || strings.HasPrefix(d, dir+string(filepath.Separator)) {
			delete(l.procs, d)
		}
	}
	delete(l.spareExecs, dir)
}

// spare is the id of the command directory made ahead in the kept
// sandbox dir, "" for none; take takes it (the next command's).
func (l *liveSet) spare(dir string, take bool) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.spareExecs[dir]
	if take {
		delete(l.spareExecs, dir)
	}
	return id
}

// putSpare records id as the command directory made ahead in dir,
// unless there is one already.
func (l *liveSet) putSpare(dir, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, have := l.spareExecs[dir]; !have {
		l.spareExecs[dir] = id
	}
}

// create marks sandbox id as being created until done is called.
func (l *liveSet) create(id string) (done func()) {
	l.mu.Lock()
	l.creating[id] = true
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		delete(l.creating, id)
		l.mu.Unlock()
	}
}

// isCreating says whether sandbox id is being created.
func (l *liveSet) isCreating(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.creating[id]
}
