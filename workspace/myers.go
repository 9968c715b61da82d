package workspace

// A line diff: Myers' O((N+M)·D) algorithm ("An O(ND) Difference
// Algorithm and Its Variations", 1986) on lines numbered by content, after
// the common head and tail are set aside. Past maxEditCost edits the rest
// is given as one replacement: still a correct diff, only not the
// shortest, and the time and memory stay bounded on files that share
// nothing.

const maxEditCost = 1000

// op is one line of an edit script: '=' (both sides), '-' (old only),
// '+' (new only).
type op struct {
	kind byte
	a, b int // line indexes in old and new (the one the kind has)
}

func diffLines(a, b []string) []op {
	ids := map[string]int32{}
	num := func(lines []string) []int32 {
		out := make([]int32, len(lines))
		for i, l := range lines {
			id, ok := ids[l]
			if !ok {
				id = int32(len(ids))
				ids[l] = id
			}
			out[i] = id
		}
		return out
	}
	x, y := num(a), num(b)
	head := 0
	for head < len(x) && head < len(y) && x[head] == y[head] {
		head++
	}
	tail := 0
	for tail < len(x)-head && tail < len(y)-head && x[len(x)-1-tail] == y[len(y)-1-tail] {
		tail++
	}
	var ops []op
	for i := 0; i < head; i++ {
		ops = append(ops, op{'=', i, i})
	}
	ops = append(ops, myers(x[head:len(x)-tail], y[head:len(y)-tail], head, head)...)
	for i := 0; i < tail; i++ {
		ops = append(ops, op{'=', len(x) - tail + i, len(y) - tail + i})
	}
	return ops
}

// myers returns the edit script from x to y, indexes offset by ox, oy.
func myers(x, y []int32, ox, oy int) []op {
	n, m := len(x), len(y)
	if n == 0 || m == 0 {
		return replace(n, m, ox, oy)
	}
	max := n + m
	if max > maxEditCost {
		max = maxEditCost
	}
	off := max + 1
	v := make([]int32, 2*max+3)
	var trace [][]int32
	for d := 0; d <= max; d++ {
		// Keep the part of v this round can read: diagonals -d..d.
		snap := make([]int32, 2*d+1)
		copy(snap, v[off-d:off+d+1])
		trace = append(trace, snap)
		for k := -d; k <= d; k += 2 {
			var i int
			if k == -d || k != d && v[off+k-1] < v[off+k+1] {
				i = int(v[off+k+1]) // down: an insertion
			} else {
				i = int(v[off+k-1]) + 1 // right: a deletion
			}
			j := i - k
			for i < n && j < m && x[i] == y[j] {
				i++
				j++
			}
			v[off+k] = int32(i)
			if i >= n && j >= m {
				return backtrack(trace, n, m, d, ox, oy)
			}
		}
	}
	return replace(n, m, ox, oy)
}

// backtrack walks the rounds back from the end (n, m), reached in round
// d: trace[d] is v as round d found it, diagonal k at index k+d.
func backtrack(trace [][]int32, n, m, d, ox, oy int) []op {
	x, y := n, m
	var rev []op
	for ; d > 0; d-- {
		v := trace[d]
		get := func(k int) int { return int(v[k+d]) }
		k := x - y
		pk := k - 1
		if k == -d || k != d && get(k-1) < get(k+1) {
			pk = k + 1
		}
		px := get(pk)
		py := px - pk
		for x > px && y > py {
			x--
			y--
			rev = append(rev, op{'=', ox + x, oy + y})
		}
		if x == px {
			y--
			rev = append(rev, op{'+', ox + x, oy + y})
		} else {
			x--
			rev = append(rev, op{'-', ox + x, oy + y})
		}
	}
	for x > 0 && y > 0 {
		x--
		y--
		rev = append(rev, op{'=', ox + x, oy + y})
	}
	out := make([]op, len(rev))
	for i, o := range rev {
		out[len(rev)-1-i] = o
	}
	return out
}

func replace(n, m, ox, oy int) []op {
	ops := make([]op, 0, n+m)
	for i := 0; i < n; i++ {
		ops = append(ops, op{'-', ox + i, oy})
	}
	for j := 0; j < m; j++ {
		ops = append(ops, op{'+', ox + n, oy + j})
	}
	return ops
}
