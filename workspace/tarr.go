package workspace

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"
)

// tarIn reads the tar streams Extract and ReadChanges take: the headers
// every tar writer makes (ustar, pax, GNU, v7; their regular files,
// directories, links and special files; pax's path, linkpath, size and
// mtime records; GNU's long names) it reads itself, into what
// archive/tar's Reader would give; anything else (a sparse file, a
// global pax header, a star header, a tape volume) hands the stream,
// from that entry's first header block on, to archive/tar's Reader,
// which reads the rest. archive/tar's Reader checks every header block
// for non-ASCII bytes to tell formats apart and allocates a map per pax
// header: a third of the extract helper's user time on an import of
// 10,000 small files (issue 41, item 3). TestTarInLikeArchiveTar reads
// the same archives with both.
type tarIn struct {
	r    *bufio.Reader
	blk  [512]byte
	left int64 // bytes of the current file's data still to read
	pad  int64 // and of its padding
	// chain: the current entry's header blocks and the data of its pax
	// and GNU headers, as read, for archive/tar if it is handed over.
	chain []byte
	slow  *tar.Reader // once handed over
}

// maxSpecial caps a pax header's or a GNU long name's data, as
// archive/tar does.
const maxSpecial = 1 << 20

func newTarIn(r *bufio.Reader) *tarIn { return &tarIn{r: r} }

var errTarHeader = tar.ErrHeader

// Next returns the next entry's header, io.EOF at the archive's end.
func (t *tarIn) Next() (*tar.Header, error) {
	if t.slow != nil {
		return t.slow.Next()
	}
	t.chain = t.chain[:0]
	// The last pax header's records (a later one replaces them all) and
	// GNU's long names, for the entry they come before.
	var pax struct {
		path, link string
		size       int64
		mtime      time.Time
		have       uint8
	}
	const (
		havePath = 1 << iota
		haveLink
		haveSize
		haveMtime
	)
	var longName, longLink string
	for {
		if err := t.skip(); err != nil {
			return nil, err
		}
		start := len(t.chain)
		t.chain = append(t.chain, make([]byte, 512)...)
		blk := t.chain[start:]
		if _, err := io.ReadFull(t.r, blk); err != nil {
			return nil, err // io.EOF: the stream ended between entries
		}
		if isZero(blk) {
			// The end: two zero blocks (or one and the stream's end).
			if _, err := io.ReadFull(t.r, blk); err != nil {
				return nil, err
			}
			if isZero(blk) {
				return nil, io.EOF
			}
			return nil, errTarHeader
		}
		copy(t.blk[:], blk)
		format, ok := t.format()
		if !ok {
			return nil, errTarHeader
		}
		if format == formatOther {
			return t.handOver()
		}
		hdr, err := t.header(format)
		if err != nil {
			return nil, err
		}
		switch hdr.Typeflag {
		case tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
			if hdr.Size < 0 {
				return nil, errTarHeader
			}
			if hdr.Size > maxSpecial {
				return nil, tar.ErrFieldTooLong
			}
			n := int(hdr.Size)
			at := len(t.chain)
			t.chain = append(t.chain, make([]byte, n)...)
			if _, err := io.ReadFull(t.r, t.chain[at:]); err != nil {
				return nil, unexpected(err)
			}
			data := t.chain[at:]
			switch hdr.Typeflag {
			case tar.TypeGNULongName:
				longName = cString(data)
			case tar.TypeGNULongLink:
				longLink = cString(data)
			default:
				pax.have = 0
				slow := false
				// The last record of a key counts (archive/tar keeps a map):
				// values are read once all are in.
				var size, mtime [1]string
				var others [4]string
				err := paxRecords(data, func(k, v string) error {
					switch {
					case k == "path":
						pax.path, pax.have = v, pax.have&^havePath
						if v != "" {
							pax.have |= havePath
						}
					case k == "linkpath":
						pax.link, pax.have = v, pax.have&^haveLink
						if v != "" {
							pax.have |= haveLink
						}
					case k == "size":
						size[0] = v
					case k == "mtime":
						mtime[0] = v
					case k == "atime":
						others[0] = v
					case k == "ctime":
						others[1] = v
					case k == "uid":
						others[2] = v
					case k == "gid":
						others[3] = v
					case strings.HasPrefix(k, "GNU.sparse."):
						slow = true
					}
					return nil
				})
				if err != nil {
					return nil, err
				}
				if slow {
					return t.handOver()
				}
				// Empty values keep the header's (archive/tar's rule).
				if v := size[0]; v != "" {
					if pax.size, err = strconv.ParseInt(v, 10, 64); err != nil {
						return nil, errTarHeader
					}
					pax.have |= haveSize
				}
				if v := mtime[0]; v != "" {
					if pax.mtime, err = parsePAXTime(v); err != nil {
						return nil, errTarHeader
					}
					pax.have |= haveMtime
				}
				for i, v := range others {
					switch {
					case v == "":
					case i < 2:
						_, err = parsePAXTime(v)
					default:
						_, err = strconv.ParseInt(v, 10, 64)
					}
					if err != nil {
						return nil, errTarHeader
					}
				}

			}
			// Its padding, after its records are read (archive/tar's
			// order: a stream cut in it ends there), kept in the chain.
			if pad := -n & 511; pad > 0 {
				at := len(t.chain)
				t.chain = append(t.chain, make([]byte, pad)...)
				if _, err := io.ReadFull(t.r, t.chain[at:]); err != nil {
					if err == io.ErrUnexpectedEOF {
						err = io.EOF
					}
					return nil, err
				}
			}
			continue
		case tar.TypeReg, tar.TypeRegA, tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo, tar.TypeCont:
		default:
			return t.handOver()
		}
		if pax.have&havePath != 0 {
			hdr.Name = pax.path
		}
		if pax.have&haveLink != 0 {
			hdr.Linkname = pax.link
		}
		if pax.have&haveSize != 0 {
			hdr.Size = pax.size
		}
		if pax.have&haveMtime != 0 {
			hdr.ModTime = pax.mtime
		}
		if longName != "" {
			hdr.Name = longName
		}
		if longLink != "" {
			hdr.Linkname = longLink
		}
		if hdr.Typeflag == tar.TypeRegA {
			if strings.HasSuffix(hdr.Name, "/") {
				hdr.Typeflag = tar.TypeDir
			} else {
				hdr.Typeflag = tar.TypeReg
			}
		}
		// What has data: archive/tar's rule (links, devices, FIFOs and
		// directories have none, whatever their size field says).
		n := hdr.Size
		switch hdr.Typeflag {
		case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
			n = 0
		}
		if n < 0 {
			return nil, errTarHeader
		}
		t.left, t.pad = n, -n&511
		return hdr, nil
	}
}

