package httpapi

import "time"

// SetClock sets the clock the limiter reads when a session is used: a test
// orders sessions' uses by it without waiting for the real one to tick.
func (l *SessionLimiter) SetClock(now func() time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.now = now
}
