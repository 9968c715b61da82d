package proxmox

import "context"

// RefillInForeground makes the warm pools kept from now on refill with
// foreground calls, as before pve.Background (BenchmarkForkSim's
// baseline), until restore is called.
func RefillInForeground() (restore func()) {
	prev := poolCalls
	poolCalls = func(ctx context.Context) context.Context { return ctx }
	return func() { poolCalls = prev }
}
