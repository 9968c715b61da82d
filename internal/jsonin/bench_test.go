package jsonin_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/jsonin"
)

// typicalManifest is what an agent sends most: a script, two small files,
// a few settings.
const typicalManifest = `{"agentType":"script","task":"cd /workspace && python3 -m pytest -q tests/","files":[` +
	`{"path":"calc.py","content":"ZGVmIGFkZChhLCBiKToKICAgIHJldHVybiBhICsgYgo="},` +
	`{"path":"tests/test_calc.py","content":"ZnJvbSBjYWxjIGltcG9ydCBhZGQKCmRlZiB0ZXN0X2FkZCgpOgogICAgYXNzZXJ0IGFkZCgxLCAyKSA9PSAzCg==","mode":"0644"}],` +
	`"env":{"PYTHONDONTWRITEBYTECODE":"1","CI":"true"},"resources":{"cpu":1,"memory":"512M"},"timeout":300,"statusMode":"detailed","artifacts":["report.xml"]}`

// largeManifest carries the most files a manifest may: 64 MiB in 64 files.
func largeManifest() []byte {
	var b strings.Builder
	b.WriteString(`{"agentType":"script","task":"sha256sum *","files":[`)
	chunk := base64.StdEncoding.EncodeToString(make([]byte, delegate.MaxFileBytesTotal/64))
	for i := range 64 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"path":"f%d","content":"%s"}`, i, chunk)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkDecodeManifest: decode time and allocations of a typical
// manifest and of one carrying 64 MiB of files (docs/BENCHMARKS.md, "The
// input layer").
//
//	go test -run '^$' -bench DecodeManifest -benchmem ./internal/jsonin/
func BenchmarkDecodeManifest(b *testing.B) {
	for _, in := range []struct {
		name string
		data []byte
	}{{"typical", []byte(typicalManifest)}, {"64MiB", largeManifest()}} {
		b.Run(in.name, func(b *testing.B) {
			b.SetBytes(int64(len(in.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := jsonin.DecodeManifest(in.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeMessage: a JSON-RPC request as every MCP call brings it,
// decoded by the rules of mcpserver's reader (params kept as raw bytes).
func BenchmarkDecodeMessage(b *testing.B) {
	type wire struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id,omitempty"`
		Method  *string         `json:"method,omitempty"`
		Params  json.RawMessage `json:"params,omitempty"`
		Result  json.RawMessage `json:"result,omitempty"`
		Error   json.RawMessage `json:"error,omitempty"`
	}
	data := []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"get_job_status","arguments":{"job_id":"j-7k2m9q4x8w3n"},"_meta":{"progressToken":7}}}`)
	var dec jsonin.Decoder
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		var w wire
		if err := dec.Decode(data, &w, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeSubmit: submit_job's arguments, as the hot-path
// benchmark (mcpserver BenchmarkRawCall) sends them.
func BenchmarkDecodeSubmit(b *testing.B) {
	type args struct {
		Manifest       delegate.Manifest `json:"manifest"`
		IdempotencyKey string            `json:"idempotency_key,omitempty"`
	}
	data := []byte(`{"manifest":{"task":"bench task","agentType":"script","agent":{"command":"sleep 86400"},"timeout":86400}}`)
	var dec jsonin.Decoder
	b.ReportAllocs()
	for b.Loop() {
		var a args
		if err := dec.Decode(data, &a, ""); err != nil {
			b.Fatal(err)
		}
	}
}
