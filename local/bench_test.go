//go:build linux

package local

import (
	"context"
	"os/exec"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// BenchmarkExecTrue is the baseline: a plain fork/exec of /bin/true.
func BenchmarkExecTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSandboxTrue is a whole sandbox life for /bin/true: Create,
// Exec, Wait, Destroy.
func BenchmarkSandboxTrue(b *testing.B) {
	be := newBackend(b, 0)
	ctx := context.Background()
	for b.Loop() {
		sb, err := be.Create(ctx, defaultSpec())
		if err != nil {
			b.Fatal(err)
		}
		p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/true"}})
		if err != nil {
			b.Fatal(err)
		}
		if exit, err := p.Wait(ctx); err != nil || exit.Code != 0 {
			b.Fatalf("exit %+v, %v", exit, err)
		}
		if err := sb.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSandboxExecTrue times only Exec and Wait of /bin/true in a
// sandbox created beforehand (shim + init + namespaces + root + job).
func BenchmarkSandboxExecTrue(b *testing.B) {
	be := newBackend(b, 0)
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		sb, err := be.Create(ctx, defaultSpec())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/true"}})
		if err != nil {
			b.Fatal(err)
		}
		if exit, err := p.Wait(ctx); err != nil || exit.Code != 0 {
			b.Fatalf("exit %+v, %v", exit, err)
		}
		b.StopTimer()
		if err := sb.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
