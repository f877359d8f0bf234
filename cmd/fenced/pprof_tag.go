//go:build pprof

package main

import (
	"net/http"
	_ "net/http/pprof" // profiling endpoints, only in binaries built with -tags pprof
	"os"
)

// In a binary built with -tags pprof, FENCED_PPROF_LISTEN (host:port) serves
// net/http/pprof: for profiling under a load harness. Release builds have
// neither the endpoint nor the variable.
func init() {
	if addr := os.Getenv("FENCED_PPROF_LISTEN"); addr != "" {
		go http.ListenAndServe(addr, nil)
	}
}
