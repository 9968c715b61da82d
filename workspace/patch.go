package workspace

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// Defaults of a diff's rendering.
const (
	DefaultDiffPage     = 64 << 10 // bytes of a page
	DefaultDiffMax      = 4 << 20  // bytes of the whole diff shown
	DefaultDiffFileMax  = 1 << 20  // a file larger than this is named, not shown
	DefaultPatchMax     = 64 << 20 // bytes of a patch
	defaultContextLines = 3
)

// DiffOptions are Diff's options; the zero value takes the defaults.
type DiffOptions struct {
	// Offset is where the page starts in the whole diff: 0, or the Next
	// of the page before.
	Offset int64
	// Limit is a page's size in bytes (DefaultDiffPage when 0); a page
	// ends at a line's end unless a single line is longer.
	Limit int
	// MaxBytes caps the whole diff (DefaultDiffMax when 0): the files
	// past it are named at its end, not shown.
	MaxBytes int
	// MaxFileBytes: a file larger on either side is named, not shown
	// (DefaultDiffFileMax when 0).
	MaxFileBytes int64
}

// DiffPage is one page of a diff.
type DiffPage struct {
	Text   string `json:"text"`
	Offset int64  `json:"offset"`
	// Next is the Offset of the next page, 0 after the last.
	Next  int64 `json:"next,omitempty"`
	Total int64 `json:"total"` // bytes of the whole diff
	// Omitted counts files past MaxBytes, named but not shown.
	Omitted int `json:"omitted,omitempty"`
}

// Diff renders the changes as a unified diff for a reader (git's format:
// a/ and b/ prefixes, three lines of context) and returns one page of it.
// Binary files are named ("Binary files a/x and b/x differ"), so are
// files too large and files whose old content ReadOld could not find,
// each with its sides' sizes, modes and sha256 (NotShown lists them).
// Without ReadOld, a modified or deleted text file has no old content to
// show and is named so.
func (cs *Changes) Diff(opts DiffOptions) DiffPage {
	if opts.Limit <= 0 {
		opts.Limit = DefaultDiffPage
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultDiffMax
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultDiffFileMax
	}
	var b bytes.Buffer
	omitted, _ := cs.render(&b, opts)
	text := b.Bytes()
	total := int64(len(text))
	page := DiffPage{Offset: opts.Offset, Total: total, Omitted: omitted}
	if opts.Offset < 0 || opts.Offset >= total {
		return page
	}
	end := opts.Offset + int64(opts.Limit)
	if end >= total {
		end = total
	} else if nl := bytes.LastIndexByte(text[opts.Offset:end], '\n'); nl >= 0 {
		end = opts.Offset + int64(nl) + 1
		page.Next = end
	} else {
		page.Next = end
	}
	page.Text = string(text[opts.Offset:end])
	return page
}

// render writes the diff a reader sees into b (opts has its defaults)
// and returns how many files it names past the diff's cap, and the
// changes whose new content it does not show, with why.
func (cs *Changes) render(b *bytes.Buffer, opts DiffOptions) (omitted int, hidden []Conflict) {
	for i := range cs.Changes {
		c := &cs.Changes[i]
		if b.Len() >= opts.MaxBytes {
			if omitted == 0 {
				b.WriteString("\n# The diff's cap is reached; not shown:\n")
			}
			omitted++
			fmt.Fprintf(b, "#   %s %s", c.Kind, quoteName(c.Path))
			if c.New != nil {
				fmt.Fprintf(b, ": %s", describe(c.New))
				hidden = append(hidden, Conflict{Path: c.Path, Reason: "past the diff's cap (" + describe(c.New) + ")"})
			}
			b.WriteByte('\n')
			continue
		}
		if why := writeChange(b, c, false, opts.MaxFileBytes); why != "" {
			hidden = append(hidden, Conflict{Path: c.Path, Reason: why})
		}
	}
	return omitted, hidden
}

