package engine

import (
	"reflect"
	"testing"
)

func TestParseStatusLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"compiling step 2":                      "compiling step 2",
		"  spaced  ":                            "spaced",
		`{"progress":"tests","percent":40}`:     "tests (40%)",
		`{"message":"hello"}`:                   "hello",
		`{"type":"heartbeat"}`:                  "",
		`{not json`:                             "{not json",
		`{"type":"progress","progress":"x\ny"}`: "x\ny",
	} {
		if got := parseStatusLine(in); got != want {
			t.Errorf("parseStatusLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLineSplitter(t *testing.T) {
	t.Parallel()
	var l lineSplitter
	if got := l.lines([]byte("a\nb"), false); !reflect.DeepEqual(got, []string{"a"}) {
		t.Fatal(got)
	}
	if got := l.lines([]byte("c\nd\n"), false); !reflect.DeepEqual(got, []string{"bc", "d"}) {
		t.Fatal(got)
	}
	if got := l.lines([]byte("tail"), true); !reflect.DeepEqual(got, []string{"tail"}) {
		t.Fatal(got)
	}
}

func TestParseClaudeLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line, progress string
		result         string
		hasResult      bool
	}{
		{`{"type":"system","subtype":"init","model":"claude-sonnet-4-5","tools":[]}`, "claude started (claude-sonnet-4-5)", "", false},
		{`{"type":"assistant","message":{"content":[{"type":"text","text":"Looking at\n the tests"}]}}`, "claude: Looking at the tests", "", false},
		{`{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Bash","input":{}}]}}`, "claude: using Bash", "", false},
		{`{"type":"user","message":{"content":[{"type":"tool_result"}]}}`, "", "", false},
		{`{"type":"result","subtype":"success","is_error":false,"result":"Fixed it."}`, "claude finished", "Fixed it.", true},
		{`{"type":"result","subtype":"error","is_error":true,"result":"API key invalid"}`, "claude finished with an error: API key invalid", "API key invalid", true},
		{`not json`, "", "", false},
	}
	for _, tc := range tests {
		p, r := parseClaudeLine(tc.line)
		if p != tc.progress || (r != nil) != tc.hasResult || (r != nil && *r != tc.result) {
			t.Errorf("%s: got %q %v", tc.line, p, r)
		}
	}
}

func TestLineSplitterTail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		chunks  []string
		final   bool
		keep    int
		lines   []string
		skipped int
	}{
		{"fewer than keep", []string{"a\nb\n"}, false, 3, []string{"a", "b"}, 0},
		{"more than keep", []string{"1\n2\n3\n4\n5\n"}, false, 2, []string{"4", "5"}, 3},
		{"exactly keep", []string{"1\n2\n"}, false, 2, []string{"1", "2"}, 0},
		{"partial held", []string{"1\n2\n3", "x\n"}, false, 1, []string{"3x"}, 1},
		{"empty lines count", []string{"\n\n\nz\n"}, false, 1, []string{"z"}, 3},
		{"final flushes", []string{"1\n2\nlast"}, true, 2, []string{"2", "last"}, 1},
		{"no newline yet", []string{"abc"}, false, 2, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l lineSplitter
			var lines []string
			skipped := 0
			for i, c := range tc.chunks {
				got, s := l.tail([]byte(c), tc.final && i == len(tc.chunks)-1, tc.keep)
				lines, skipped = got, skipped+s
			}
			if !reflect.DeepEqual(lines, tc.lines) || skipped != tc.skipped {
				t.Fatalf("got %q skipped %d, want %q skipped %d", lines, skipped, tc.lines, tc.skipped)
			}
		})
	}
}
