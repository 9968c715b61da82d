package sandboxtest_test

import (
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// TestFake: the fake keeps the contract where it can (it runs no
// command).
func TestFake(t *testing.T) {
	sandboxtest.Run(t, sandboxtest.Harness{New: func(t *testing.T) sandbox.Backend { return sandboxtest.NewFake() }})
}
