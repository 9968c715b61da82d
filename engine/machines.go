package engine

import (
	"sync"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// machines is what this engine knows of kept sandboxes' machines, by
// sandbox id, under its own lock: the machines it has found (Recover) or
// made, a lock per sandbox that keeps one change of its machine (resume,
// pause, destroy) at a time, and the sandboxes whose machine is being
// made. The keeper and the timers share it.
type machines struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex // by sandbox id
	// insts are the machines this engine has found (Recover) or made, by
	// sandbox id: a command or file call on a sandbox in use needs no
	// Recover (on Proxmox, a config read) each time. An entry goes when
	// the sandbox ends or a call on it fails.
	insts map[string]sandbox.Instance
	// making are the sandboxes whose machine is being made: the sweep
	// spares a machine made for one of them.
	making map[string]struct{}
}

func newMachines() *machines {
	return &machines{locks: map[string]*sync.Mutex{}, insts: map[string]sandbox.Instance{}, making: map[string]struct{}{}}
}

// known returns the machine of a sandbox found before, if it is still
// the one the store names.
func (k *machines) known(sb *delegate.Sandbox) sandbox.Instance {
	k.mu.Lock()
	defer k.mu.Unlock()
	if inst := k.insts[sb.ID]; inst != nil && inst.ID() == sb.Instance {
		return inst
	}
	return nil
}

func (k *machines) remember(id string, inst sandbox.Instance) {
	k.mu.Lock()
	k.insts[id] = inst
	k.mu.Unlock()
}

// forget drops what is known of a sandbox's machine (it ended, or a call
// on it failed: the next use finds it again, and finds it gone if it is).
func (k *machines) forget(id string) {
	k.mu.Lock()
	delete(k.insts, id)
	k.mu.Unlock()
}

// lock serializes the changes of one sandbox's machine.
func (k *machines) lock(id string) func() {
	k.mu.Lock()
	l := k.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		k.locks[id] = l
	}
	k.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// opening marks sandbox id as having its machine made, until the
// function it returns is called.
func (k *machines) opening(id string) (done func()) {
	k.mu.Lock()
	k.making[id] = struct{}{}
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		delete(k.making, id)
		k.mu.Unlock()
	}
}

// isOpening reports whether sandbox id has its machine made now.
func (k *machines) isOpening(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.making[id]
	return ok
}
