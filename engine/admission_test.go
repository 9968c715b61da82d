package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// roomy is a mock backend with a finite amount of memory: Admit reserves
// a job's memory, Destroy gives it back.
type roomy struct {
	*sandboxtest.Fake
	mu       sync.Mutex
	capacity int64
	used     int64
	held     map[string]int64 // sandbox id -> memory
	admits   int
	fail     error // returned by Admit when set
}

type reservation struct {
	r    *roomy
	mem  int64
	used bool
	done bool
}

func (v *reservation) Release() {
	v.r.mu.Lock()
	defer v.r.mu.Unlock()
	if !v.used && !v.done {
		v.r.used -= v.mem
	}
	v.done = true
}

func (r *roomy) Admit(ctx context.Context, spec sandbox.Spec) (sandbox.Admission, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admits++
	if r.fail != nil {
		return nil, r.fail
	}
	if r.used+spec.MemoryBytes > r.capacity {
		return nil, &sandbox.CapacityError{Reason: fmt.Sprintf("%d of %d bytes free", r.capacity-r.used, r.capacity)}
	}
	r.used += spec.MemoryBytes
	return &reservation{r: r, mem: spec.MemoryBytes}, nil
}

func (r *roomy) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	v, ok := spec.Admission.(*reservation)
	if !ok {
		return nil, errors.New("created without admission")
	}
	spec.Step("making the sandbox")
	sb, err := r.Fake.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	v.used = true
	r.held[sb.ID()] = v.mem
	r.mu.Unlock()
	return sb, nil
}

func (r *roomy) Destroy(ctx context.Context, id string) error {
	r.mu.Lock()
	r.used -= r.held[id]
	delete(r.held, id)
	r.mu.Unlock()
	return r.Fake.Destroy(ctx, id)
}

func (r *roomy) free() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.capacity - r.used
}

func newRoomy(capacity int64) *roomy {
	return &roomy{Fake: sandboxtest.NewFake(), capacity: capacity, held: map[string]int64{}}
}

func sized(task, mem string) delegate.Manifest {
	m := script(task)
	m.Resources = &delegate.Resources{Memory: mem}
	return m
}

// TestAdmissionQueuesForCapacity: jobs that do not fit wait as pending,
// saying why, without holding a run slot; they run as room is freed.
func TestAdmissionQueuesForCapacity(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{MaxConcurrent: 3, AdmissionRetry: time.Hour})
	f.eng.Close()
	b := newRoomy(2<<30 + 64<<20)
	f.backend = b.Fake
	eng := f.start(b)
	f.eng = eng

	big1 := f.submit(sized("big 1", "1G"))
	big2 := f.submit(sized("big 2", "1G"))
	p1, p2 := f.started(), f.started()
	m3 := sized("big 3", "1G")
	m3.StatusMode = delegate.StatusModeDetailed
	big3 := f.submit(m3)
	eventually(t, "big 3 waits for capacity", func() bool {
		j, _ := eng.Get(context.Background(), big3.ID)
		return j.Status == delegate.StatusPending && strings.HasPrefix(j.Progress, "waiting for capacity: ") && strings.Contains(j.Progress, "67108864 of 2214592512 bytes free")
	})
	// The waiting job holds no run slot: a small job still gets one.
	small := f.submit(sized("small", "16M"))
	ps := f.started()
	if ps.Sandbox.Spec.JobID != small.ID {
		t.Fatalf("started %s, want the small job", ps.Sandbox.Spec.JobID)
	}
	ps.Finish(sandbox.Exit{})
	f.wait(eng, small.ID)
	if j, _ := eng.Get(context.Background(), big3.ID); j.Status != delegate.StatusPending {
		t.Fatalf("big 3 is %s with no room", j.Status)
	}
	// Room is freed when a job's sandbox is destroyed: the waiting job runs.
	p1.Finish(sandbox.Exit{})
	p3 := f.started()
	if p3.Sandbox.Spec.JobID != big3.ID {
		t.Fatalf("started %s, want big 3", p3.Sandbox.Spec.JobID)
	}
	p2.Finish(sandbox.Exit{})
	p3.Finish(sandbox.Exit{})
	for _, id := range []string{big1.ID, big2.ID, big3.ID} {
		if j := f.wait(eng, id); j.Status != delegate.StatusSuccess {
			t.Fatalf("job %s: %s %s", id, j.Status, j.Error)
		}
	}
	evs, _ := eng.Timeline(context.Background(), big3.ID)
	// The wait, then the backend's provisioning step.
	if len(evs) != 2 || !strings.HasPrefix(evs[0].Message, "waiting for capacity") || evs[1].Message != "making the sandbox" {
		t.Fatalf("timeline of the job that waited: %+v", evs)
	}
	// Each sandbox is destroyed just after its job is marked finished.
	eventually(t, "every byte free again", func() bool { return b.free() == 2<<30+64<<20 })
}

