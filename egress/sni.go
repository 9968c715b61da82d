package egress

import (
	"errors"
	"fmt"
	"io"
)

// The transparent listener names a TLS connection by the server name the
// client puts in its ClientHello (SNI), read without decrypting anything:
// the records are parsed here and then replayed to the upstream server
// byte for byte. (RFC 8446 4.1.2 for the ClientHello, RFC 6066 3 for
// server_name, draft-ietf-tls-esni for encrypted_client_hello.)

const (
	recordHandshake   = 22
	typeClientHello   = 1
	extServerName     = 0x0000
	extECH            = 0xfe0d // encrypted_client_hello
	extESNI           = 0xffce // its predecessor, encrypted_server_name
	maxHelloBytes     = 64 << 10
	recordHeaderBytes = 5
)

// clientHello is what the proxy needs of a ClientHello.
type clientHello struct {
	serverName string // "" when the client sent none
	ech        bool   // the real name is encrypted: the visible one is a cover
}

var errNotTLS = errors.New("not a TLS handshake")

// readClientHello reads the records that carry the ClientHello and returns
// them whole, with what they say.
func readClientHello(r io.Reader) ([]byte, clientHello, error) {
	var raw, hs []byte
	for {
		var hdr [recordHeaderBytes]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return raw, clientHello{}, fmt.Errorf("reading a TLS record: %w", err)
		}
		raw = append(raw, hdr[:]...)
		if hdr[0] != recordHandshake || hdr[1] != 3 {
			return raw, clientHello{}, errNotTLS
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > 1<<14 || len(raw)+n > maxHelloBytes {
			return raw, clientHello{}, fmt.Errorf("a TLS record of %d bytes", n)
		}
		start := len(raw)
		raw = append(raw, make([]byte, n)...)
		if got, err := io.ReadFull(r, raw[start:]); err != nil {
			return raw[:start+got], clientHello{}, fmt.Errorf("reading a TLS record: %w", err)
		}
		hs = append(hs, raw[start:]...)
		if len(hs) < 4 {
			continue
		}
		if hs[0] != typeClientHello {
			return raw, clientHello{}, errNotTLS
		}
		want := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
		if want > maxHelloBytes {
			return raw, clientHello{}, fmt.Errorf("a ClientHello of %d bytes", want)
		}
		if len(hs) >= want {
			h, err := parseClientHello(hs[4:want])
			return raw, h, err
		}
	}
}

// reader walks a byte string, remembering the first overrun.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) bytes(n int) []byte {
	if r.bad || n > len(r.b) {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() int {
	b := r.bytes(1)
	if b == nil {
		return 0
	}
	return int(b[0])
}

func (r *reader) u16() int {
	b := r.bytes(2)
	if b == nil {
		return 0
	}
	return int(b[0])<<8 | int(b[1])
}

// vec reads a vector with a length prefix of 1 or 2 bytes.
func (r *reader) vec(prefix int) *reader {
	var n int
	if prefix == 1 {
		n = r.u8()
	} else {
		n = r.u16()
	}
	return &reader{b: r.bytes(n), bad: r.bad}
}

func parseClientHello(body []byte) (clientHello, error) {
	var h clientHello
	r := &reader{b: body}
	r.bytes(2 + 32) // legacy_version, random
	r.vec(1)        // legacy_session_id
	r.vec(2)        // cipher_suites
	r.vec(1)        // legacy_compression_methods
	if r.bad {
		return h, errors.New("a truncated ClientHello")
	}
	if len(r.b) == 0 {
		return h, nil // no extensions, so no SNI
	}
	exts := r.vec(2)
	seen := map[int]bool{}
	for len(exts.b) > 0 && !exts.bad {
		typ := exts.u16()
		data := exts.vec(2)
		if exts.bad {
			break
		}
		if seen[typ] {
			return h, fmt.Errorf("extension %#04x twice in a ClientHello", typ)
		}
		seen[typ] = true
		switch typ {
		case extECH, extESNI:
			h.ech = true
		case extServerName:
			list := data.vec(2)
			for len(list.b) > 0 && !list.bad {
				kind := list.u8()
				name := list.vec(2)
				if kind == 0 && !list.bad && !name.bad {
					if h.serverName != "" {
						return h, errors.New("two host names in server_name")
					}
					h.serverName = string(name.b)
				}
			}
			if list.bad || data.bad {
				return h, errors.New("a malformed server_name extension")
			}
		}
	}
	if exts.bad || r.bad {
		return h, errors.New("malformed ClientHello extensions")
	}
	return h, nil
}

// tlsAlert is a plaintext fatal alert, for refusing a handshake in a
// way clients report plainly ("tlsv1 alert access denied").
func tlsAlert(desc byte) []byte {
	return []byte{21, 3, 3, 0, 2, 2, desc}
}

const (
	alertAccessDenied    = 49
	alertUnrecognizedSNI = 112
)
