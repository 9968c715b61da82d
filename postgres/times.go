package postgres

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// ts is a time as a timestamptz column holds it: microseconds since the
// Unix epoch, 0 for none (NULL). Comparable with ==, so that UpdateJob
// finds the columns fn changed as the database would see them.
type ts int64

func toTS(t time.Time) ts {
	if t.IsZero() {
		return 0
	}
	return ts(t.UnixMicro())
}

func (v ts) time() time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMicro(int64(v)).UTC()
}

// TimestamptzValue writes a ts (pgtype.TimestamptzValuer).
func (v ts) TimestamptzValue() (pgtype.Timestamptz, error) {
	if v == 0 {
		return pgtype.Timestamptz{}, nil
	}
	return pgtype.Timestamptz{Time: v.time(), Valid: true}, nil
}

// ScanTimestamptz reads a ts (pgtype.TimestamptzScanner).
func (v *ts) ScanTimestamptz(t pgtype.Timestamptz) error {
	*v = 0
	if t.Valid {
		*v = toTS(t.Time)
	}
	return nil
}