// TestAdmissionRetries: room freed outside this engine is found by the
// periodic retry; a job cancelled while it waits never runs.
func TestAdmissionRetries(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{AdmissionRetry: 50 * time.Millisecond})
	f.eng.Close()
	b := newRoomy(1 << 30)
	b.used = 1 << 30 // held by someone else
	f.backend = b.Fake
	eng := f.start(b)
	f.eng = eng

	cancelled := f.submit(sized("never", "512M"))
	later := f.submit(sized("later", "512M"))
	eventually(t, "both wait", func() bool {
		for _, id := range []string{cancelled.ID, later.ID} {
			if j, _ := eng.Get(context.Background(), id); !strings.HasPrefix(j.Progress, "waiting for capacity") {
				return false
			}
		}
		return true
	})
	if _, ok, err := eng.Cancel(context.Background(), cancelled.ID); !ok || err != nil {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	b.mu.Lock()
	b.used = 0
	b.mu.Unlock()
	p := f.started()
	if p.Sandbox.Spec.JobID != later.ID {
		t.Fatalf("started %s", p.Sandbox.Spec.JobID)
	}
	p.Finish(sandbox.Exit{})
	if j := f.wait(eng, later.ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s", j.Status, j.Error)
	}
	if j := f.wait(eng, cancelled.ID); j.Status != delegate.StatusCancelled || j.SandboxID != "" {
		t.Fatalf("cancelled job: %+v", j)
	}
}

// TestAdmissionError: an admission error that is not about capacity is
// the job's: it fails at once with it.
func TestAdmissionError(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	f.eng.Close()
	b := newRoomy(1 << 30)
	b.fail = errors.New("vmTemplate: no template \"x\"")
	eng := f.start(b)
	f.eng = eng
	j := f.submit(script("true"))
	got := f.wait(eng, j.ID)
	if got.Status != delegate.StatusFailed || got.Error != `provisioning failed: vmTemplate: no template "x"` {
		t.Fatalf("%s %q", got.Status, got.Error)
	}
}

// TestProvisioningSteps: a backend's steps become the job's progress, and
// entries of its timeline when it keeps one.
func TestProvisioningSteps(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	f.eng.Close()
	b := newRoomy(1 << 30)
	seen := make(chan string, 10)
	b.CreateHook = func(ctx context.Context, spec sandbox.Spec) error {
		j, err := f.store.GetJob(ctx, spec.JobID)
		if err != nil {
			return err
		}
		seen <- j.Progress
		return nil
	}
	f.backend = b.Fake
	eng := f.start(b)
	f.eng = eng
	for _, mode := range []delegate.StatusMode{delegate.StatusModeSimple, delegate.StatusModeDetailed} {
		m := script("true")
		m.StatusMode = mode
		j := f.submit(m)
		p := f.started()
		if got := <-seen; got != "making the sandbox" {
			t.Fatalf("progress during Create: %q", got)
		}
		eventually(t, `progress "running"`, func() bool {
			got, _ := eng.Get(context.Background(), j.ID)
			return got.Progress == "running"
		})
		p.Finish(sandbox.Exit{})
		f.wait(eng, j.ID)
		evs, err := f.store.Events(context.Background(), j.ID)
		if err != nil {
			t.Fatal(err)
		}
		steps := 0
		for _, ev := range evs {
			if ev.Message == "making the sandbox" {
				steps++
			}
		}
		if want := map[delegate.StatusMode]int{delegate.StatusModeSimple: 0, delegate.StatusModeDetailed: 1}[mode]; steps != want {
			t.Errorf("statusMode %s: %d timeline entries for the step, want %d: %+v", mode, steps, want, evs)
		}
	}
}
