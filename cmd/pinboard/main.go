// Command pinboard is the pinned control plane and data plane: the worker
// registry, and the reverse proxy that routes every /<namespace>/<id>/...
// request to the worker holding that instance, placing it on a miss. All the
// wiring is in internal/pinboard; see the README's Operations section for
// its configuration.
package main

import (
	"os"

	"github.com/pinned-go/pinned/internal/pinboard"
)

func main() {
	os.Exit(pinboard.Main(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