// NotShown lists the changes with a new side whose content the diff (Diff
// with opts' caps) names without showing: binary ones (git's rule: a NUL
// byte in the first 8000 bytes, so that a script with one after its first
// line is one), those too large to show, and those past the diff's cap.
// (A file whose old content is unknown has its new content shown whole.) The diff lists each with its
// size, mode and hash; a person who reviewed the diff has not seen them,
// so Apply and CommitBranch write them only when asked to (Binary).
func (cs *Changes) NotShown(opts DiffOptions) []Conflict {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultDiffMax
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultDiffFileMax
	}
	var b bytes.Buffer
	_, hidden := cs.render(&b, opts)
	return hidden
}

// describe is a side as the diff lists what it does not show: its size,
// git's mode and its sha256 (sha256sum's), or a link's target.
func describe(s *State) string {
	if s.Type == TypeSymlink {
		return "a symbolic link to " + quoteName(s.Target)
	}
	sum := s.SHA256
	if sum == "" {
		sum = sha256hex(s.Data)
	}
	return fmt.Sprintf("%d bytes, mode %s, sha256 %s", s.Size, gitMode(s), sum)
}

// PatchError lists the files a patch cannot hold: their old content was
// not found (the source changed since the import, or ReadOld was not
// called).
type PatchError struct {
	Paths []string
}

func (e *PatchError) Error() string {
	return fmt.Sprintf("no patch: the old content of %d file(s) is unknown (the source changed since the import?): %s",
		len(e.Paths), strings.Join(e.Paths[:min(len(e.Paths), 10)], ", "))
}

// Patch renders the changes as a patch that `git apply` (and `git am`'s
// apply step) takes: text files as unified diffs, binary files as git's
// binary patches, modes and links as git writes them. It needs the old
// content of modified and deleted files (ReadOld); files without it give
// a *PatchError. A patch over maxBytes (DefaultPatchMax when 0) gives a
// *CapError.
func (cs *Changes) Patch(maxBytes int64) ([]byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultPatchMax
	}
	var missing []string
	for i := range cs.Changes {
		c := &cs.Changes[i]
		if c.Old != nil && c.Old.Type == TypeFile && c.Old.Data == nil && c.Old.Size > 0 {
			if c.Kind == Deleted || c.New == nil || c.New.SHA256 != c.Old.SHA256 || c.New.Type != TypeFile {
				missing = append(missing, c.Path)
			}
		}
	}
	if len(missing) > 0 {
		return nil, &PatchError{Paths: missing}
	}
	var b bytes.Buffer
	for i := range cs.Changes {
		writeChange(&b, &cs.Changes[i], true, 0)
		if int64(b.Len()) > maxBytes {
			return nil, &CapError{What: "bytes of patch", Found: int64(b.Len()), Cap: maxBytes, More: i < len(cs.Changes)-1}
		}
	}
	return b.Bytes(), nil
}

// gitMode is the mode git records: 100644, 100755 or 120000.
func gitMode(s *State) string {
	switch {
	case s.Type == TypeSymlink:
		return "120000"
	case s.Mode.Exec():
		return "100755"
	}
	return "100644"
}

// content is a side's bytes: a link's target, a file's data.
func content(s *State) []byte {
	if s == nil {
		return nil
	}
	if s.Type == TypeSymlink {
		return []byte(s.Target)
	}
	return s.Data
}

