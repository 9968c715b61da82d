package workspace

import (
	"encoding/json"
	"math"
	"math/rand"
	"reflect"
	"testing"
)

// randomBaseline is a baseline with the values a store can hold: odd
// names (escapes, HTML's three, non-ASCII, bytes that are not UTF-8),
// every type (and one that is none), modes over 0o777, extreme sizes
// and times.
func randomBaseline(rng *rand.Rand) *Baseline {
	strs := []string{"", "a", "d00/f0001.go", `q"uote`, `back\slash`, "<a>&b", "tab\tnl\ncr\r", "\b\f\x01\x1f\x7f", "é/ü", "\xff\xfe", "\u2028\u2029", "日本/語.txt", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	pick := func() string { return strs[rng.Intn(len(strs))] }
	nums := []int64{0, 1, -1, 644, 1765140000123456789, math.MaxInt64, math.MinInt64, 1 << 40}
	b := &Baseline{Version: int(nums[rng.Intn(len(nums))]), Kind: Kind(pick())}
	if rng.Intn(2) == 0 {
		b.Head, b.Branch = pick(), pick()
	}
	b.IncludeIgnored = rng.Intn(2) == 0
	switch n := rng.Intn(6); n {
	case 0: // nil: "files":null
	case 1:
		b.Files = []FileState{}
	default:
		for range n * 3 {
			b.Files = append(b.Files, FileState{Path: pick(), Type: Type(rng.Intn(4)), Mode: Mode(rng.Intn(0o20000)),
				Size: nums[rng.Intn(len(nums))], MTime: nums[rng.Intn(len(nums))], Target: pick(), SHA256: pick()})
		}
	}
	return b
}

// TestBaselineJSON: Baseline.JSON writes json.Marshal's bytes, and
// ParseBaseline reads them (and encoding/json's other forms of the same
// baseline) into what json.Unmarshal reads.
func TestBaselineJSON(t *testing.T) {
	rng := rand.New(rand.NewSource(41))
	for i := range 3000 {
		b := randomBaseline(rng)
		want, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		got := b.JSON()
		if string(got) != string(want) {
			t.Fatalf("case %d: JSON\n got %s\nwant %s", i, got, want)
		}
		indented, _ := json.MarshalIndent(b, "", " ")
		for _, doc := range [][]byte{want, indented} {
			var ref Baseline
			if err := json.Unmarshal(doc, &ref); err != nil {
				t.Fatal(err)
			}
			parsed, err := ParseBaseline(doc)
			if err != nil {
				t.Fatalf("case %d: ParseBaseline(%s): %v", i, doc, err)
			}
			if !reflect.DeepEqual(parsed, &ref) {
				t.Fatalf("case %d: ParseBaseline(%s)\n got %+v\nwant %+v", i, doc, parsed, ref)
			}
		}
	}
}

// TestParseBaselineFastPath: the form JSON writes is read in one pass,
// not handed to encoding/json (the point of it), and what encoding/json
// refuses is refused with its error.
func TestParseBaselineFastPath(t *testing.T) {
	b := &Baseline{Version: 1, Kind: KindGit, Head: "abc", Files: []FileState{
		{Path: "a.go", Type: TypeFile, Mode: 0o644, Size: 3, MTime: 1765140000123456789, SHA256: "00ff"},
		{Path: "l", Type: TypeSymlink, Mode: 0o777, MTime: -5, Target: "a.go"},
	}}
	p := baselineParser{data: b.JSON()}
	if got, ok := p.baseline(); !ok || !reflect.DeepEqual(got, b) {
		t.Fatalf("the fast path read %+v, %v; want %+v", got, ok, b)
	}
	for _, bad := range []string{
		``, `{`, `{"version":1,"kind":"dir","files":[`, `{"version":1.5,"kind":"dir","files":null}`,
		`{"version":99999999999999999999,"kind":"dir","files":null}`, `{"version":01,"kind":"dir","files":null}`,
		`{"version":1,"kind":"dir","files":[{"path":"a","type":"fifo","mode":"0644","size":1,"mtime":1}]}`,
		`{"version":1,"kind":"dir","files":[{"path":"a","type":"file","mode":"9","size":1,"mtime":1}]}`,
		`{"version":1,"kind":"dir","files":[{"path":"a","type":"file","mode":"17777","size":1,"mtime":1}]}`,
		`{"version":1,"kind":"dir","files":null}x`,
	} {
		var ref Baseline
		want := json.Unmarshal([]byte(bad), &ref)
		if _, err := ParseBaseline([]byte(bad)); err == nil || want == nil || err.Error() != want.Error() {
			t.Errorf("ParseBaseline(%s): %v, want encoding/json's %v", bad, err, want)
		}
	}
}

// FuzzParseBaseline: on any input, ParseBaseline gives what json.Unmarshal
// gives.
func FuzzParseBaseline(f *testing.F) {
	rng := rand.New(rand.NewSource(7))
	for range 20 {
		f.Add(randomBaseline(rng).JSON())
	}
	f.Add([]byte(`{"version":1,"kind":"dir","files":[{"path":"a","type":"file","mode":"0644","size":-0,"mtime":-9223372036854775808}]}`))
	f.Add([]byte(`{"version":1,"kind":"dir","files":[{"path":"a","type":"file","mode":"0644","size":1,"mtime":9223372036854775808}]}`))
	f.Add([]byte(`{"version":1,"kind":"dir","includeIgnored":false,"files":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ref Baseline
		want := json.Unmarshal(data, &ref)
		got, err := ParseBaseline(data)
		if (err == nil) != (want == nil) {
			t.Fatalf("ParseBaseline(%q): %v; json.Unmarshal: %v", data, err, want)
		}
		if err == nil && !reflect.DeepEqual(got, &ref) {
			t.Fatalf("ParseBaseline(%q)\n got %+v\nwant %+v", data, got, ref)
		}
	})
}
