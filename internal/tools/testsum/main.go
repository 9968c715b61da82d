// Command testsum reads `go test -json` on standard input and prints a
// line per package as it ends (its result, time and test counts), the
// output of each failed test in full, and the totals at the end, so that
// a long run shows its progress and ends with its counts. When nothing
// was printed for 30 seconds it prints what is running (the packages and
// their newest test) and how many tests passed so far, so that a slow
// package never looks like a hung run. It exits 1 if any test or package
// failed (or the input ended mid-run), 0 otherwise.
//
//	go test -json ./... | go run ./internal/tools/testsum
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type pkgState struct {
	passed, failed, skipped int
	output                  map[string]*strings.Builder // per test ("" for the package)
	running                 []string                    // tests started and not ended, oldest first
	done                    bool
}

// quiet is how long the run may print nothing before a progress line.
const quiet = 30 * time.Second

func main() {
	ticker := time.NewTicker(quiet / 3)
	defer ticker.Stop()
	os.Exit(run(os.Stdin, os.Stdout, time.Now, ticker.C))
}

// run summarises the events read from in. tick wakes it to see whether
// the run has been quiet for longer than quiet (nil: never).
func run(in io.Reader, out io.Writer, now func() time.Time, tick <-chan time.Time) int {
	start := now()
	lastPrint := start
	pkgs := map[string]*pkgState{}
	get := func(name string) *pkgState {
		p := pkgs[name]
		if p == nil {
			p = &pkgState{output: map[string]*strings.Builder{}}
			pkgs[name] = p
		}
		return p
	}
	var total struct{ passed, failed, skipped, pkgOK, pkgFail, pkgNoTests int }
	var order []string // packages in the order they began
	printed := func() { lastPrint = now() }
	progress := func() {
		var names []string
		passed := total.passed
		for _, name := range order {
			p := pkgs[name]
			if p.done {
				continue
			}
			passed += p.passed
			if n := len(p.running); n > 0 {
				name += " (" + p.running[n-1] + ")"
			}
			names = append(names, name)
		}
		fmt.Fprintf(out, "...  running: %s; %d tests passed so far  [%s]\n",
			strings.Join(names, ", "), passed, now().Sub(start).Round(time.Second))
		printed()
	}
	lines := make(chan []byte)
	var readErr error
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
		readErr = sc.Err() // read after lines is closed
	}()
read:
	for {
		var line []byte
		select {
		case l, ok := <-lines:
			if !ok {
				break read
			}
			line = l
		case <-tick:
			if now().Sub(lastPrint) >= quiet {
				progress()
			}
			continue
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil || ev.Action == "" {
			fmt.Fprintln(out, string(line)) // a build error or a line not from test2json
			printed()
			continue
		}
		if _, ok := pkgs[ev.Package]; !ok {
			order = append(order, ev.Package)
		}
		p := get(ev.Package)
		switch ev.Action {
		case "run":
			if ev.Test != "" {
				p.running = append(p.running, ev.Test)
			}
		case "output":
			b := p.output[ev.Test]
			if b == nil {
				b = &strings.Builder{}
				p.output[ev.Test] = b
			}
			if b.Len() < 256<<10 {
				b.WriteString(ev.Output)
			}
		case "pass", "fail", "skip":
			if ev.Test != "" {
				if i := slices.Index(p.running, ev.Test); i >= 0 {
					p.running = slices.Delete(p.running, i, i+1)
				}
				switch ev.Action {
				case "pass":
					p.passed++
					delete(p.output, ev.Test)
				case "fail":
					p.failed++
					fmt.Fprintf(out, "--- FAIL %s %s (%.1fs)\n", ev.Package, ev.Test, ev.Elapsed)
					printed()
					if b := p.output[ev.Test]; b != nil {
						fmt.Fprint(out, indent(b.String()))
					}
				case "skip":
					p.skipped++
					delete(p.output, ev.Test)
				}
				continue
			}
			p.done = true
			total.passed += p.passed
			total.failed += p.failed
			total.skipped += p.skipped
			word := "ok  "
			switch {
			case ev.Action == "fail":
				word = "FAIL"
				total.pkgFail++
				if p.failed == 0 { // a build failure or a crash: show what it printed
					if b := p.output[""]; b != nil {
						fmt.Fprint(out, indent(b.String()))
					}
				}
			case p.passed+p.failed+p.skipped == 0:
				word = "--  "
				total.pkgNoTests++
			default:
				total.pkgOK++
			}
			if word == "--  " {
				continue // no test files: not worth a line
			}
			fmt.Fprintf(out, "%s %-50s %7.1fs  %d passed, %d failed, %d skipped  [%s]\n",
				word, ev.Package, ev.Elapsed, p.passed, p.failed, p.skipped, now().Sub(start).Round(time.Second))
			printed()
		}
	}
	var unfinished []string
	for name, p := range pkgs {
		if !p.done {
			unfinished = append(unfinished, name)
		}
	}
	sort.Strings(unfinished)
	for _, name := range unfinished {
		fmt.Fprintf(out, "FAIL %s: did not finish (timed out or killed)\n", name)
	}
	fmt.Fprintf(out, "\n%d tests passed, %d failed, %d skipped; %d packages ok, %d failed; %s\n",
		total.passed, total.failed, total.skipped, total.pkgOK, total.pkgFail+len(unfinished), now().Sub(start).Round(time.Second))
	if total.failed > 0 || total.pkgFail > 0 || len(unfinished) > 0 || readErr != nil {
		return 1
	}
	return 0
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	return b.String()
}
