// Command pinboard is the pinned control plane and data plane: the worker
// registry, and the reverse proxy that routes every /<namespace>/<id>/...
// request to the worker holding that instance, placing it on a miss. All the
// wiring is in internal/pinboard. `pinboard -h` lists every setting with
// its type, default and environment variable; docs/operations.md explains
// them.
package main

import (
	"os"

	"github.com/pinned-go/pinned/internal/pinboard"
)

func main() {
	os.Exit(pinboard.Main(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}