// writeChange writes one change: forApply writes binary patches and
// everything in full; otherwise binary and large files are listed (size,
// mode, hash), not shown, and it returns why the new side is not shown
// ("" when it is, or there is none).
func writeChange(b *bytes.Buffer, c *Change, forApply bool, maxFile int64) string {
	if c.Old != nil && c.New != nil && c.Old.Type != c.New.Type {
		// A file became a link or the other way: git writes a deletion
		// and a creation.
		writeChange(b, &Change{Path: c.Path, Kind: Deleted, Old: c.Old, Binary: c.Old.Type == TypeFile && isBinary(c.Old.Data), OldMissing: c.OldMissing}, forApply, maxFile)
		return writeChange(b, &Change{Path: c.Path, Kind: Added, New: c.New, Binary: c.New.Type == TypeFile && isBinary(c.New.Data)}, forApply, maxFile)
	}
	// Not shown: the sides listed, and why, for NotShown.
	listed := func(why string) string {
		if c.Old != nil {
			fmt.Fprintf(b, "#   old: %s\n", describe(c.Old))
		}
		if c.New == nil {
			return ""
		}
		fmt.Fprintf(b, "#   new: %s\n", describe(c.New))
		return why + " (" + describe(c.New) + ")"
	}
	a, bn := quoteName("a/"+c.Path), quoteName("b/"+c.Path)
	fmt.Fprintf(b, "diff --git %s %s\n", a, bn)
	switch c.Kind {
	case Added:
		fmt.Fprintf(b, "new file mode %s\n", gitMode(c.New))
	case Deleted:
		fmt.Fprintf(b, "deleted file mode %s\n", gitMode(c.Old))
	default:
		if om, nm := gitMode(c.Old), gitMode(c.New); om != nm {
			fmt.Fprintf(b, "old mode %s\nnew mode %s\n", om, nm)
		}
		if c.Old.SHA256 == c.New.SHA256 && c.Old.Type == TypeFile || c.Old.Type == TypeSymlink && c.Old.Target == c.New.Target {
			return "" // the mode only
		}
	}
	oldName, newName := a, bn
	if c.Old == nil {
		oldName = "/dev/null"
	}
	if c.New == nil {
		newName = "/dev/null"
	}
	binary := c.Binary || c.New != nil && c.New.Type == TypeFile && isBinary(c.New.Data)
	if binary {
		if !forApply {
			fmt.Fprintf(b, "Binary files %s and %s differ\n", oldName, newName)
			return listed("binary: a NUL byte in its first 8000 bytes")
		}
		writeBinary(b, c)
		return ""
	}
	if !forApply && (c.Old != nil && c.Old.Size > maxFile || c.New != nil && c.New.Size > maxFile) {
		fmt.Fprintf(b, "# %s: too large to show (%s)\n", quoteName(c.Path), sizes(c))
		return listed(fmt.Sprintf("too large to show (over %d bytes)", maxFile))
	}
	if c.Old != nil && c.Old.Type == TypeFile && c.Old.Data == nil && c.Old.Size > 0 {
		fmt.Fprintf(b, "# %s: the old content is unknown (%s): not shown\n", quoteName(c.Path), orStr(c.OldMissing, "ReadOld was not called"))
		if forApply || c.New == nil {
			return ""
		}
		// What would be written is shown all the same, whole.
		fmt.Fprintf(b, "#   new: %s, in full:\n", describe(c.New))
		for _, l := range splitLines(content(c.New)) {
			b.WriteByte('+')
			b.WriteString(l)
			if !strings.HasSuffix(l, "\n") {
				b.WriteString("\n\\ No newline at end of file\n")
			}
		}
		return ""
	}
	oldLines, newLines := splitLines(content(c.Old)), splitLines(content(c.New))
	if len(oldLines) == 0 && len(newLines) == 0 {
		return "" // an empty file added or deleted: the header says it all
	}
	fmt.Fprintf(b, "--- %s\n+++ %s\n", oldName, newName)
	writeHunks(b, oldLines, newLines, diffLines(oldLines, newLines), defaultContextLines)
	return ""
}

func orStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func sizes(c *Change) string {
	switch {
	case c.Old == nil:
		return fmt.Sprintf("%d bytes", c.New.Size)
	case c.New == nil:
		return fmt.Sprintf("%d bytes", c.Old.Size)
	}
	return fmt.Sprintf("%d -> %d bytes", c.Old.Size, c.New.Size)
}

// splitLines splits after each newline; a last line without one keeps
// none.
func splitLines(data []byte) []string {
	var lines []string
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			lines = append(lines, string(data))
			break
		}
		lines = append(lines, string(data[:i+1]))
		data = data[i+1:]
	}
	return lines
}

