package bench

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/delegate-dev/delegate/local"
)

func TestMain(m *testing.M) {
	if local.Reexec() {
		return
	}
	os.Exit(m.Run())
}

// TestProxmoxBench runs the Proxmox benchmark once, fast (timings / 50):
// it prints every row, and a warm job makes fewer API calls than a cold
// one (it clones, configures and boots nothing). Its times are figures,
// not checked here.
func TestProxmoxBench(t *testing.T) {
	var out bytes.Buffer
	if err := Proxmox(context.Background(), 1, 50, &out, nil); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	for _, task := range []string{"echo hello", "sleep 1"} {
		for _, row := range []string{"submit -> running", "submit -> done"} {
			if !regexp.MustCompile(regexp.QuoteMeta(task+": "+row) + `\s+\d+\.\d\ds\s+\d+\.\d\ds`).Match(out.Bytes()) {
				t.Errorf("no %q row", task+": "+row)
			}
		}
		m := regexp.MustCompile(regexp.QuoteMeta(task+": API calls per job") + `\s+(\d+) \(\d+-\d+\)\s+(\d+) \(`).FindSubmatch(out.Bytes())
		if m == nil {
			t.Errorf("no %q API calls row", task)
			continue
		}
		cold, _ := strconv.Atoi(string(m[1]))
		warm, _ := strconv.Atoi(string(m[2]))
		if warm == 0 || warm >= cold {
			t.Errorf("%s: %d API calls warm, %d cold", task, warm, cold)
		}
	}
	if !regexp.MustCompile(`warm pool upkeep: \d+ API calls for \d+ VMs made`).Match(out.Bytes()) {
		t.Error("no pool upkeep line")
	}
	// A command in a kept VM (running, or suspended and resumed by it)
	// makes calls about that VM only, and some.
	for _, row := range []string{"echo hello in a kept VM", "echo hello in a suspended kept VM"} {
		m := regexp.MustCompile(regexp.QuoteMeta(row) + `\s+submit -> done \d+\.\d\ds\s+API calls (\d+) \(`).FindSubmatch(out.Bytes())
		if m == nil {
			t.Errorf("no %q row", row)
		} else if n, _ := strconv.Atoi(string(m[1])); n == 0 {
			t.Errorf("%s: no API calls", row)
		}
	}
	// The per-node bound holds while the pool refills beside the jobs.
	m := regexp.MustCompile(`peak concurrent calls to pve1\s+(\d+)\s+(\d+)`).FindSubmatch(out.Bytes())
	if m == nil {
		t.Fatal("no peak concurrent calls row")
	}
	for _, peak := range m[1:] {
		if n, _ := strconv.Atoi(string(peak)); n < 1 || n > 2 {
			t.Errorf("peak concurrent calls to pve1: %s, the bound is 2", peak)
		}
	}
}
