package workspace

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"
)

// benchTree writes a tree of 10,000 files and 100 MiB (sizes from 1 to
// about 20 KiB, text made of words, compressible as source code is) in
// 100 directories.
func benchTree(b *testing.B, git bool) string {
	b.Helper()
	dir := b.TempDir()
	rng := rand.New(rand.NewSource(7))
	words := []string{"func", "return", "if", "err", "nil", "for", "range", "package", "import", "type", "struct", "string", "int", "ctx", "value", "x", "y", "{", "}", "(", ")", ":=", "=", "\n", "\t"}
	const files, total = 10_000, 100 << 20
	sizes := make([]int, files)
	sum := 0
	for i := range sizes {
		sizes[i] = 1 + rng.Intn(2*total/files)
		sum += sizes[i]
	}
	sizes[0] += total - sum // exactly 100 MiB
	if sizes[0] < 1 {
		sizes[0] = 1
	}
	var buf bytes.Buffer
	for i, n := range sizes {
		buf.Reset()
		for buf.Len() < n {
			buf.WriteString(words[rng.Intn(len(words))])
			buf.WriteByte(' ')
		}
		p := filepath.Join(dir, fmt.Sprintf("d%02d/f%04d.go", i%100, i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, buf.Bytes()[:n], 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if git {
		git := func(args ...string) {
			if out, err := gitTry(b, dir, args...); err != nil {
				b.Fatalf("git %v: %v\n%s", args, err, out)
			}
		}
		git("init", "-q", "-b", "main")
		os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("*.o\nbuild/\n"), 0o644)
		git("add", "-A")
		git("commit", "-q", "-m", "bench")
	}
	return dir
}

// timing is a baseline's cost: wall-clock time, and CPU time (user and
// system), which the other work on a shared machine disturbs less.
type timing struct{ wall, cpu time.Duration }

// tarTime is what GNU tar takes to write the tree to a pipe (the median
// of five runs; not to /dev/null, which tar detects and skips), with args
// ("-c" or "-cz").
func tarTime(b *testing.B, dir, args string) timing {
	b.Helper()
	if _, err := exec.LookPath("tar"); err != nil {
		b.Skip("tar is not installed")
	}
	var ts []timing
	for range 5 {
		cmd := exec.Command("tar", args+"f", "-", "-C", dir, ".")
		cmd.Stdout = io.Discard // through a pipe Go drains
		start := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		ts = append(ts, timing{time.Since(start), cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()})
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].wall < ts[j].wall })
	return ts[2]
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// toPipe runs write with the writing end of a pipe whose reading end is
// drained (or read by read), as a sandbox's transfer would be.
func toPipe(b *testing.B, write func(io.Writer) error, read func(io.Reader) error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var err error
		if read != nil {
			err = read(pr)
		} else {
			_, err = io.Copy(io.Discard, pr)
		}
		io.Copy(io.Discard, pr)
		pr.Close()
		done <- err
	}()
	werr := write(pw)
	pw.Close()
	if rerr := <-done; werr != nil || rerr != nil {
		b.Fatal(werr, rerr)
	}
}

// report prints the figures: per operation, wall and CPU milliseconds,
// tar's, and the ratios.
func report(b *testing.B, tar timing, cpu time.Duration) {
	n := time.Duration(b.N)
	wall, cpu := b.Elapsed()/n, cpu/n
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(wall), "ms/op")
	b.ReportMetric(ms(cpu), "cpu-ms/op")
	b.ReportMetric(ms(tar.wall), "tar-ms")
	b.ReportMetric(ms(tar.cpu), "tar-cpu-ms")
	b.ReportMetric(float64(wall)/float64(tar.wall), "x-tar")
	b.ReportMetric(float64(cpu)/float64(tar.cpu), "x-tar-cpu")
}

