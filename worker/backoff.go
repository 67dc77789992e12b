package worker

import "time"

// backoffCeiling is the upper bound of the delay after the n-th consecutive
// failure (n ≥ 1): min(max, base·2^(n−1)), without overflow.
func backoffCeiling(n int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// backoffDelay is "full jitter" exponential backoff: uniform in
// [0, backoffCeiling(n)]. jitter(k) returns a uniform value in [0, k).
func backoffDelay(n int, base, max time.Duration, jitter func(int64) int64) time.Duration {
	return time.Duration(jitter(int64(backoffCeiling(n, base, max)) + 1))
}
