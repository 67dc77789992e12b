package loadgen

import (
	"bufio"
	"fmt"
	"io"
	"math"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// WriteHgrm writes the latency histogram in HdrHistogram's percentile
// distribution text format (the .hgrm files of wrk2 and HdrHistogram's
// tools, which its online plotter reads): values in milliseconds, 5 ticks
// per half distance, and the mean, max, count and bucket footer.
func (rep *Report) WriteHgrm(w io.Writer) error {
	h, err := hdrhistogram.Decode([]byte(rep.Histogram))
	if err != nil {
		return fmt.Errorf("loadgen: the report's histogram: %w", err)
	}
	return writeHgrm(w, h, 1000)
}

// writeHgrm writes h, whose values are scaled down by scale for printing,
// as HdrHistogram's Java implementation lays it out.
func writeHgrm(w io.Writer, h *hdrhistogram.Histogram, scale float64) error {
	b := bufio.NewWriter(w)
	fmt.Fprintf(b, "%12s %14s %10s %14s\n\n", "Value", "Percentile", "TotalCount", "1/(1-Percentile)")
	if h.TotalCount() > 0 {
		for _, br := range h.CumulativeDistributionWithTicks(5) {
			q := br.Quantile / 100
			if q < 1 {
				fmt.Fprintf(b, "%12.3f %2.12f %10d %14.2f\n", float64(br.ValueAt)/scale, q, br.Count, 1/(1-q))
			} else {
				fmt.Fprintf(b, "%12.3f %2.12f %10d\n", float64(br.ValueAt)/scale, q, br.Count)
			}
		}
	}
	mean, sd := h.Mean()/scale, h.StdDev()/scale
	if math.IsNaN(mean) {
		mean, sd = 0, 0
	}
	buckets, sub := hdrShape(h)
	fmt.Fprintf(b, "#[Mean    = %12.3f, StdDeviation   = %12.3f]\n", mean, sd)
	fmt.Fprintf(b, "#[Max     = %12.3f, Total count    = %12d]\n", float64(h.Max())/scale, h.TotalCount())
	fmt.Fprintf(b, "#[Buckets = %12d, SubBuckets     = %12d]\n", buckets, sub)
	return b.Flush()
}

// hdrShape returns the bucket and sub-bucket counts of h's layout, as
// HdrHistogram computes them from its range and precision (the Go library
// keeps them private).
func hdrShape(h *hdrhistogram.Histogram) (buckets, subBuckets int64) {
	largest := 2 * int64(math.Pow10(int(h.SignificantFigures())))
	subBuckets = 1 << int64(math.Ceil(math.Log2(float64(largest))))
	unitMagnitude := int64(math.Floor(math.Log2(float64(h.LowestTrackableValue()))))
	smallestUntrackable := subBuckets << unitMagnitude
	buckets = 1
	for smallestUntrackable < h.HighestTrackableValue() {
		if smallestUntrackable > math.MaxInt64/2 {
			buckets++
			break
		}
		smallestUntrackable <<= 1
		buckets++
	}
	return buckets, subBuckets
}
