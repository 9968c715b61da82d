package workspace

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// tarEntries reads a tar stream to its end with next and read, and says
// what it read: each entry's fields and data, then how it ended ("EOF"
// or "error").
func tarEntries(next func() (*tar.Header, error), read io.Reader) []string {
	var out []string
	for {
		hdr, err := next()
		if err == io.EOF {
			return append(out, "EOF")
		}
		if err != nil {
			return append(out, "error")
		}
		data, err := io.ReadAll(read)
		out = append(out, fmt.Sprintf("%q %c mode %o size %d mtime %d link %q data %x (%d)",
			hdr.Name, hdr.Typeflag, hdr.Mode, hdr.Size, hdr.ModTime.UnixNano(), hdr.Linkname, sha256.Sum256(data), len(data)))
		if err != nil {
			return append(out, "error reading")
		}
	}
}

// sameAsArchiveTar reads data with tarIn and archive/tar's Reader and
// fails the test where they read it differently.
func sameAsArchiveTar(t *testing.T, name string, data []byte) {
	t.Helper()
	std := tar.NewReader(bytes.NewReader(data))
	want := tarEntries(std.Next, std)
	in := newTarIn(bufio.NewReaderSize(bytes.NewReader(data), 4096))
	got := tarEntries(in.Next, in)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s: tarIn read\n%s\narchive/tar read\n%s", name, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// rawBlock is a header block with the given fields, its checksum set.
func rawBlock(name string, typ byte, size string, magic string) []byte {
	b := make([]byte, 512)
	copy(b, name)
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], size)
	copy(b[136:], "14371231234\x00")
	b[156] = typ
	copy(b[257:], magic)
	fixSum(b)
	return b
}

