package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/delegate-dev/delegate"
)

// progressLine shows a job's state on stderr: a spinner line redrawn in
// place on a terminal, or a plain line per change otherwise.
type progressLine struct {
	w       io.Writer
	tty     bool
	quiet   bool
	id      string
	last    string
	frame   int
	drawn   bool
	started time.Time
}

func newProgressLine(w io.Writer, quiet bool, id string) *progressLine {
	p := &progressLine{w: w, quiet: quiet, id: id, started: time.Now()}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

func (p *progressLine) show(j *delegate.Job) {
	if p.quiet {
		return
	}
	msg := string(j.Status)
	if j.Progress != "" && j.Progress != msg {
		msg += ": " + safe(j.Progress)
	}
	if !p.tty {
		if msg != p.last {
			fmt.Fprintf(p.w, "delegate: %s %s\n", p.id, msg)
			p.last = msg
		}
		return
	}
	p.frame++
	fmt.Fprintf(p.w, "\r\033[K%s %s %s %.1fs", spinner[p.frame%len(spinner)], p.id, msg, time.Since(p.started).Seconds())
	p.drawn = true
}

func (p *progressLine) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

func (p *progressLine) done(j *delegate.Job) {
	p.clear()
	if p.quiet && j.Status == delegate.StatusSuccess {
		return
	}
	line := verdict(j.ID, j.Status, j.Duration(time.Now()), j.ExitCode, delegate.ExitReasonOf(j.Status, j.ExitCode, j.OOMKilled), j.Error)
	if j.OutputTruncated {
		line += fmt.Sprintf(" (output truncated: %d bytes written, first kept)", j.OutputBytes)
	}
	fmt.Fprintln(p.w, line)
}
