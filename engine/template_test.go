package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// templateBackend is the mock backend with a fixed set of templates it
// checks at submit time.
type templateBackend struct {
	*sandboxtest.Fake
	names []string
	err   error // returned for every name when set (the backend's trouble)
}

func (b templateBackend) CheckTemplate(ctx context.Context, name string) error {
	if b.err != nil {
		return b.err
	}
	for _, n := range b.names {
		if n == name {
			return nil
		}
	}
	return &sandbox.TemplateError{Name: name, Reason: "no such root filesystem", Available: b.names}
}

func TestSubmitChecksTemplate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Several engines on one store: none may take another's jobs.
	f := newFixture(t, engine.Config{OwnerAlive: func(string) bool { return true }})
	tb := templateBackend{Fake: f.backend, names: []string{"bookworm", "alpine"}}
	eng := f.start(tb)

	m := script("ls /")
	m.VMTemplate = "/"
	_, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
	var fe *delegate.FieldError
	if !errors.As(err, &fe) || !errors.Is(err, delegate.ErrInvalid) || fe.Field != "manifest.vmTemplate" ||
		!strings.Contains(fe.Rule, "available: bookworm, alpine") {
		t.Fatalf("vmTemplate \"/\": %v, want a field error on manifest.vmTemplate listing the templates", err)
	}
	if jobs, _, _ := f.store.ListJobs(ctx, delegate.JobFilter{}); len(jobs) != 0 {
		t.Fatalf("the refused job was stored: %d jobs", len(jobs))
	}

	m.VMTemplate = "alpine"
	job, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := f.started()
	if p.Sandbox.Spec.Template != "alpine" {
		t.Fatalf("spec template %q", p.Sandbox.Spec.Template)
	}
	p.Finish(sandbox.Exit{})
	f.wait(eng, job.ID)

	// The server's own default is the server's fault, not the submitter's.
	f.cfg.Defaults.VMTemplate = "gone"
	eng2 := f.start(tb)
	_, err = eng2.Submit(ctx, script("true"), delegate.SubmitOptions{})
	if err == nil || errors.As(err, &fe) || !strings.Contains(err.Error(), "default vmTemplate") {
		t.Fatalf("bad default: %v", err)
	}
	// Trouble of the backend itself is no field error either.
	tb.err = errors.New("cluster unreachable")
	eng3 := f.start(tb)
	m.VMTemplate = "alpine"
	if _, err := eng3.Submit(ctx, m, delegate.SubmitOptions{}); err == nil || errors.Is(err, delegate.ErrInvalid) || !strings.Contains(err.Error(), "cluster unreachable") {
		t.Fatalf("backend error: %v", err)
	}
}
