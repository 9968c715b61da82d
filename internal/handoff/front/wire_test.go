package front

import (
	"fmt"
	"testing"
)

// TestDecodeBody: a body decodes to what was encoded, and a cut or
// inflated one is refused.
func TestDecodeBody(t *testing.T) {
	b := EncodeBody([]string{"run", ""}, []string{"A=b=c"}, "/d")
	args, env, dir, err := DecodeBody(b)
	if err != nil || fmt.Sprint(args, env, dir) != fmt.Sprint([]string{"run", ""}, []string{"A=b=c"}, "/d") {
		t.Fatalf("%q %q %q %v", args, env, dir, err)
	}
	for i := range len(b) {
		if _, _, _, err := DecodeBody(b[:i]); err == nil {
			t.Errorf("a body cut at %d decoded", i)
		}
	}
	huge := append([]byte{0xff, 0xff, 0xff, 0x7f}, b...)
	if _, _, _, err := DecodeBody(huge); err == nil {
		t.Error("a list longer than the body decoded")
	}
}

// TestDataDir: the data dir is found as the CLI finds it, and only an
// absolute one is tried.
func TestDataDir(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"run"}, map[string]string{"HOME": "/h"}, "/h/.local/state/delegate"},
		{[]string{"run"}, map[string]string{"HOME": "/h", "XDG_STATE_HOME": "/x"}, "/x/delegate"},
		{[]string{"run"}, map[string]string{"HOME": "/h", "DELEGATE_DATA_DIR": "/d"}, "/d"},
		{[]string{"--data-dir", "/f", "run"}, map[string]string{"DELEGATE_DATA_DIR": "/d"}, "/f"},
		{[]string{"exec", "sbx", "--data-dir=/f", "--", "x"}, nil, "/f"},
		{[]string{"exec", "sbx", "--", "--data-dir=/f"}, map[string]string{"DELEGATE_DATA_DIR": "/d"}, "/d"},
		{[]string{"run"}, map[string]string{"DELEGATE_DATA_DIR": "rel"}, ""},
		{[]string{"run"}, nil, ""},
	} {
		if got := DataDir(tt.args, env(tt.env)); got != tt.want {
			t.Errorf("DataDir(%q, %v) = %q; want %q", tt.args, tt.env, got, tt.want)
		}
	}
}