func fixSum(b []byte) {
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b[:512] {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
}

// TestTarInLikeArchiveTar: the extract helper's tar reader reads what
// archive/tar's reads, entry by entry (names, types, modes, sizes, times
// to the nanosecond, links, data) and ends where it ends: archives of
// archive/tar's writer in each format, of GNU tar in each of its
// formats (sparse files, FIFOs, hard links, long names), of Archive's
// writer, odd headers written by hand, and each of those with bytes
// changed at random or cut short.
func TestTarInLikeArchiveTar(t *testing.T) {
	archives := map[string][]byte{}
	mt := time.Unix(1700000000, 123456789)
	long := strings.Repeat("long-directory-name/", 6) + "file-with-a-long-name.txt"
	for _, format := range []tar.Format{tar.FormatUSTAR, tar.FormatPAX, tar.FormatGNU} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		m := mt
		if format == tar.FormatUSTAR {
			m = mt.Truncate(time.Second)
		}
		entries := []tar.Header{
			{Name: "dir/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "dir/file.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 513},
			{Name: "empty", Typeflag: tar.TypeReg, Mode: 0o600},
			{Name: "block", Typeflag: tar.TypeReg, Mode: 0o755, Size: 512},
			{Name: long, Typeflag: tar.TypeReg, Mode: 0o644, Size: 3},
			{Name: "link", Typeflag: tar.TypeSymlink, Mode: 0o777, Linkname: "dir/file.txt"},
			{Name: "hard", Typeflag: tar.TypeLink, Mode: 0o644, Linkname: "empty"},
			{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o644},
			{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		}
		if format != tar.FormatUSTAR {
			entries = append(entries,
				tar.Header{Name: "ünïcode/名前.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5},
				tar.Header{Name: "longlink", Typeflag: tar.TypeSymlink, Mode: 0o777, Linkname: strings.Repeat("target/", 30)},
			)
		}
		if format == tar.FormatPAX {
			entries = append(entries,
				tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "global", PAXRecords: map[string]string{"comment": "all"}},
				tar.Header{Name: "records", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2, PAXRecords: map[string]string{"comment": "x", "SCHILY.xattr.user.a": "b"}},
				tar.Header{Name: "after-global", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
			)
		}
		for i, h := range entries {
			h.Format, h.ModTime = format, m
			if h.Typeflag == tar.TypeXGlobalHeader {
				h = tar.Header{Typeflag: h.Typeflag, PAXRecords: h.PAXRecords}
			}
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatalf("%v %s: %v", format, h.Name, err)
			}
			tw.Write(bytes.Repeat([]byte{byte('a' + i)}, int(h.Size)))
		}
		tw.Close()
		archives[fmt.Sprintf("archive/tar %v", format)] = buf.Bytes()
	}

	// Archive's own writer.
	var own bytes.Buffer
	tw := newTarWriter(&own)
	tw.header("a/", tarDir, 0o755, 0, mt.UnixNano(), "")
	tw.header("a/b.txt", tarReg, 0o644, 4, mt.UnixNano(), "")
	tw.Write([]byte("data"))
	tw.header(long+"/ünï", tarReg, 0o600, 0, -5, "")
	tw.header("l", tarSymlink, 0o777, 0, 0, strings.Repeat("x/", 80))
	tw.Close()
	archives["tarWriter"] = own.Bytes()

	// Odd headers: no type (a file, or a directory by its slash), v7, a
	// size in base 256, a pax header with odd records, a GNU long name.
	var odd bytes.Buffer
	odd.Write(rawBlock("regA", 0, "00000000004\x00", "ustar\x0000"))
	odd.Write([]byte("abcd" + strings.Repeat("\x00", 508)))
	odd.Write(rawBlock("dirA/", 0, "00000000000\x00", "ustar\x0000"))
	odd.Write(rawBlock("v7file", '0', "00000000001\x00", ""))
	odd.Write(append([]byte("z"), make([]byte, 511)...))
	b256 := rawBlock("b256", '0', "", "ustar\x0000")
	b256[124], b256[135] = 0x80, 2
	fixSum(b256)
	odd.Write(b256)
	odd.Write(append([]byte("yy"), make([]byte, 510)...))
	// The first mtime does not parse, but the last record of a key
	// counts, as archive/tar reads them.
	recs := "10 path=p\n" + "19 mtime=-x.500000\n" + "13 size=0001\n" + "7 uid=\n" + "23 mtime=12.1234567891\n"
	odd.Write(rawBlock("pax", 'x', fmt.Sprintf("%011o\x00", len(recs)), "ustar\x0000"))
	odd.Write(append([]byte(recs), make([]byte, -len(recs)&511)...))
	odd.Write(rawBlock("ignored", '0', "00000000000\x00", "ustar\x0000"))
	odd.Write(append([]byte("q"), make([]byte, 511)...))
	ln := strings.Repeat("n", 300)
	odd.Write(rawBlock("././@LongLink", 'L', fmt.Sprintf("%011o\x00", len(ln)+1), "ustar  \x00"))
	odd.Write(append([]byte(ln), make([]byte, 512-len(ln)%512)...))
	odd.Write(rawBlock("short", '0', "00000000000\x00", "ustar  \x00"))
	// A checksum summed over signed bytes, as some old writers did.
	signed := rawBlock("sign\xe9\xff", '0', "00000000000\x00", "ustar\x0000")
	copy(signed[148:156], "        ")
	sum := 0
	for _, c := range signed {
		sum += int(int8(c))
	}
	copy(signed[148:], fmt.Sprintf("%06o\x00 ", sum))
	odd.Write(signed)
	odd.Write(make([]byte, 1024))
	archives["odd"] = odd.Bytes()

	// GNU tar's formats, with a sparse file, a FIFO, a hard link and
	// long names.
	if _, err := exec.LookPath("tar"); err == nil {
		dir := t.TempDir()
		src := filepath.Join(dir, "src")
		os.MkdirAll(filepath.Join(src, "d"), 0o755)
		os.WriteFile(filepath.Join(src, "d", "f.txt"), []byte("hello\n"), 0o644)
		os.Link(filepath.Join(src, "d", "f.txt"), filepath.Join(src, "hard"))
		os.Symlink("d/f.txt", filepath.Join(src, "sym"))
		exec.Command("mkfifo", filepath.Join(src, "fifo")).Run()
		sp, _ := os.Create(filepath.Join(src, "sparse"))
		sp.WriteAt([]byte("start"), 0)
		sp.WriteAt([]byte("end"), 1<<16)
		sp.Close()
		deep := filepath.Join(src, strings.Repeat("deep-directory/", 8))
		os.MkdirAll(deep, 0o755)
		os.WriteFile(filepath.Join(deep, "leaf.txt"), []byte("leaf"), 0o644)
		for _, format := range []string{"gnu", "oldgnu", "posix", "ustar", "v7"} {
			out := filepath.Join(dir, format+".tar")
			args := []string{"--format=" + format, "-cf", out, "-C", src, "."}
			if format != "ustar" && format != "v7" {
				args = append([]string{"-S"}, args...)
			}
			if b, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
				// ustar and v7 cannot hold every name: what they wrote is read.
				t.Logf("tar --format=%s: %v: %s", format, err, b)
			}
			if data, err := os.ReadFile(out); err == nil && len(data) > 0 {
				archives["GNU tar "+format] = data
			}
		}
	}

	in := newTarIn(bufio.NewReader(bytes.NewReader(archives["odd"])))
	if got := strings.Join(tarEntries(in.Next, in), "\n"); !strings.Contains(got, `"sign\xe9\xff"`) || !strings.HasSuffix(got, "EOF") {
		t.Errorf("the odd archive read as\n%s\nwant its signed-checksum entry and its end", got)
	}
	names := make([]string, 0, len(archives))
	for name := range archives {
		names = append(names, name)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewSource(41))
	for _, name := range names {
		data := archives[name]
		sameAsArchiveTar(t, name, data)
		for i := range 300 {
			bad := bytes.Clone(data)
			n := min(len(bad), 8192)
			at := 0
			for range 1 + rng.Intn(3) {
				at = rng.Intn(n)
				bad[at] = byte(rng.Intn(256))
				if rng.Intn(4) == 0 {
					bad[at] = "0123456789 \x00.=-+\n"[rng.Intn(17)] // what headers hold
				}
			}
			if i%2 == 0 && at/512*512+512 <= len(bad) {
				fixSum(bad[at/512*512 : at/512*512+512]) // past the checksum, if a header
			}
			sameAsArchiveTar(t, fmt.Sprintf("%s, changed (%d)", name, i), bad)
		}
		for range 50 {
			cut := rng.Intn(len(data))
			sameAsArchiveTar(t, fmt.Sprintf("%s, cut at %d", name, cut), data[:cut])
		}
	}
	if len(archives) < 5 {
		t.Errorf("%d archives read, want at least the 5 made here", len(archives))
	}
}

// TestTarInHandsOver: a stream with what tarIn leaves to archive/tar
// (a GNU sparse file) is read by archive/tar from that entry on, to the
// same end.
func TestTarInHandsOver(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "first", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("1"))
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "c"}}); err != nil {
		t.Fatal(err)
	}
	tw.WriteHeader(&tar.Header{Name: "after", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("22"))
	tw.Close()
	in := newTarIn(bufio.NewReader(bytes.NewReader(buf.Bytes())))
	var names []string
	for {
		hdr, err := in.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, fmt.Sprintf("%s %c", hdr.Name, hdr.Typeflag))
	}
	if in.slow == nil || len(names) != 3 || names[0] != "first 0" || !strings.HasSuffix(names[1], " g") || names[2] != "after 0" {
		t.Errorf("read %q (handed over: %v), want first, the global header g, after, read by archive/tar from g on", names, in.slow != nil)
	}
	sameAsArchiveTar(t, "global header", buf.Bytes())
}
