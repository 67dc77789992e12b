package loadgen

import (
	"bufio"
	"fmt"
	"os"
	"slices"
)

// traceSeqField is the request field that carries a request's number
// (Config.TraceFile).
const traceSeqField = "Trace-Seq"

// maxTraceRecords bounds one loop's trace records (48 bytes each): a
// traced run keeps the first this many measured requests of each loop.
const maxTraceRecords = 1 << 22

// traceRecord is one measured request of a traced run.
type traceRecord struct {
	seq    int64
	status int
	// due (the schedule's intended time; the send in the closed loop),
	// sent, received by the kernel (0: unknown), done; absolute
	// CLOCK_MONOTONIC ns.
	t [4]int64
}

// writeTrace writes the records of every loop to path as CSV, by number.
func writeTrace(path string, loops [][]traceRecord) error {
	var all []traceRecord
	for _, l := range loops {
		all = append(all, l...)
	}
	slices.SortFunc(all, func(a, b traceRecord) int { return int(a.seq - b.seq) })
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("loadgen: trace: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "seq,status,due,sent,rx,done")
	for _, r := range all {
		fmt.Fprintf(w, "%d,%d,%d,%d,%d,%d\n", r.seq, r.status, r.t[0], r.t[1], r.t[2], r.t[3])
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("loadgen: trace: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("loadgen: trace: %w", err)
	}
	return nil
}