// skip reads past the rest of the current file's data and its padding;
// a stream that ends in the padding ends there, as archive/tar reads it.
func (t *tarIn) skip() error {
	if t.left > 0 {
		if _, err := t.r.Discard(int(t.left)); err != nil {
			return unexpected(err)
		}
		t.left = 0
	}
	if t.pad > 0 {
		_, err := t.r.Discard(int(t.pad))
		t.pad = 0
		if err != nil {
			return err // io.EOF: archive/tar takes a stream cut in the padding for one that ended
		}
	}
	return nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Read reads the current file's data.
func (t *tarIn) Read(p []byte) (int, error) {
	if t.slow != nil {
		return t.slow.Read(p)
	}
	if t.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > t.left {
		p = p[:t.left]
	}
	n, err := t.r.Read(p)
	t.left -= int64(n)
	if err == io.EOF {
		if t.left > 0 {
			return n, io.ErrUnexpectedEOF
		}
		err = nil
	}
	return n, err
}

// handOver gives the stream to archive/tar's Reader from the current
// entry's first header block on, and reads that entry with it.
func (t *tarIn) handOver() (*tar.Header, error) {
	t.slow = tar.NewReader(io.MultiReader(bytes.NewReader(bytes.Clone(t.chain)), t.r))
	t.chain = nil
	return t.slow.Next()
}

const (
	formatUSTAR = iota // ustar or pax: a prefix before the name
	formatGNU
	formatV7
	formatOther
)

// format checks the block's checksum and tells its format.
func (t *tarIn) format() (int, bool) {
	b := &t.blk
	want, err := parseOctal(b[148:156])
	if err != nil {
		return 0, false
	}
	// The sum of the bytes with the checksum's own as spaces, unsigned
	// (or signed, as some old writers summed them).
	unsigned := int64(8 * ' ')
	for _, c := range b[:148] {
		unsigned += int64(c)
	}
	for _, c := range b[156:] {
		unsigned += int64(c)
	}
	if want != unsigned {
		signed := int64(8 * ' ')
		for i, c := range b {
			if i < 148 || i >= 156 {
				signed += int64(int8(c))
			}
		}
		if want != signed {
			return 0, false
		}
	}
	magic, version := string(b[257:263]), string(b[263:265])
	switch {
	case magic == "ustar\x00" && string(b[508:512]) == "tar\x00":
		return formatOther, true // star: archive/tar reads it
	case magic == "ustar\x00":
		return formatUSTAR, true
	case magic == "ustar " && version == " \x00":
		// Access and change times that do not parse: archive/tar takes
		// the field for a prefix (old Go writers' GNU headers).
		for _, f := range [][]byte{b[345:357], b[357:369]} {
			if _, err := parseTarNumber(f); f[0] != 0 && err != nil {
				return formatOther, true
			}
		}
		return formatGNU, true
	}
	return formatV7, true
}

// header reads the block's fields.
func (t *tarIn) header(format int) (*tar.Header, error) {
	b := &t.blk
	hdr := &tar.Header{Typeflag: b[156], Name: cString(b[0:100]), Linkname: cString(b[157:257])}
	mode, err1 := parseTarNumber(b[100:108])
	size, err2 := parseTarNumber(b[124:136])
	mtime, err3 := parseTarNumber(b[136:148])
	if err1 != nil || err2 != nil || err3 != nil {
		return nil, errTarHeader
	}
	hdr.Mode, hdr.Size, hdr.ModTime = mode, size, time.Unix(mtime, 0)
	// Fields this package does not use, checked as archive/tar checks
	// them: a stream it refuses is refused here too.
	checked := [][]byte{b[108:116], b[116:124]} // uid, gid
	if format != formatV7 {
		checked = append(checked, b[329:337], b[337:345]) // devmajor, devminor
	}
	for _, f := range checked {
		if _, err := parseTarNumber(f); err != nil {
			return nil, errTarHeader
		}
	}
	if format == formatUSTAR {
		if prefix := cString(b[345:500]); prefix != "" {
			hdr.Name = prefix + "/" + hdr.Name
		}
	}
	return hdr, nil
}

// cString is b up to its first NUL.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// parseTarNumber reads a numeric field: octal digits between spaces and
// NULs, or GNU's base-256 (the high bit of the first byte set).
func parseTarNumber(b []byte) (int64, error) {
	if len(b) > 0 && b[0]&0x80 != 0 {
		// Two's complement, big-endian, the first byte's high bit left
		// out.
		var inv byte
		if b[0]&0x40 != 0 {
			inv = 0xff
		}
		var x uint64
		for i, c := range b {
			c ^= inv
			if i == 0 {
				c &= 0x7f
			}
			if x>>56 > 0 {
				return 0, errTarHeader
			}
			x = x<<8 | uint64(c)
		}
		if x>>63 > 0 {
			return 0, errTarHeader
		}
		if inv == 0xff {
			return ^int64(x), nil
		}
		return int64(x), nil
	}
	return parseOctal(b)
}

// parseOctal reads octal digits between spaces and NULs (up to a NUL
// within them, as archive/tar reads them).
func parseOctal(b []byte) (int64, error) {
	i, j := 0, len(b)
	for i < j && (b[i] == ' ' || b[i] == 0) {
		i++
	}
	for j > i && (b[j-1] == ' ' || b[j-1] == 0) {
		j--
	}
	if k := bytes.IndexByte(b[i:j], 0); k >= 0 {
		j = i + k
	}
	if i == j {
		return 0, nil
	}
	var x int64
	for _, c := range b[i:j] {
		if c < '0' || c > '7' || x > (1<<63-1)>>3 {
			return 0, errTarHeader
		}
		x = x<<3 | int64(c-'0')
	}
	return x, nil
}

// paxRecords calls f with each "LEN key=value\n" record of a pax
// header's data, refusing a malformed one as archive/tar does.
func paxRecords(data []byte, f func(k, v string) error) error {
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		if sp <= 0 {
			return errTarHeader
		}
		n, err := strconv.Atoi(string(data[:sp]))
		if err != nil || n < 5 || n <= sp+1 || n > len(data) || data[n-1] != '\n' {
			return errTarHeader
		}
		rec := data[sp+1 : n-1]
		data = data[n:]
		eq := bytes.IndexByte(rec, '=')
		if eq < 0 {
			return errTarHeader
		}
		k, v := string(rec[:eq]), string(rec[eq+1:])
		switch k {
		case "path", "linkpath", "uname", "gname":
			if strings.IndexByte(v, 0) >= 0 {
				return errTarHeader
			}
		}
		if k == "" || strings.IndexByte(k, 0) >= 0 {
			return errTarHeader
		}
		if err := f(k, v); err != nil {
			return err
		}
	}
	return nil
}

// parsePAXTime reads pax's "seconds[.fraction]", to the nanosecond (the
// fraction's further digits checked and dropped), as archive/tar does.
func parsePAXTime(s string) (time.Time, error) {
	sec, frac, _ := strings.Cut(s, ".")
	secs, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}, errTarHeader
	}
	if frac == "" {
		return time.Unix(secs, 0), nil
	}
	ns := int64(0)
	for i := 0; i < len(frac); i++ {
		c := frac[i]
		if c < '0' || c > '9' {
			return time.Time{}, errTarHeader
		}
		if i < 9 {
			ns = ns*10 + int64(c-'0')
		}
	}
	for i := len(frac); i < 9; i++ {
		ns *= 10
	}
	if sec != "" && sec[0] == '-' {
		ns = -ns
	}
	return time.Unix(secs, ns), nil
}

// unexpected turns an end of the stream inside an entry into
// io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
