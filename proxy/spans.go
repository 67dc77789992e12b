package proxy

// Per-request spans, for finding where a slow request's time went.
//
// A build with the tag pinned_spans (spans_on.go) stamps every request a
// loop serves at each hop, with the absolute CLOCK_MONOTONIC time, so that
// the stamps line up with those of a load generator on the same machine
// (loadgen -trace-out): the wake of the loop that read the request, the
// request read whole, routed, written to the worker, when the worker's host
// began and finished serving it (a host built with the same tag answers a
// Trace-Seq request with a Trace-Worker field: host/spans_on.go), the wake
// of the loop that read the worker's first answer bytes, those bytes read,
// and the answer written to the client. A request carries its
// number in a Trace-Seq field, passed on to the worker like any other
// field. Each loop keeps its records in memory and writes them, as CSV, to
// the directory named by PINNED_SPANS_OUT when it closes (the Front's
// shutdown). bench -trace-slow joins them with the generator's records and
// reports the requests above the p99 hop by hop (bench/README.md).
//
// Without the tag (spans_off.go) every stamp is an empty method the
// compiler removes: the proxy's code is the same as if they were absent.

// Span hops, in the order a request passes them.
const (
	hopWake      = iota // the loop woke with the request's last bytes readable
	hopRead             // the request was read whole and parsed
	hopRouted           // a route was found (cached, or resolved on a goroutine)
	hopSent             // the request was written to the worker
	hopWorkerIn         // the worker's host began serving it (its Trace-Worker field)
	hopWorkerOut        // the worker's host finished serving it
	hopAnsWake          // the loop woke with the worker's first answer bytes readable
	hopFirst            // the worker's first answer bytes were read
	hopDone             // the answer was written to the client
	nHops
)

// spanHopNames names the hops in the CSV header.
var spanHopNames = [nHops]string{"wake", "read", "routed", "sent", "workerin", "workerout", "answake", "first", "done"}

// traceSeqField is the request field that carries a request's number;
// traceWorkerField the response field with the worker's two stamps.
const (
	traceSeqField    = "Trace-Seq"
	traceWorkerField = "Trace-Worker"
)
