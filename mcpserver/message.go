package mcpserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/jsonin"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Limits bound what delegate reads from MCP clients, on stdio and over
// HTTP alike.
type Limits struct {
	// MaxMessage is the largest JSON-RPC message read (0: MaxMessageBytes).
	// A larger one is answered with an error that names the limit.
	MaxMessage int64
	// InFlight bounds the bytes of the messages read and not yet answered,
	// all together (0: DefaultInFlightBytes): past it, reading waits, so
	// that memory stays bounded however many large requests arrive.
	InFlight int64
}

const (
	// MaxMessageBytes is room for a submit_job with the most files a
	// manifest may carry (delegate.MaxFileBytesTotal, 64 MiB, is 85.3 MiB
	// as base64) and the rest of it.
	MaxMessageBytes = 96 << 20
	// DefaultInFlightBytes lets one request of the largest size be read
	// and handled at a time, beside smaller ones. Handling a message costs
	// several times its size for a while (the SDK copies it as it parses
	// it: 85 MiB of files took about 800 MiB), so this bounds the server's
	// memory near a GiB, whatever the clients send.
	DefaultInFlightBytes = 128 << 20
)

func (l Limits) withDefaults() Limits {
	if l.MaxMessage <= 0 {
		l.MaxMessage = MaxMessageBytes
	}
	if l.InFlight <= 0 {
		l.InFlight = DefaultInFlightBytes
	}
	l.InFlight = max(l.InFlight, l.MaxMessage) // else the largest could never be read
	return l
}

func (l Limits) tooLarge(size string) *jsonrpc.Error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf(
		"request too large: %s, over delegate's limit of %d bytes (%d MiB; the files of a manifest may total %d MiB)",
		size, l.MaxMessage, l.MaxMessage>>20, delegate.MaxFileBytesTotal>>20)}
}

// wireMessage is a JSON-RPC 2.0 message as it may arrive: a request, a
// notification or a response.
type wireMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  *string         `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *jsonrpc.Error  `json:"error,omitempty"`
}

// decodeMessage reads one JSON-RPC message by jsonin.Decode's rules:
// a key given twice anywhere in it (a proxy and delegate could each take
// another one, and run different work) or invalid UTF-8 is an error, and
// so is a member JSON-RPC does not have. The message's params alias data.
// On error it returns the message's id as far as it can be found, and a
// JSON-RPC error to answer with.
func decodeMessage(dec *jsonin.Decoder, data []byte) (jsonrpc.Message, json.RawMessage, *jsonrpc.Error) {
	var w wireMessage
	if err := dec.Decode(data, &w, ""); err != nil {
		return nil, findID(data), messageError(err)
	}
	fail := func(format string, args ...any) (jsonrpc.Message, json.RawMessage, *jsonrpc.Error) {
		return nil, findID(data), &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "invalid request: " + fmt.Sprintf(format, args...)}
	}
	if w.JSONRPC != "2.0" {
		return fail(`jsonrpc: must be "2.0" (got %q)`, w.JSONRPC)
	}
	id, err := makeID(w.ID)
	if err != nil {
		return fail("id: %v", err)
	}
	if w.Method != nil {
		if w.Result != nil || w.Error != nil {
			return fail("a request has no result or error")
		}
		return &jsonrpc.Request{ID: id, Method: *w.Method, Params: w.Params}, nil, nil
	}
	if !id.IsValid() {
		return fail("method: required (a string)")
	}
	if (w.Result == nil) == (w.Error == nil) {
		return fail("a response has a result or an error")
	}
	resp := &jsonrpc.Response{ID: id, Result: w.Result}
	if w.Error != nil {
		resp.Error = w.Error
	}
	return resp, nil, nil
}

// makeID reads a request id: a string or a number (as the SDK reads it),
// or nothing.
func makeID(raw json.RawMessage) (jsonrpc.ID, error) {
	if len(raw) == 0 {
		return jsonrpc.MakeID(nil)
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return jsonrpc.ID{}, err
		}
		return jsonrpc.MakeID(s)
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return jsonrpc.ID{}, errors.New("must be a string or a number")
	}
	return jsonrpc.MakeID(f)
}

// errorResponse is a JSON-RPC error response whose id is given as the
// client wrote it (null when unknown), for messages the SDK never sees.
func errorResponse(id json.RawMessage, e *jsonrpc.Error) []byte {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	data, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *jsonrpc.Error  `json:"error"`
	}{"2.0", id, e})
	if err != nil { // an id that findID let through, but json does not
		data, _ = json.Marshal(struct {
			JSONRPC string         `json:"jsonrpc"`
			ID      any            `json:"id"`
			Error   *jsonrpc.Error `json:"error"`
		}{"2.0", nil, e})
	}
	return data
}

// findID returns the top-level "id" of a message that could not be
// decoded, so that its error response reaches the request that waits for
// it, or nil.
func findID(data []byte) json.RawMessage {
	var s idScanner
	s.write(data)
	return s.id()
}

// idScanner finds the top-level "id" member of a JSON object written to it
// in pieces, without keeping the rest: it reads the messages too large to
// keep, and those that are not valid JSON (on a best-effort basis).
type idScanner struct {
	depth    int
	inString bool
	escaped  bool
	// Within the top-level object: the key being read, whether the next
	// string is a key, and the value of "id" being read.
	expectKey bool
	key       []byte
	keyDone   bool
	inID      bool
	value     []byte
	found     json.RawMessage
	gaveUp    bool
}

const maxIDBytes = 256

func (s *idScanner) write(p []byte) {
	for _, c := range p {
		if s.gaveUp || s.found != nil {
			return
		}
		if s.inID {
			if s.depth == 1 && !s.inString && (c == ',' || c == '}') {
				s.found = json.RawMessage(strings.TrimSpace(string(s.value)))
				s.inID = false
			} else if len(s.value) < maxIDBytes {
				s.value = append(s.value, c)
			} else {
				s.gaveUp = true
				return
			}
		}
		if s.inString {
			switch {
			case s.escaped:
				s.escaped = false
			case c == '\\':
				s.escaped = true
			case c == '"':
				s.inString = false
				if s.depth == 1 && s.expectKey {
					s.keyDone, s.expectKey = true, false
				}
			default:
				if s.depth == 1 && s.expectKey && len(s.key) < 8 {
					s.key = append(s.key, c)
				}
			}
			if s.escaped && s.depth == 1 && s.expectKey {
				s.key = append(s.key, '\\') // an escaped key is never "id" here
			}
			continue
		}
		switch c {
		case '"':
			s.inString = true
		case '{', '[':
			s.depth++
			if s.depth == 1 {
				if c != '{' {
					s.gaveUp = true
					return
				}
				s.expectKey = true
			}
		case '}', ']':
			s.depth--
		case ',':
			if s.depth == 1 {
				s.expectKey, s.key, s.keyDone = true, s.key[:0], false
			}
		case ':':
			if s.depth == 1 && s.keyDone {
				if string(s.key) == "id" {
					s.inID, s.value = true, s.value[:0]
				}
				s.keyDone = false
			}
		}
	}
}

// id is the id found, if it is one a response may carry.
func (s *idScanner) id() json.RawMessage {
	if s.found == nil {
		return nil
	}
	if _, err := makeID(s.found); err != nil || jsonin.Check(s.found, "") != nil {
		return nil
	}
	return s.found
}
