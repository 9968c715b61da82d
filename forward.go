package delegate

import (
	"context"
	"io"
)

// Several servers sharing one store (issue 37): a command for a local kept
// sandbox runs on the server that holds it, since only a server on its
// host reaches it. A server asked for one that another host's server
// holds forwards it there: it POSTs the request, signed with a secret
// every server reads from the store, to ForwardPath at the address the
// holder recorded in its lease, and gets a ForwardAnswer.

// ForwardPath is where a server takes the commands other servers forward.
const ForwardPath = "/forward/submit"

// ForwardSignatureHeader carries a forwarded request's signature (the
// hex HMAC-SHA256 of its body, keyed by the store's secret).
const ForwardSignatureHeader = "Delegate-Forward-Signature"

// ForwardKeyHeader proves the sender knows the store's secret before its
// body is read: "SECONDS.MAC", the time it was made (Unix seconds, the
// store's clock; good for a minute) and the hex HMAC-SHA256, keyed by the
// secret, of "to ", the holder's server id, " at " and SECONDS.
const ForwardKeyHeader = "Delegate-Forward-Key"

// ForwardService takes the commands another server of the store forwards
// to this one.
type ForwardService interface {
	// AcceptForward checks a forwarded request (its key before it reads
	// body, then its signature, that it is meant for this server, that it
	// is fresh and not seen before) and submits its command as the
	// principal of the original request, whose scopes and rights it
	// checks as for its own clients.
	AcceptForward(ctx context.Context, key, signature string, body io.Reader) (*Job, error)
}

// ForwardAnswer is the holding server's answer: the job it stored, or
// why it refused (the error's kind, by name, and its words).
type ForwardAnswer struct {
	JobID string `json:"job_id,omitempty"`
	Kind  string `json:"kind,omitempty"`
	Error string `json:"error,omitempty"`
}
