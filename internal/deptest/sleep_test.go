package deptest

import (
	"go/ast"
	"path/filepath"
	"strings"
	"testing"
)

// Sleeps in tests (issue 33): a test waits for the event it expects (a
// channel, the service's Wait, testkit.Eventually's poll with a deadline),
// not for a time it hopes is enough. A time.Sleep is left only where the
// test is of time passing, or checks that something does not happen; each
// says why in a comment on its line or the lines just above.
//
// The ceilings are the counts now, at the goal of issue 33 (at most 20,
// each with its reason): lower them as more sleeps go. pvesim/ (a simulator of a slow API, whose
// own tests time it) and e2e/ (the built binary, driven from outside) are
// not counted.
const (
	// MaxTestSleeps is the most time.Sleep calls in the counted tests.
	MaxTestSleeps = 20
	// MaxUnexplainedSleeps is the most of them without a comment saying
	// why.
	MaxUnexplainedSleeps = 0
)

// TestSleepCount: the counted tests call time.Sleep no more often than
// MaxTestSleeps, and no more than MaxUnexplainedSleeps of those without a
// reason. It lists the unexplained ones, to be explained or replaced.
func TestSleepCount(t *testing.T) {
	total, unexplained := 0, 0
	var where []string
	for _, f := range parseSource(t, "linux", true) {
		if top := strings.SplitN(filepath.ToSlash(f.pkg), "/", 2)[0]; top == "pvesim" || top == "e2e" {
			continue
		}
		commented := map[int]bool{} // lines with a comment, or just below one
		for _, g := range f.file.Comments {
			for line := f.fset.Position(g.Pos()).Line; line <= f.fset.Position(g.End()).Line+1; line++ {
				commented[line] = true
			}
		}
		ast.Inspect(f.file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || !isTimeSleep(call.Fun) {
				return true
			}
			total++
			if pos := f.fset.Position(call.Pos()); !commented[pos.Line] {
				unexplained++
				where = append(where, pos.String())
			}
			return true
		})
	}
	t.Logf("%d time.Sleep calls in tests, %d without a reason", total, unexplained)
	if total > MaxTestSleeps {
		t.Errorf("%d time.Sleep calls in tests, more than MaxTestSleeps (%d): wait for the event instead "+
			"(testkit.Eventually polls for a condition with a deadline)", total, MaxTestSleeps)
	}
	if unexplained > MaxUnexplainedSleeps {
		t.Errorf("%d time.Sleep calls in tests without a comment saying why, more than %d:\n%s",
			unexplained, MaxUnexplainedSleeps, strings.Join(where, "\n"))
	}
	if total < MaxTestSleeps || unexplained < MaxUnexplainedSleeps {
		t.Logf("lower the ceilings to %d and %d (sleep_test.go)", total, unexplained)
	}
}

func isTimeSleep(fun ast.Expr) bool {
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Sleep" {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "time"
}
