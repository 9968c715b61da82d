package main

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
)

// TestAppCloseReportsEachFailure: Close closes every part, the last
// opened first, and reports each that failed, by name, instead of
// dropping them.
func TestAppCloseReportsEachFailure(t *testing.T) {
	var order []string
	errB, errC := errors.New("b broke"), errors.New("c broke")
	part := func(name string, err error) func() error {
		return func() error { order = append(order, name); return err }
	}
	a := &app{}
	a.opened("a", part("a", nil))
	a.opened("b", part("b", errB))
	a.opened("c", part("c", errC))
	err := a.Close()
	if strings.Join(order, ",") != "c,b,a" {
		t.Errorf("closed %v, want c, b, a", order)
	}
	if !errors.Is(err, errB) || !errors.Is(err, errC) || !strings.Contains(err.Error(), "closing b: b broke") ||
		!strings.Contains(err.Error(), "closing c: c broke") {
		t.Errorf("Close: %v", err)
	}
	if err := a.Close(); err != nil || len(order) != 3 {
		t.Errorf("a second Close: %v, closed %v", err, order)
	}
}

// TestOpenAppReadOnly: an app that runs no jobs opens the store and the
// engine only, and closes them without error.
func TestOpenAppReadOnly(t *testing.T) {
	env := map[string]string{"DELEGATE_DATA_DIR": t.TempDir()}
	cfg, err := cli.LoadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	a, err := openApp(context.Background(), cfg, slog.New(slog.DiscardHandler), appOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.backend != nil || a.pool != nil || a.eng == nil {
		t.Errorf("opened backend %v, pool %v, engine %v", a.backend, a.pool, a.eng)
	}
	if _, err := a.eng.List(context.Background(), delegate.ListOptions{}); err != nil {
		t.Errorf("list: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestOneShotGC: a CLI command's process collects only at oneShotHeap
// (the collector off below it), unless GOGC or GOMEMLIMIT say otherwise.
func TestOneShotGC(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for _, tc := range []struct {
		env     map[string]string
		percent int
		limit   int64
		what    string
	}{
		{map[string]string{}, -1, oneShotHeap, "nothing set"},
		{map[string]string{"GOGC": "50"}, 100, math.MaxInt64, "GOGC set"},
		{map[string]string{"GOMEMLIMIT": "1GiB"}, 100, math.MaxInt64, "GOMEMLIMIT set"},
	} {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
		oneShotGC(func(k string) string { return tc.env[k] })
		if p, l := debug.SetGCPercent(100), debug.SetMemoryLimit(-1); p != tc.percent || l != tc.limit {
			t.Errorf("%s: GC percent %d, memory limit %d; want %d, %d", tc.what, p, l, tc.percent, tc.limit)
		}
	}
}
