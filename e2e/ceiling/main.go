// Command ceiling serves a trivial HTTP handler, the harness's ceiling in
// docs/BENCHMARKS.md: how many callbacks a second the load generator can
// send on this machine at all, to read delegate's callback figures against.
//
//	go run ./e2e/ceiling 127.0.0.1:9000
package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
)

func main() {
	addr := "127.0.0.1:9000"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	// What a callback's answer costs the client to read, and no work.
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"ok":true}`)
	})
	log.Fatal(http.ListenAndServe(addr, nil))
}
