package cli

import "testing"

func TestSafe(t *testing.T) {
	for in, want := range map[string]string{
		"step 2/3: café ✓ 日本": "step 2/3: café ✓ 日本",
		"a\tb\nc\rd":          `a\tb\nc\rd`,
		"\x1b[2J\x07\x00\x7f": `\x1b[2J\x07\x00\x7f`,
		"\u009b31m":           `\u009b31m`,
		"abc\u202edcba\u200b": `abc\u202edcba\u200b`,
		"bad \xff\xfe utf-8":  `bad \xff\xfe utf-8`,
		"":                    "",
	} {
		if got := safe(in); got != want {
			t.Errorf("safe(%q) = %q, want %q", in, got, want)
		}
	}
}
