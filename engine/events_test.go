package engine

import (
	"reflect"
	"testing"
)

func TestParseStatusLine(t *testing.T) {
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
