package cli

import (
	"fmt"
	"io"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
)

// A job's output is the job's: written to a file or a pipe, it is copied
// byte for byte. On a terminal it could drive the operator's terminal: set
// the clipboard (OSC 52), the title, move the cursor to overwrite what
// delegate printed, or leave the text invisible for delegate's own verdict
// that follows. So on a terminal (unless --raw) it goes through a
// termWriter, which lets colours and text attributes through (SGR, ESC [
// ... m, which move nothing) and writes every other escape sequence and
// control character as visible text (\x1b]52;..., \x07), invalid UTF-8 as
// \xNN and the Unicode controls that reorder or hide text as \uNNNN; a line
// that begins like delegate's own lines ("delegate", look-alike letters
// included, see lookalikeStart) is marked with a leading "│ "; at the end
// it resets the attributes and ends the line, so that delegate's verdict,
// on stderr and with its fixed prefix "delegate: ", is always shown as
// written, on a line of its own, the only one unmarked.

// maxSGR bounds a colour sequence held across writes.
const maxSGR = 64

type termWriter struct {
	w io.Writer
	// strict writes every escape sequence as text, colours too, and a
	// carriage return even before a newline: for text a person reviews
	// (a diff), where an attribute such as conceal (ESC [ 8 m) would hide
	// a line and a CR LF would hide that a file's lines end so.
	strict  bool
	pending []byte // the start of a sequence a later write may complete
	wrote   bool   // something was written
	lastNL  bool   // and it ended a line
	midLine bool   // the next byte does not start a line
	out     []byte
}

func newTermWriter(w io.Writer) *termWriter { return &termWriter{w: w} }

