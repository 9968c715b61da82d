package engine

import (
	"time"

	"golang.org/x/sys/unix"
)

// pauses remembers the times the server itself was not running, so that
// a job's silence is not counted against it for them: a SIGSTOP, a
// debugger, a VM paused or snapshotted, the host suspended. The heartbeat
// checker sees them as the gap since its own last tick, beyond its
// interval, on CLOCK_BOOTTIME: the monotonic clock (Go's timers and
// time.Since) counts through a stopped process but not through a host
// suspend, and the wall clock jumps when set. Only the checker's
// goroutine uses it.
type pauses struct {
	boot     func() time.Duration // CLOCK_BOOTTIME; tests set their own
	lastBoot time.Duration
	list     []pause // oldest first, at most maxPauses
}

// A pause is one time the server was not running: it ended at end (wall
// clock) and lasted d.
type pause struct {
	end time.Time
	d   time.Duration
}

// maxPauses bounds what is remembered: forgetting an old pause only makes
// the check stricter.
const maxPauses = 64

// bootTime reads bootClock (bootclock_*.go): a clock that counts while
// the host is suspended.
func bootTime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(bootClock, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// tick records the checker's tick at wall time now; interval is its
// period. It returns how long the server was away since the last tick
// (0 if it was not).
func (p *pauses) tick(now time.Time, interval time.Duration) time.Duration {
	if p.boot == nil {
		p.boot = bootTime
	}
	b := p.boot()
	last := p.lastBoot
	p.lastBoot = b
	if last == 0 || b == 0 {
		return 0
	}
	away := b - last - interval
	if away <= 0 {
		return 0
	}
	p.list = append(p.list, pause{end: now, d: away})
	if len(p.list) > maxPauses {
		p.list = p.list[len(p.list)-maxPauses:]
	}
	return away
}

// since is how much of the time after t the server was away.
func (p *pauses) since(t time.Time) time.Duration {
	var sum time.Duration
	for _, q := range p.list {
		if !q.end.After(t) {
			continue
		}
		sum += min(q.d, q.end.Sub(t))
	}
	return sum
}
