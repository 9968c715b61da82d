//go:build unix

package workspace

import (
	"fmt"
	"sort"
)

// Since is what changed between two states of one workspace: prev's, the
// changes written into a target before (by Apply), and cs's, computed
// later against the same import. Both are changes since the import, so
// that a file prev changed and cs left as prev did is no change, one cs
// changed further goes from prev's content to cs's, and one prev changed
// that cs has back as imported goes back to the import's content. Apply
// of the result checks the target against what prev wrote: it reports a
// conflict only for what someone else changed there since.
//
// A path prev changed and cs has back as imported needs the import's
// content, which ReadOld keeps in prev: without it (the source had
// changed before prev was read back), Since fails naming the paths.
func (cs *Changes) Since(prev *Changes) (*Changes, error) {
	before := make(map[string]*Change, len(prev.Changes))
	for i := range prev.Changes {
		before[prev.Changes[i].Path] = &prev.Changes[i]
	}
	now := make(map[string]*Change, len(cs.Changes))
	for i := range cs.Changes {
		now[cs.Changes[i].Path] = &cs.Changes[i]
	}
	out := &Changes{Changes: []Change{}, Skipped: cs.Skipped, IgnoredAdded: cs.IgnoredAdded}
	var lost []string
	for p, c := range now {
		pc, ok := before[p]
		if !ok {
			// Untouched by prev: the target holds the import's.
			out.Changes = append(out.Changes, *c)
			continue
		}
		if sameState(pc.New, c.New) {
			continue
		}
		out.Changes = append(out.Changes, between(p, pc.New, c.New))
	}
	for p, pc := range before {
		if _, ok := now[p]; ok || sameState(pc.New, pc.Old) {
			continue
		}
		// Back as imported: the import's side of prev.
		if pc.Old != nil && pc.Old.Type == TypeFile && int64(len(pc.Old.Data)) != pc.Old.Size {
			lost = append(lost, p)
			continue
		}
		out.Changes = append(out.Changes, between(p, pc.New, pc.Old))
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		return nil, fmt.Errorf("%d files are back as imported but the import's content of them was not kept (the source changed before the earlier changes were read back), such as %s: apply into a fresh copy with --to, or commit with --branch", len(lost), lost[0])
	}
	sort.Slice(out.Changes, func(i, j int) bool { return out.Changes[i].Path < out.Changes[j].Path })
	for _, c := range out.Changes {
		switch c.Kind {
		case Added:
			out.Added++
		case Modified:
			out.Modified++
		case Deleted:
			out.Deleted++
		}
		if c.New != nil {
			out.Bytes += c.New.Size
		}
	}
	return out, nil
}

// between is the change of path p from old to new (either nil: absent).
func between(p string, old, new *State) Change {
	c := Change{Path: p, Kind: Modified, Old: old, New: new}
	switch {
	case old == nil:
		c.Kind = Added
	case new == nil:
		c.Kind = Deleted
	}
	c.Binary = old != nil && isBinary(old.Data) || new != nil && isBinary(new.Data)
	return c
}

// sameState: a and b are the same file or link (or both absent).
func sameState(a, b *State) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Type == b.Type && a.Mode == b.Mode && a.Size == b.Size && a.Target == b.Target && a.SHA256 == b.SHA256
}