// writeHunks writes the edit script as unified hunks with ctx lines of
// context, merging hunks whose context would touch.
func writeHunks(b *bytes.Buffer, a, bl []string, ops []op, ctx int) {
	// Indexes of changed ops.
	var changed []int
	for i, o := range ops {
		if o.kind != '=' {
			changed = append(changed, i)
		}
	}
	for len(changed) > 0 {
		first := changed[0]
		last := first
		n := 1
		for n < len(changed) && changed[n]-last <= 2*ctx+1 {
			last = changed[n]
			n++
		}
		changed = changed[n:]
		start := max(first-ctx, 0)
		end := min(last+ctx+1, len(ops))
		// Line numbers: where the hunk starts on each side.
		aStart, bStart := lineAt(ops, start)
		aCount, bCount := 0, 0
		for _, o := range ops[start:end] {
			if o.kind != '+' {
				aCount++
			}
			if o.kind != '-' {
				bCount++
			}
		}
		fmt.Fprintf(b, "@@ -%s +%s @@\n", hunkRange(aStart, aCount), hunkRange(bStart, bCount))
		for _, o := range ops[start:end] {
			var line string
			switch o.kind {
			case '=':
				line = a[o.a]
			case '-':
				line = a[o.a]
			case '+':
				line = bl[o.b]
			}
			kind := o.kind
			if kind == '=' {
				kind = ' '
			}
			b.WriteByte(kind)
			b.WriteString(line)
			if !strings.HasSuffix(line, "\n") {
				b.WriteString("\n\\ No newline at end of file\n")
			}
		}
	}
}

// lineAt returns the 0-based old and new line numbers at ops[i].
func lineAt(ops []op, i int) (int, int) {
	a, b := 0, 0
	for _, o := range ops[:i] {
		if o.kind != '+' {
			a++
		}
		if o.kind != '-' {
			b++
		}
	}
	return a, b
}

// hunkRange is a side's "start,count": 1-based; an empty side names the
// line before it; a count of 1 is left out, as diff does.
func hunkRange(start, count int) string {
	switch count {
	case 0:
		return fmt.Sprintf("%d,0", start)
	case 1:
		return strconv.Itoa(start + 1)
	}
	return fmt.Sprintf("%d,%d", start+1, count)
}

// quoteName quotes a name as git does when it holds a double quote, a
// backslash, a control character or a byte over 0x7f (core.quotePath's
// default), in C style; otherwise it is written as is.
func quoteName(s string) string {
	need := false
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			need = true
			break
		}
	}
	if !need {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\a':
			b.WriteString(`\a`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\v':
			b.WriteString(`\v`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if c < 0x20 || c >= 0x7f {
				fmt.Fprintf(&b, `\%03o`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// blobID is git's object id of a blob with this content.
func blobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

const zeroID = "0000000000000000000000000000000000000000"

// writeBinary writes git's binary patch: the full index line (git apply
// checks the preimage by it and needs it for binary patches), then the
// new content and the old one, each deflated and in base 85.
func writeBinary(b *bytes.Buffer, c *Change) {
	oldID, newID := zeroID, zeroID
	if c.Old != nil {
		oldID = blobID(c.Old.Data)
	}
	if c.New != nil {
		newID = blobID(c.New.Data)
	}
	fmt.Fprintf(b, "index %s..%s\n", oldID, newID)
	b.WriteString("GIT binary patch\n")
	writeLiteral(b, content(c.New))
	writeLiteral(b, content(c.Old))
}

func writeLiteral(b *bytes.Buffer, data []byte) {
	var z bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	zw.Write(data)
	zw.Close()
	fmt.Fprintf(b, "literal %d\n", len(data))
	deflated := z.Bytes()
	for len(deflated) > 0 {
		n := min(len(deflated), 52)
		if n <= 26 {
			b.WriteByte(byte('A' + n - 1))
		} else {
			b.WriteByte(byte('a' + n - 27))
		}
		encode85(b, deflated[:n])
		b.WriteByte('\n')
		deflated = deflated[n:]
	}
	b.WriteByte('\n')
}

const alphabet85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

// encode85 is git's base 85: each 4 bytes (the last group padded with
// zeros), big-endian, as 5 digits, most significant first.
func encode85(b *bytes.Buffer, data []byte) {
	for len(data) > 0 {
		var v uint32
		for i := 0; i < 4; i++ {
			v <<= 8
			if i < len(data) {
				v |= uint32(data[i])
			}
		}
		var d [5]byte
		for i := 4; i >= 0; i-- {
			d[i] = alphabet85[v%85]
			v /= 85
		}
		b.Write(d[:])
		data = data[min(4, len(data)):]
	}
}
