package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// maxMessage caps a progress message (they are shown to agents and kept).
const maxMessage = 500

// statusLine is what a job may write to its status channel, one per line:
// plain text (a progress message) or a JSON object.
type statusLine struct {
	Type     string   `json:"type"` // progress (default), heartbeat, question (questions.go)
	Progress string   `json:"progress"`
	Message  string   `json:"message"`
	Percent  *float64 `json:"percent"`
}

// parseStatusLine turns one status line into a progress message; "" means
// a bare heartbeat.
func parseStatusLine(line string) string {
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "{") {
		var s statusLine
		if json.Unmarshal([]byte(line), &s) == nil {
			if s.Type == "heartbeat" || s.Type == "question" {
				return "" // a question is reported when it is asked
			}
			msg := s.Progress
			if msg == "" {
				msg = s.Message
			}
			if s.Percent != nil {
				msg = strings.TrimSpace(fmt.Sprintf("%s (%.0f%%)", msg, *s.Percent))
			}
			return clip(msg)
		}
	}
	return clip(line)
}

func clip(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if r := []rune(s); len(r) > maxMessage {
		return string(r[:maxMessage-1]) + "…"
	}
	return s
}

// lineSplitter cuts a byte stream into complete lines.
type lineSplitter struct{ partial []byte }

// lines returns the complete lines in b (plus what was held from before);
// final flushes an unterminated last line.
func (l *lineSplitter) lines(b []byte, final bool) []string {
	l.partial = append(l.partial, b...)
	var out []string
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		out = append(out, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > 64<<10 { // a "line" this long is not a status line
		l.partial = l.partial[:0]
	}
	if final && len(l.partial) > 0 {
		out = append(out, string(l.partial))
		l.partial = nil
	}
	return out
}

// tail is lines for a flood: it returns only the last keep complete lines
// in b (plus what was held from before), and how many complete lines came
// before them, without making strings of those. final flushes an
// unterminated last line.
func (l *lineSplitter) tail(b []byte, final bool, keep int) (lines []string, skipped int) {
	buf := append(l.partial, b...)
	rest := buf
	if end := bytes.LastIndexByte(buf, '\n'); end >= 0 {
		complete := buf[:end]
		rest = buf[end+1:]
		// Walk back keep lines from the end, then count the others.
		start := len(complete)
		for len(lines) < keep {
			i := bytes.LastIndexByte(complete[:start], '\n')
			lines = append(lines, string(complete[i+1:start]))
			if i < 0 {
				start = -1
				break
			}
			start = i
		}
		if start > 0 {
			skipped = bytes.Count(complete[:start], []byte{'\n'}) + 1
		}
		slices.Reverse(lines)
	}
	if len(rest) > 64<<10 { // a "line" this long is not a status line
		rest = rest[:0]
	}
	l.partial = append(l.partial[:0:0], rest...)
	if final && len(l.partial) > 0 {
		if len(lines) == keep && keep > 0 {
			lines, skipped = lines[1:], skipped+1
		}
		lines = append(lines, string(l.partial))
		l.partial = nil
	}
	return lines, skipped
}

// claudeEvent is the part of the Claude CLI's stream-json output we read.
type claudeEvent struct {
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
	Model   string `json:"model"`
	Result  string `json:"result"`
	IsError bool   `json:"is_error"`
	Message struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
			Name string `json:"name"`
		} `json:"content"`
	} `json:"message"`
}

// parseClaudeLine reads one line of `claude -p --output-format stream-json`
// into a progress message and, for the final line, the result text.
func parseClaudeLine(line string) (progress string, result *string) {
	var ev claudeEvent
	if json.Unmarshal([]byte(line), &ev) != nil {
		return "", nil
	}
	switch ev.Type {
	case "system":
		if ev.Subtype == "init" {
			if ev.Model != "" {
				return "claude started (" + ev.Model + ")", nil
			}
			return "claude started", nil
		}
	case "assistant":
		for _, c := range ev.Message.Content {
			switch c.Type {
			case "tool_use":
				return clip("claude: using " + c.Name), nil
			case "text":
				if t := strings.TrimSpace(c.Text); t != "" {
					return clip("claude: " + strings.Join(strings.Fields(t), " ")), nil
				}
			}
		}
	case "result":
		r := ev.Result
		if ev.IsError {
			return clip("claude finished with an error: " + r), &r
		}
		return "claude finished", &r
	}
	return "", nil
}
