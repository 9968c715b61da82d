package local

import (
	"encoding/binary"

	"github.com/delegate-dev/delegate/sandbox"
)

// A job's stdout and stderr go to the shim through two pipes; the shim
// appends what it reads of either to fileOutput, in the order it reads
// it, and records in fileStreams which stream the bytes are from: a
// record of streamRecordSize bytes, little-endian offset<<2 | stream,
// says that the output from that offset on, up to the next record's, is
// of that stream. A record is written before the bytes it describes,
// and only when the stream changes, so a job writing to one stream only
// has one record; a reader that sees a byte sees its record. The order
// of the two streams is the order in which the shim read them, which it
// reads in the order they became ready (epoll): only when a stream is
// written to again before the shim has read the other stream's bytes
// written in between do that stream's two writes come together, before
// the other's.
const streamRecordSize = 8

// maxStreamRecords is how many stream records a shim writes at most for
// an output limit (max_stream_records in shim_linux.c): the last one
// says that the rest of the output is Combined, so that a job switching
// stream at every byte cannot make the records outgrow its output (or
// each read of them cost more than the output's).
func maxStreamRecords(limit int64) int64 { return max(limit/64, 256) }

// encodeStreamRecord is the record for output of stream s from offset on.
func encodeStreamRecord(offset int64, s sandbox.Stream) [streamRecordSize]byte {
	var b [streamRecordSize]byte
	binary.LittleEndian.PutUint64(b[:], uint64(offset)<<2|uint64(s&3))
	return b
}

func decodeStreamRecord(b []byte) (offset int64, s sandbox.Stream) {
	v := binary.LittleEndian.Uint64(b)
	return int64(v >> 2), sandbox.Stream(v & 3)
}
