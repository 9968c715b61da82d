package egress

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"testing"
)

// realHello is the ClientHello crypto/tls sends for conf.
func realHello(t testing.TB, conf *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		tls.Client(b, conf).Handshake()
		b.Close()
	}()
	raw, _, err := readClientHello(a)
	if err != nil {
		t.Fatalf("reading crypto/tls's ClientHello: %v", err)
	}
	return raw
}

// buildHello makes a ClientHello record with these extensions, split
// into records of at most split bytes.
func buildHello(exts [][]byte, split int) []byte {
	var body bytes.Buffer
	body.Write([]byte{3, 3})
	body.Write(make([]byte, 32))
	body.WriteByte(0)                 // session id
	body.Write([]byte{0, 2, 0x13, 1}) // one cipher suite
	body.Write([]byte{1, 0})          // null compression
	var ext bytes.Buffer
	for _, e := range exts {
		ext.Write(e)
	}
	binary.Write(&body, binary.BigEndian, uint16(ext.Len()))
	body.Write(ext.Bytes())
	hs := append([]byte{typeClientHello, 0, byte(body.Len() >> 8), byte(body.Len())}, body.Bytes()...)
	var out []byte
	for len(hs) > 0 {
		n := min(split, len(hs))
		out = append(out, recordHandshake, 3, 1, byte(n>>8), byte(n))
		out = append(out, hs[:n]...)
		hs = hs[n:]
	}
	return out
}

func ext(typ uint16, data []byte) []byte {
	return append([]byte{byte(typ >> 8), byte(typ), byte(len(data) >> 8), byte(len(data))}, data...)
}

func sniExt(name string) []byte {
	entry := append([]byte{0, byte(len(name) >> 8), byte(len(name))}, name...)
	return ext(extServerName, append([]byte{byte(len(entry) >> 8), byte(len(entry))}, entry...))
}

func TestReadClientHello(t *testing.T) {
	tests := []struct {
		name    string
		raw     []byte
		sni     string
		ech     bool
		wantErr bool
	}{
		{name: "crypto/tls with SNI", raw: realHello(t, &tls.Config{ServerName: "allowed.test"}), sni: "allowed.test"},
		{name: "crypto/tls without SNI", raw: realHello(t, &tls.Config{InsecureSkipVerify: true})},
		{name: "SNI", raw: buildHello([][]byte{sniExt("a.test")}, 1<<14), sni: "a.test"},
		{name: "split across records", raw: buildHello([][]byte{ext(0x1234, make([]byte, 300)), sniExt("split.test")}, 7), sni: "split.test"},
		{name: "ECH", raw: buildHello([][]byte{sniExt("cover.test"), ext(extECH, []byte{0, 1, 2})}, 1<<14), sni: "cover.test", ech: true},
		{name: "ESNI", raw: buildHello([][]byte{ext(extESNI, []byte{1})}, 1<<14), ech: true},
		{name: "no extensions", raw: buildHello(nil, 1<<14)},
		{name: "extension twice", raw: buildHello([][]byte{sniExt("a.test"), sniExt("b.test")}, 1<<14), wantErr: true},
		{name: "truncated extension", raw: buildHello([][]byte{{0, 0, 0, 9, 0}}, 1<<14), wantErr: true},
		{name: "not TLS", raw: []byte("GET / HTTP/1.1\r\n\r\n"), wantErr: true},
		{name: "an alert record", raw: tlsAlert(alertAccessDenied), wantErr: true},
	}
	for _, tt := range tests {
		raw, h, err := readClientHello(bytes.NewReader(tt.raw))
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: err = %v", tt.name, err)
			continue
		}
		if tt.wantErr {
			continue
		}
		if h.serverName != tt.sni || h.ech != tt.ech {
			t.Errorf("%s: got %+v, want sni %q ech %v", tt.name, h, tt.sni, tt.ech)
		}
		if !bytes.Equal(raw, tt.raw) {
			t.Errorf("%s: the bytes to replay differ from those read", tt.name)
		}
	}
}

// The hello is read exactly: what follows stays in the connection.
func TestReadClientHelloReadsNoFurther(t *testing.T) {
	hello := buildHello([][]byte{sniExt("a.test")}, 1<<14)
	r := bytes.NewReader(append(hello, "rest"...))
	if _, _, err := readClientHello(r); err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "rest" {
		t.Errorf("left %q", rest)
	}
}

func FuzzReadClientHello(f *testing.F) {
	f.Add(buildHello([][]byte{sniExt("a.test"), ext(extECH, nil)}, 5))
	f.Add(realHello(f, &tls.Config{ServerName: "allowed.test"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		raw, _, _ := readClientHello(bytes.NewReader(b))
		if len(raw) > len(b) || !bytes.Equal(raw, b[:len(raw)]) {
			t.Fatal("the bytes to replay are not those read")
		}
	})
}
