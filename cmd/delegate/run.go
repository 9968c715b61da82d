package main

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// cmdRun runs one job in an embedded engine and returns the exit code the
// process should have: the job's own, 124 for a timeout, 130 when cancelled.
func cmdRun(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	script := fs.String("script", "", "shell script to run (agentType script)")
	manifestPath := fs.String("manifest", "", "manifest JSON file (- for stdin)")
	timeout := fs.Int("timeout", 0, "timeout in seconds (default: manifest's, else DEFAULT_TIMEOUT)")
	memory := fs.String("memory", "", "memory limit, e.g. 512M")
	cpu := fs.Float64("cpu", 0, "cpu cores")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	var files, envs multiFlag
	fs.Var(&files, "file", "LOCAL:REMOTE file to put in the sandbox (repeatable; REMOTE relative to /workspace)")
	fs.Var(&envs, "env", "KEY=VALUE environment variable (repeatable)")
	cfg.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 0, err
	}
	if err := cfg.check(); err != nil {
		return 0, usageError{err}
	}
	m, err := buildManifest(*script, *manifestPath, fs.Args(), files, envs)
	if err != nil {
		return 0, err
	}
	if *timeout != 0 {
		m.Timeout = *timeout
	}
	if *memory != "" || *cpu != 0 {
		if m.Resources == nil {
			m.Resources = &delegate.Resources{}
		}
		if *memory != "" {
			m.Resources.Memory = *memory
		}
		if *cpu != 0 {
			m.Resources.CPU = *cpu
		}
	}

	log := newLogger(stderr, max(cfg.LogLevel, slogWarn))
	a, err := openApp(ctx, cfg, log, true, "")
	if err != nil {
		return 0, err
	}
	defer a.Close()
	if err := a.eng.Start(context.WithoutCancel(ctx)); err != nil {
		return 0, err
	}
	job, err := a.eng.Submit(ctx, m)
	if err != nil {
		return 0, err
	}
	progress := newProgressLine(stderr, *quiet, job.ID)
	var offset int64
	flush := func() {
		for {
			b, err := a.eng.Output(context.Background(), job.ID, offset, 64<<10)
			if err != nil || len(b) == 0 {
				return
			}
			progress.clear()
			stdout.Write(b)
			offset += int64(len(b))
		}
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		j, err := a.eng.Wait(wctx, job.ID)
		cancel()
		if err != nil {
			return 0, err
		}
		flush()
		if j.Status.Terminal() {
			progress.done(j)
			return exitCode(j), nil
		}
		if ctx.Err() != nil {
			// Ctrl-C: cancel the job, and wait for it to be killed.
			progress.clear()
			fmt.Fprintf(stderr, "delegate: cancelling %s\n", job.ID)
			a.eng.Cancel(context.Background(), job.ID)
			ctx = context.Background()
			continue
		}
		progress.show(j)
	}
}

func exitCode(j *delegate.Job) int {
	switch {
	case j.Status == delegate.StatusTimeout:
		return 124
	case j.Status == delegate.StatusCancelled:
		return 130
	case j.ExitCode != nil:
		return *j.ExitCode
	case j.Status == delegate.StatusSuccess:
		return 0
	}
	return 1
}

func buildManifest(script, manifestPath string, rest []string, files, envs []string) (delegate.Manifest, error) {
	var m delegate.Manifest
	switch {
	case script != "" && manifestPath != "":
		return m, usagef("give --script or --manifest, not both")
	case manifestPath != "":
		var data []byte
		var err error
		if manifestPath == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(manifestPath)
		}
		if err != nil {
			return m, fmt.Errorf("--manifest: %w", err)
		}
		// Validated by the engine, after the flags are applied.
		if m, err = delegate.DecodeManifest(data); err != nil {
			return m, fmt.Errorf("--manifest %s: %w", manifestPath, err)
		}
	case script != "":
		m = delegate.Manifest{AgentType: delegate.AgentScript, Task: script}
	default:
		return m, usagef("give --script CMD or --manifest FILE (see delegate help)")
	}
	if len(rest) > 0 {
		return m, usagef("unexpected argument %q (quote the script: --script 'cmd args')", rest[0])
	}
	for _, f := range files {
		localPath, remote, ok := strings.Cut(f, ":")
		if !ok || localPath == "" || remote == "" {
			return m, usagef("--file %q: must be LOCAL:REMOTE", f)
		}
		data, err := os.ReadFile(localPath)
		if err != nil {
			return m, fmt.Errorf("--file: %w", err)
		}
		m.Files = append(m.Files, delegate.File{Path: remote, Content: base64.StdEncoding.EncodeToString(data)})
	}
	for _, e := range envs {
		k, v, ok := strings.Cut(e, "=")
		if !ok {
			return m, usagef("--env %q: must be KEY=VALUE", e)
		}
		if m.Env == nil {
			m.Env = map[string]string{}
		}
		m.Env[k] = v
	}
	return m, nil
}
