package pvesim

import (
	"os"
	"testing"

	"github.com/delegate-dev/delegate/local"
)

func TestMain(m *testing.M) {
	// Guests run in local sandboxes, whose helpers are this test binary.
	if local.Reexec() {
		return
	}
	os.Exit(m.Run())
}