// Write shows p, escaped; it never fails for the output's sake, only when
// the terminal does.
func (t *termWriter) Write(p []byte) (int, error) {
	buf := append(t.pending, p...)
	t.pending = nil
	rest := t.render(buf, false)
	t.pending = append([]byte(nil), rest...)
	if err := t.flush(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// finish writes what is held, escaped, then, if anything was written,
// resets the attributes and ends the line (strict: ends the line, nothing
// having set an attribute).
func (t *termWriter) finish() error {
	t.render(t.pending, true)
	t.pending = nil
	if err := t.flush(); err != nil || !t.wrote {
		return err
	}
	if t.strict {
		t.wrote = false
		if !t.lastNL {
			_, err := io.WriteString(t.w, "\n")
			return err
		}
		return nil
	}
	end := "\x1b[0m"
	if !t.lastNL {
		end += "\n"
	}
	t.wrote, t.lastNL, t.midLine = false, false, false
	_, err := io.WriteString(t.w, end)
	return err
}

// jobOutput is where a command writes a job's output to w: w itself when
// it is no terminal or with raw, else a termWriter over it. finish (a
// no-op for w itself) goes before delegate's own verdict.
func jobOutput(w io.Writer, raw bool) (out io.Writer, finish func() error) {
	if raw || !isTerminal(w) {
		return w, func() error { return nil }
	}
	t := newTermWriter(w)
	return t, t.finish
}

// reviewOutput is jobOutput for text a person reviews (a diff, a patch):
// on a terminal, unless raw, every control character and escape sequence
// is written as text, colours included.
func reviewOutput(w io.Writer, raw bool) (out io.Writer, finish func() error) {
	if raw || !isTerminal(w) {
		return w, func() error { return nil }
	}
	t := &termWriter{w: w, strict: true}
	return t, t.finish
}

// verdict is delegate's own line about a finished job.
func verdict(id string, status delegate.Status, d time.Duration, exit *int, reason delegate.ExitReason, errText string) string {
	line := fmt.Sprintf("delegate: %s %s in %.1fs", id, status, d.Seconds())
	if exit != nil {
		line += ", exit code " + delegate.ExitText(exit, reason)
	}
	if errText != "" && (exit == nil || errText != fmt.Sprintf("exit code %d", *exit)) {
		line += ": " + safe(errText)
	}
	return line
}

func (t *termWriter) flush() error {
	if len(t.out) == 0 {
		return nil
	}
	t.wrote, t.lastNL = true, t.out[len(t.out)-1] == '\n'
	_, err := t.w.Write(t.out)
	t.out = t.out[:0]
	return err
}

// render appends buf, escaped, to t.out and returns what it holds back: a
// sequence that may be completed by what comes next (unless final).
func (t *termWriter) render(buf []byte, final bool) []byte {
	esc := func(b byte) { t.out = fmt.Appendf(t.out, `\x%02x`, b) }
	for i := 0; i < len(buf); {
		if !t.midLine && !t.strict {
			mark, decided := lookalikeStart(buf[i:], final)
			if !decided {
				return buf[i:] // the rest of the line's start may come
			}
			if mark {
				t.out = append(t.out, lineMark...)
			}
			t.midLine = true
		}
		b := buf[i]
		switch {
		case b == 0x1b && t.strict:
			esc(b)
			i++
		case b == '\r' && t.strict:
			t.out = append(t.out, `\r`...)
			i++
		case b == 0x1b:
			if i+1 == len(buf) && !final {
				return buf[i:]
			}
			if i+1 < len(buf) && buf[i+1] == '[' {
				j := i + 2
				for j < len(buf) && j-i < maxSGR && (buf[j] >= '0' && buf[j] <= '9' || buf[j] == ';' || buf[j] == ':') {
					j++
				}
				if j == len(buf) && j-i < maxSGR && !final {
					return buf[i:]
				}
				if j < len(buf) && buf[j] == 'm' {
					t.out = append(t.out, buf[i:j+1]...) // colours and attributes
					i = j + 1
					continue
				}
			}
			esc(b)
			i++
		case b == '\r':
			// A line ending of CR LF passes; a CR alone, which would
			// rewrite the line, does not.
			if i+1 == len(buf) && !final {
				return buf[i:]
			}
			if i+1 < len(buf) && buf[i+1] == '\n' {
				t.out = append(t.out, '\r', '\n')
				i += 2
				t.midLine = false
				continue
			}
			t.out = append(t.out, `\r`...)
			i++
		case b == '\n' || b == '\t':
			t.out = append(t.out, b)
			i++
			t.midLine = b != '\n'
		case b < 0x20 || b == 0x7f:
			esc(b)
			i++
		case b < 0x80:
			t.out = append(t.out, b)
			i++
		default:
			r, size := utf8.DecodeRune(buf[i:])
			switch {
			case r == utf8.RuneError && size <= 1 && !utf8.FullRune(buf[i:]) && !final:
				return buf[i:] // the rest of it may come
			case r == utf8.RuneError && size <= 1:
				esc(b)
				size = 1
			case unsafeRune(r):
				t.out = fmt.Appendf(t.out, `\u%04x`, r)
			default:
				t.out = append(t.out, buf[i:i+size]...)
			}
			i += size
		}
	}
	return nil
}

// lineMark begins a line of a job's output that begins like delegate's
// own lines ("delegate: job-… success"), so that on a terminal the
// verdict is the only line that begins "delegate" unmarked.
const lineMark = "│ "

// maxLineLook bounds how far the start of a line is read to tell whether
// it begins "delegate": past it (colour sequences), the line is marked.
const maxLineLook = 256

// lookalikeStart tells whether b, the start of a line of a job's output,
// reads "delegate" to the eye: colour sequences (SGR) skipped, letters of
// either case, fullwidth and mathematical forms, and the Cyrillic, Greek
// and other letters that look like those of "delegate". decided is false
// when b ends before that can be told (unless final).
func lookalikeStart(b []byte, final bool) (mark, decided bool) {
	const word = "delegate"
	matched := 0
	for i := 0; i < len(b); {
		if i >= maxLineLook {
			return true, true
		}
		if b[i] == 0x1b {
			j := i + 1
			if j < len(b) && b[j] == '[' {
				j++
				for j < len(b) && (b[j] >= '0' && b[j] <= '9' || b[j] == ';' || b[j] == ':') {
					j++
				}
				if j < len(b) && b[j] == 'm' {
					i = j + 1 // a colour: nothing to the eye
					continue
				}
			}
			if j >= len(b) && !final {
				return false, false
			}
			return false, true // an escape written as text: "\x1b…"
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 && !utf8.FullRune(b[i:]) && !final {
			return false, false
		}
		if foldLookalike(r) != rune(word[matched]) {
			return false, true
		}
		if matched++; matched == len(word) {
			return true, true
		}
		i += size
	}
	return false, final
}

// lookalikes maps letters that read as those of "delegate" to them.
var lookalikes = map[rune]rune{
	'а': 'a', 'А': 'a', 'ɑ': 'a', 'α': 'a', 'Α': 'a', 'ᴀ': 'a',
	'ԁ': 'd', 'ⅾ': 'd', 'Ⅾ': 'd', 'Ꭰ': 'd', 'ᑯ': 'd',
	'е': 'e', 'Е': 'e', 'ε': 'e', 'Ε': 'e', 'ҽ': 'e', '℮': 'e', 'ᴇ': 'e', 'ė': 'e', 'é': 'e', 'è': 'e', 'ê': 'e', 'ë': 'e',
	'ɡ': 'g', 'ɢ': 'g', 'Ԍ': 'g', 'ġ': 'g',
	'ӏ': 'l', 'Ӏ': 'l', 'І': 'l', 'ǀ': 'l', 'ⅼ': 'l', 'Ⅼ': 'l', 'ℓ': 'l', 'Ι': 'l', '׀': 'l', '|': 'l', '1': 'l', 'I': 'l', 'ı': 'l',
	'т': 't', 'Т': 't', 'τ': 't', 'Τ': 't', 'ᴛ': 't',
}

// foldLookalike folds r toward the lower-case ASCII letter it looks like.
func foldLookalike(r rune) rune {
	switch {
	case r >= 0xff01 && r <= 0xff5e: // fullwidth ASCII
		r -= 0xfee0
	case r >= 0x1d400 && r <= 0x1d6a3: // mathematical letters: 13 alphabets of A-Z a-z
		k := (r - 0x1d400) % 52
		if k < 26 {
			r = 'a' + k
		} else {
			r = 'a' + k - 26
		}
	}
	if v, ok := lookalikes[r]; ok {
		return v
	}
	return unicode.ToLower(r)
}
