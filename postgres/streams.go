package postgres

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/delegate-dev/delegate"
)

// A row of job_output is one append of output, in the SQLite store's
// format (sqlite/streams.go), so that `delegate store migrate` copies rows
// as they are: its bytes in the order written, and the stream they are
// from (column stream). A row whose bytes are from both streams has
// stream streamBoth, and runs says which are which: one uvarint per run of
// one stream, length<<2 | stream, in order; the lengths add up to the
// row's.
const streamBoth = 3

// encodeChunk makes a row of a chunk: its bytes, their stream, the runs
// (nil unless streamBoth) and how many bytes are stderr.
func encodeChunk(chunk []delegate.Output) (data []byte, stream int, runs []byte, stderr int64) {
	n, first, mixed := 0, -1, false
	for _, o := range chunk {
		if len(o.Data) == 0 {
			continue
		}
		n += len(o.Data)
		if first < 0 {
			first = int(o.Stream)
		} else if int(o.Stream) != first {
			mixed = true
		}
		if o.Stream == delegate.StreamStderr {
			stderr += int64(len(o.Data))
		}
	}
	if n == 0 {
		return nil, 0, nil, 0
	}
	if !mixed {
		for _, o := range chunk {
			if len(o.Data) == n { // one piece: no copy
				return o.Data, first, nil, stderr
			}
		}
	}
	data = make([]byte, 0, n)
	for _, o := range chunk {
		data = append(data, o.Data...)
	}
	if !mixed {
		return data, first, nil, stderr
	}
	var cur delegate.Stream
	var length uint64
	flush := func() {
		if length > 0 {
			runs = binary.AppendUvarint(runs, length<<2|uint64(cur))
		}
	}
	for _, o := range chunk {
		if len(o.Data) == 0 {
			continue
		}
		if o.Stream != cur || length == 0 {
			flush()
			cur, length = o.Stream, 0
		}
		length += uint64(len(o.Data))
	}
	flush()
	return data, streamBoth, runs, stderr
}

// decodeChunk cuts a row back into its pieces.
func decodeChunk(data []byte, stream int, runs []byte) ([]delegate.Output, error) {
	if len(data) == 0 {
		return nil, nil
	}
	if stream != streamBoth {
		if stream < 0 || stream > int(delegate.StreamStderr) {
			return nil, fmt.Errorf("output of unknown stream %d", stream)
		}
		return []delegate.Output{{Stream: delegate.Stream(stream), Data: data}}, nil
	}
	var out []delegate.Output
	for len(runs) > 0 {
		v, k := binary.Uvarint(runs)
		if k <= 0 {
			return nil, errors.New("output runs: bad encoding")
		}
		runs = runs[k:]
		n, s := v>>2, delegate.Stream(v&3)
		if n > uint64(len(data)) || s > delegate.StreamStderr {
			return nil, errors.New("output runs: longer than the output")
		}
		out = append(out, delegate.Output{Stream: s, Data: data[:n:n]})
		data = data[n:]
	}
	if len(data) > 0 {
		return nil, errors.New("output runs: shorter than the output")
	}
	return out, nil
}
