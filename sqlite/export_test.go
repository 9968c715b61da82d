package sqlite

// Helpers of the internal tests that the external ones use too.
var (
	Tagged = tagged
	Pieces = pieces
)
