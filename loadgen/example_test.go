package loadgen_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/pinned-go/pinned/loadgen"
)

// A load test from Go: half a second at 1000 requests per second against
// an HTTP server, then the report as a table, and its numbers for the
// program itself.
func Example() {
	// The target: any HTTP server (here one in this process).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"count":1}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	r, err := loadgen.New(loadgen.Config{
		URL:      "http://" + ln.Addr().String(),
		Path:     "/counter/{id}/", // {id}: drawn from 1000 ids, uniformly
		Rate:     1000,             // open loop: latency counts from each request's intended send time
		Duration: 500 * time.Millisecond,
		Requests: loadgen.Unbounded,
		Label:    "example",
	})
	if err != nil {
		log.Fatal(err)
	}
	rep, err := r.Run(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	// rep.WriteText(os.Stdout) prints the table; WriteJSON, WriteHgrm and
	// WritePlotHTML write the other reports.

	fmt.Println("sent", rep.Requests.Sent, "failed", rep.Errors.Total, "statuses", rep.Statuses)
	fmt.Println("p99 measured:", rep.Latency.P99 > 0, "- schedule lag reported:", rep.ScheduleLag != nil)
	// Output:
	// sent 500 failed 0 statuses map[200:500]
	// p99 measured: true - schedule lag reported: true
}
