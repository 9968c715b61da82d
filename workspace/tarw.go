package workspace

import (
	"fmt"
	"io"
	"strconv"
)

// tarWriter writes the tar stream Archive makes: a POSIX pax stream
// (IEEE Std 1003.1-2001 "pax" format: a ustar header, preceded by an
// extended header when a value does not fit it), with only the fields
// this package writes: name, mode, size, modification time (to the
// nanosecond: an "mtime" record), type and link target. Owners are
// 0 and unnamed. archive/tar's Writer does the same work at several
// times the cost per entry (it works out, for every header, which format
// can hold it); this is what the import spends most of its time on after
// reading and hashing. Read with archive/tar (or any tar).
type tarWriter struct {
	w       io.Writer
	left    int64 // bytes of the current file still to come
	pad     int64 // zeros after it, up to a block
	block   [512]byte
	records []byte
}

func newTarWriter(w io.Writer) *tarWriter { return &tarWriter{w: w} }

const (
	tarReg     = '0'
	tarSymlink = '2'
	tarDir     = '5'
	tarPAX     = 'x'
)

// header writes an entry's header; a file's size bytes follow with Write.
func (t *tarWriter) header(name string, typ byte, mode int64, size, mtime int64, link string) error {
	if t.left != 0 {
		return fmt.Errorf("tar: %d bytes of the previous file missing", t.left)
	}
	if err := t.flushPad(); err != nil {
		return err
	}
	t.records = t.records[:0]
	if mtime%1e9 != 0 || mtime < 0 {
		t.records = paxRecord(t.records, "mtime", paxTime(mtime))
	}
	if !fitsUstar(name) {
		t.records = paxRecord(t.records, "path", name)
	}
	if !fitsUstar(link) {
		t.records = paxRecord(t.records, "linkpath", link)
	}
	if size > 0o77777777777 {
		t.records = paxRecord(t.records, "size", strconv.FormatInt(size, 10))
	}
	if len(t.records) > 0 {
		if err := t.ustar("PaxHeaders.0/entry", tarPAX, 0o644, int64(len(t.records)), 0, ""); err != nil {
			return err
		}
		if _, err := t.w.Write(t.records); err != nil {
			return err
		}
		t.pad = padding(int64(len(t.records)))
		if err := t.flushPad(); err != nil {
			return err
		}
	}
	if err := t.ustar(name, typ, mode, size, mtime, link); err != nil {
		return err
	}
	t.left, t.pad = size, padding(size)
	return nil
}

func padding(n int64) int64 { return -n & 511 }

func fitsUstar(s string) bool {
	if len(s) > 100 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 || s[i] == 0 {
			return false
		}
	}
	return true
}

// ustar writes one ustar header block; fields a pax record carries are
// cut to what fits (readers take the record's).
func (t *tarWriter) ustar(name string, typ byte, mode int64, size, mtime int64, link string) error {
	b := t.block[:]
	clear(b)
	copy(b[0:100], name)
	octal(b[100:108], mode&0o7777)
	octal(b[108:116], 0) // uid
	octal(b[116:124], 0) // gid
	if size > 0o77777777777 {
		size = 0
	}
	octal(b[124:136], size)
	sec := mtime / 1e9
	if mtime < 0 || sec > 0o77777777777 {
		sec = 0
	}
	octal(b[136:148], sec)
	b[156] = typ
	copy(b[157:257], link)
	copy(b[257:265], "ustar\x0000")
	octal(b[329:337], 0) // devmajor
	octal(b[337:345], 0) // devminor
	// The checksum: the sum of the bytes with its own field as spaces.
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	octal(b[148:155], int64(sum))
	b[155] = ' '
	_, err := t.w.Write(b)
	return err
}

// octal writes v (which fits) in a field: zero-padded octal digits and a
// NUL. Digit by digit, as paxTime: two headers a file, a string each
// was a tenth of writing them.
func octal(f []byte, v int64) {
	n := len(f) - 1
	f[n] = 0
	for i := n - 1; i >= 0; i-- {
		f[i] = byte('0' + v&7)
		v >>= 3
	}
}

// paxRecord appends "LEN key=value\n", LEN counting itself.
func paxRecord(dst []byte, key, value string) []byte {
	n := len(key) + len(value) + 3 // ' ', '=', '\n'
	l := n + len(strconv.Itoa(n))
	if len(strconv.Itoa(l)) != len(strconv.Itoa(n)) {
		l = n + len(strconv.Itoa(l))
	}
	dst = strconv.AppendInt(dst, int64(l), 10)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	dst = append(dst, '=')
	dst = append(dst, value...)
	return append(dst, '\n')
}

// paxTime is a time in nanoseconds as pax writes it: seconds, a point
// and nine digits.
func paxTime(ns int64) string {
	sec, frac := ns/1e9, ns%1e9
	if frac < 0 {
		sec--
		frac += 1e9
	}
	var b [32]byte
	out := strconv.AppendInt(b[:0], sec, 10)
	out = append(out, '.')
	for d := int64(1e8); d > 0; d /= 10 {
		out = append(out, byte('0'+frac/d%10))
	}
	return string(out)
}

// Write writes the current file's data.
func (t *tarWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > t.left {
		return 0, fmt.Errorf("tar: %d bytes more than the header said", int64(len(p))-t.left)
	}
	n, err := t.w.Write(p)
	t.left -= int64(n)
	return n, err
}

var zeros [1024]byte

func (t *tarWriter) flushPad() error {
	if t.pad == 0 {
		return nil
	}
	_, err := t.w.Write(zeros[:t.pad])
	t.pad = 0
	return err
}

// Close ends the stream with two zero blocks (it does not close w).
func (t *tarWriter) Close() error {
	if t.left != 0 {
		return fmt.Errorf("tar: %d bytes of the last file missing", t.left)
	}
	if err := t.flushPad(); err != nil {
		return err
	}
	_, err := t.w.Write(zeros[:])
	return err
}