// BenchmarkImport: Scan and Archive of a 10,000-file, 100 MiB tree into a
// pipe (the goal: 1 s), against tar -c of the same tree.
func BenchmarkImport(b *testing.B) {
	for _, tc := range []struct {
		name string
		git  bool
		gzip bool
	}{{"dir", false, false}, {"git", true, false}, {"dir-gzip", false, true}} {
		b.Run(tc.name, func(b *testing.B) {
			dir := benchTree(b, tc.git)
			args := "-c"
			if tc.gzip {
				args = "-cz" // gzip costs what it costs: against tar's
			}
			tar := tarTime(b, dir, args)
			var files int
			var bytes int64
			cpu0 := cpuTime()
			for b.Loop() {
				tr, err := Scan(context.Background(), dir, ScanOptions{})
				if err != nil {
					b.Fatal(err)
				}
				files, bytes = tr.Files, tr.Bytes
				toPipe(b, func(w io.Writer) error {
					_, err := tr.Archive(context.Background(), w, ArchiveOptions{Gzip: tc.gzip})
					return err
				}, nil)
			}
			report(b, tar, cpuTime()-cpu0)
			b.SetBytes(bytes)
			b.Logf("%d files, %d MiB (with .git when git)", files, bytes>>20)
		})
	}
}

// BenchmarkChanges: the changes of 10 modified files in that tree, from
// the sandbox's tree to a diff (the goal: 200 ms), against tar -c of the
// tree: "dir" reads the sandbox's directory (DirChanges, the local
// backend's way), "stream" and "stream-verify" a tar stream of it
// (Scan and Archive into a pipe, ReadChanges: a remote sandbox's way,
// the second hashing every file); then the old contents are read from
// the source and the diff rendered.
func BenchmarkChanges(b *testing.B) {
	src := benchTree(b, false)
	tr, err := Scan(context.Background(), src, ScanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	base, err := tr.Archive(context.Background(), &buf, ArchiveOptions{})
	if err != nil {
		b.Fatal(err)
	}
	sandbox := b.TempDir()
	if _, err := Extract(context.Background(), &buf, sandbox, ExtractOptions{}); err != nil {
		b.Fatal(err)
	}
	for i := range 10 {
		p := filepath.Join(sandbox, fmt.Sprintf("d%02d/f%04d.go", i, i*1000+i))
		data, _ := os.ReadFile(p)
		data = append([]byte("// changed by the job\n"), data[:len(data)/2]...)
		os.WriteFile(p, data, 0o644)
	}
	for _, mode := range []string{"dir", "stream", "stream-verify"} {
		b.Run(mode, func(b *testing.B) {
			tar := tarTime(b, sandbox, "-c")
			var cs *Changes
			cpu0 := cpuTime()
			for b.Loop() {
				if mode == "dir" {
					cs, err = DirChanges(context.Background(), base, sandbox, ChangesOptions{})
					if err != nil {
						b.Fatal(err)
					}
				} else {
					st, err := Scan(context.Background(), sandbox, ScanOptions{IncludeIgnored: true})
					if err != nil {
						b.Fatal(err)
					}
					toPipe(b, func(w io.Writer) error {
						_, err := st.Archive(context.Background(), w, ArchiveOptions{NoBaseline: true})
						return err
					}, func(r io.Reader) error {
						cs, err = ReadChanges(context.Background(), base, r, ChangesOptions{Verify: mode == "stream-verify"})
						return err
					})
				}
				if err := cs.ReadOld(context.Background(), src, ""); err != nil {
					b.Fatal(err)
				}
				if p := cs.Diff(DiffOptions{}); p.Total == 0 {
					b.Fatal("no diff")
				}
			}
			if cs.Modified != 10 || len(cs.Changes) != 10 {
				b.Fatalf("%d changes", len(cs.Changes))
			}
			report(b, tar, cpuTime()-cpu0)
		})
	}
}

// BenchmarkScan: Scan alone on the 10,000-file tree, as a plain directory
// and as a git work tree (go-git's index decoder and ignore matcher: the
// index of 10,000 entries and the walk of .git's objects), against tar -c.
func BenchmarkScan(b *testing.B) {
	for _, git := range []bool{false, true} {
		b.Run(map[bool]string{false: "dir", true: "git"}[git], func(b *testing.B) {
			dir := benchTree(b, git)
			tar := tarTime(b, dir, "-c")
			cpu0 := cpuTime()
			for b.Loop() {
				if _, err := Scan(context.Background(), dir, ScanOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			report(b, tar, cpuTime()-cpu0)
		})
	}
}
