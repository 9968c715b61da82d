package delegate_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/sqlite"
)

// Submit a job, wait for it to end, and read its result. The engine runs
// it on sandboxtest's in-memory fake backend, whose processes run nothing:
// the example plays the job's part (its output, its exit), which a real
// backend's sandbox would.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "delegate-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := sqlite.Open(ctx, filepath.Join(dir, "jobs.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	backend := sandboxtest.NewFake()
	eng := engine.New(store, backend, engine.Config{ArtifactDir: filepath.Join(dir, "artifacts")})
	if err := eng.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer eng.Close()
	var jobs delegate.JobService = eng // what every adapter sees of it

	job, err := jobs.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "echo hello"}, delegate.SubmitOptions{})
	if err != nil {
		log.Fatal(err)
	}
	// Submit returns at once: the job is pending, or already provisioning.
	fmt.Println("submitted; finished yet:", job.Status.Terminal())

	// The job's process, as the fake backend started it.
	p := <-backend.Started
	p.Write([]byte("hello\n"))
	p.Finish(sandbox.Exit{Code: 0})

	done, err := jobs.Wait(ctx, job.ID)
	if err != nil {
		log.Fatal(err)
	}
	res, err := jobs.Result(ctx, job.ID, delegate.ResultOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("finished:", done.Status, "exit code", *res.ExitCode)
	fmt.Printf("output: %q\n", res.Output)
	// Output:
	// submitted; finished yet: false
	// finished: success exit code 0
	// output: "hello\n"
}
