package loadgen

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// TestWriteHgrm: the .hgrm export has HdrHistogram's layout and the
// report's numbers: every percentile line parses, percentiles and counts
// rise to 1 and the total, values are the latencies in milliseconds, and
// the footer matches the Go library's own (which prints a non-standard
// header).
func TestWriteHgrm(t *testing.T) {
	rep := sampleReport(t, "direct")
	var buf bytes.Buffer
	if err := rep.WriteHgrm(&buf); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if lines[0] != "       Value     Percentile TotalCount 1/(1-Percentile)" || lines[1] != "" {
		t.Fatalf("header %q %q", lines[0], lines[1])
	}
	var prevQ float64
	var prevCount int64
	rows := 0
	for _, l := range lines[2 : len(lines)-3] {
		f := strings.Fields(l)
		v, err1 := strconv.ParseFloat(f[0], 64)
		q, err2 := strconv.ParseFloat(f[1], 64)
		n, err3 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || q < prevQ || n < prevCount || v < 0 {
			t.Fatalf("bad line %q after q %v count %d", l, prevQ, prevCount)
		}
		prevQ, prevCount = q, n
		rows++
	}
	if prevQ != 1 || prevCount != rep.Latency.Count || rows < 20 {
		t.Errorf("%d rows ending at percentile %v count %d; want many, ending at 1 and %d", rows, prevQ, prevCount, rep.Latency.Count)
	}
	last := strings.Fields(lines[len(lines)-4])
	if want := strconv.FormatFloat(float64(rep.Latency.Max)/1000, 'f', 3, 64); last[0] != want {
		t.Errorf("last value %s ms; want the max %s ms", last[0], want)
	}
	var lib bytes.Buffer
	h := mustDecode(t, rep.Histogram)
	if _, err := h.PercentilesPrint(&lib, 5, 1000); err != nil {
		t.Fatal(err)
	}
	libLines := strings.Split(strings.TrimRight(lib.String(), "\n"), "\n")
	for i := 1; i <= 3; i++ {
		if got, want := lines[len(lines)-i], libLines[len(libLines)-i]; got != want {
			t.Errorf("footer line %q; the library prints %q", got, want)
		}
	}
}

func mustDecode(t *testing.T, enc string) *hdrhistogram.Histogram {
	t.Helper()
	h, err := hdrhistogram.Decode([]byte(enc))
	if err != nil {
		t.Fatalf("decode histogram: %v", err)
	}
	return h
}
