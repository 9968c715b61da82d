package delegate

import "context"

// Stream says where a piece of a job's output came from.
type Stream uint8

const (
	// StreamCombined is stdout and stderr together, not told apart:
	// output kept before delegate kept the two streams apart.
	StreamCombined Stream = iota
	StreamStdout
	StreamStderr
)

func (s Stream) String() string {
	switch s {
	case StreamStdout:
		return "stdout"
	case StreamStderr:
		return "stderr"
	}
	return "combined"
}

// Output is a piece of a job's output from one stream. A job's output is
// a sequence of them in the order they were written: stdout and stderr
// interleaved.
type Output struct {
	Stream Stream
	Data   []byte
}

// JoinOutput returns the bytes of outs one after the other: the output
// as one interleaved stream.
func JoinOutput(outs []Output) []byte {
	n := 0
	for _, o := range outs {
		n += len(o.Data)
	}
	if n == 0 {
		return nil
	}
	b := make([]byte, 0, n)
	for _, o := range outs {
		b = append(b, o.Data...)
	}
	return b
}

// AppendOutput adds data from stream s after outs, to the last piece when
// it is of the same stream. A piece it starts holds data itself (its
// capacity clipped, so that adding to it later copies rather than writes
// over what follows data in its array).
func AppendOutput(outs []Output, s Stream, data []byte) []Output {
	if len(data) == 0 {
		return outs
	}
	if n := len(outs); n > 0 && outs[n-1].Stream == s {
		outs[n-1].Data = append(outs[n-1].Data, data...)
		return outs
	}
	return append(outs, Output{Stream: s, Data: data[:len(data):len(data)]})
}

// OutputStore keeps what jobs write, both streams in the order written.
type OutputStore interface {
	// AppendOutput stores a chunk of output (its pieces in the order
	// written, each of one stream) at the end of what is kept, and records
	// in the same transaction that the backend's output was consumed up to
	// read (Job.OutputRead).
	AppendOutput(ctx context.Context, id string, chunk []Output, read int64) error
	// ReadOutput returns up to max kept bytes from offset (offsets count
	// both streams together), as pieces in the order written.
	ReadOutput(ctx context.Context, id string, offset int64, max int) ([]Output, error)
	// OutputSize is how many bytes of output are kept.
	OutputSize(ctx context.Context, id string) (int64, error)
	// StreamTail returns the last max bytes kept of one stream, and how
	// many bytes of that stream are kept in all. StreamStdout includes
	// output kept before the streams were told apart (StreamCombined).
	StreamTail(ctx context.Context, id string, s Stream, max int) (tail []byte, kept int64, err error)
}
