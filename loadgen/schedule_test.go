package loadgen

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pinned-go/pinned/clock"
)

func TestSlotsIn(t *testing.T) {
	f := func(rate float64, d time.Duration, want int64) {
		t.Helper()
		if got := slotsIn(rate, d); got != want {
			t.Errorf("slotsIn(%v, %v) = %d; want %d", rate, d, got, want)
		}
	}
	f(1000, time.Second, 1000)
	f(333, time.Second, 333)
	f(3, time.Second, 3)
	f(10000.0/3, 300*time.Millisecond, 1000) // 1000.0000000001 in floating point
	f(1000, 1500*time.Microsecond, 2)        // slots at 0 and 1ms
	f(0.5, time.Second, 1)                   // slot 0 only
	f(1000, 0, 0)
}

// TestScheduleDueAgreesWithOffset checks that due(offset(i)) counts slot i
// and due(offset(i)-1) does not, for rates whose period is not an integer.
func TestScheduleDueAgreesWithOffset(t *testing.T) {
	for _, rate := range []float64{1, 3, 7, 333, 1000, 12000, 99999.7} {
		s, _ := newSchedule(clock.Instant{}, &Config{Rate: rate, Duration: Unbounded, Requests: 5000})
		for i := int64(0); i < 5000; i += 7 {
			off := s.offset(i)
			if got := s.due(off); got != min(i+1, s.total) {
				t.Fatalf("rate %v: due(offset(%d)=%v) = %d; want %d", rate, i, off, got, i+1)
			}
			if got := s.due(off - 1); got != i {
				t.Fatalf("rate %v: due(offset(%d)-1ns) = %d; want %d", rate, i, got, i)
			}
		}
		if got := s.due(s.offset(s.total) + time.Hour); got != s.total {
			t.Fatalf("rate %v: due(after the end) = %d; want total %d", rate, got, s.total)
		}
	}
}

// slotLog records, per open-loop slot, how long after its intended time it
// completed.
type slotLog struct {
	mu  sync.Mutex
	lat map[int64]time.Duration
	dup []int64
}

func (l *slotLog) observe(slot int64, intended, done clock.Instant) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lat == nil {
		l.lat = map[int64]time.Duration{}
	}
	if _, ok := l.lat[slot]; ok {
		l.dup = append(l.dup, slot)
	}
	l.lat[slot] = done.Sub(intended)
}

// TestOpenLoopStallCountsFromIntendedTime is the coordinated-omission test:
// a target that stalls from 200ms to 500ms must show the stall in the
// latency of every slot that fell due during it, no slot may be skipped, and
// the schedule lag must be reported on its own.
func TestOpenLoopStallCountsFromIntendedTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			rate      = 1000
			stallFrom = 200 * time.Millisecond
			stallTo   = 500 * time.Millisecond
			service   = time.Millisecond
		)
		r := mustNew(t, Config{URL: "http://127.0.0.1:1", Rate: rate, Duration: time.Second,
			Requests: Unbounded, Connections: 8})
		t0 := time.Now() // Run reads the same instant: fake time has not moved
		withExec(r, func(_ []byte, o *outcome) {
			if el := time.Since(t0); el >= stallFrom && el < stallTo {
				time.Sleep(stallTo - el)
			}
			time.Sleep(service)
			o.status = 200
		})
		var log slotLog
		r.observe = log.observe
		rep, err := r.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}

		if rep.Requests.Sent != rate || rep.Requests.Unsent != 0 || rep.StoppedBy != StopDuration {
			t.Fatalf("sent %d, unsent %d, stopped by %q; want %d, 0, duration", rep.Requests.Sent, rep.Requests.Unsent, rep.StoppedBy, rate)
		}
		if len(log.lat) != rate || len(log.dup) != 0 {
			t.Fatalf("observed %d distinct slots (duplicates %v); want %d, none", len(log.lat), log.dup, rate)
		}
		for i := range int64(rate) {
			lat, ok := log.lat[i]
			if !ok {
				t.Fatalf("slot %d was skipped", i)
			}
			intended := time.Duration(i) * time.Second / rate
			if intended >= stallFrom && intended < stallTo {
				if want := stallTo - intended + service; lat < want {
					t.Errorf("slot %d (intended %v, during the stall): latency %v; want ≥ %v", i, intended, lat, want)
				}
			} else if intended < stallFrom && lat != service {
				t.Errorf("slot %d (intended %v, before the stall): latency %v; want %v", i, intended, lat, service)
			}
		}
		// A closed loop would report ~8 slow requests (one per worker); the
		// open loop reports every slot due during the stall.
		slow := 0
		for _, lat := range log.lat {
			if lat >= 100*time.Millisecond {
				slow++
			}
		}
		if slow < 200 {
			t.Errorf("%d slots with latency ≥ 100ms; want ≥ 200 (slots due at 200ms..400ms)", slow)
		}
		l := rep.Latency
		if l.Count != rate || l.Max < 300_000 || l.P90 < 190_000 || l.P50 != 1000 {
			t.Errorf("latency count %d p50 %dµs p90 %dµs max %dµs; want %d, 1000, ≥190000, ≥300000", l.Count, l.P50, l.P90, l.Max, rate)
		}
		if rep.ScheduleLag == nil || rep.ScheduleLag.Max < 250_000 {
			t.Errorf("schedule lag %+v; want max ≥ 250ms (slots queued behind the stalled workers)", rep.ScheduleLag)
		}
		// Service time is kept at 2 significant digits: 1000µs reads as 1003.
		if rep.Service == nil || rep.Service.P50 < 1000 || rep.Service.P50 > 1010 || rep.Service.Max < 299_000 {
			t.Errorf("service time %+v; want p50 ≈ 1000µs, max ≈ 300ms", rep.Service)
		}
		if rep.Generator.Workers != 8 {
			t.Errorf("workers = %d; want the pool grown to MaxWorkers = 8 during the stall", rep.Generator.Workers)
		}
		if rep.AchievedRate < 950 || rep.AchievedRate > 1001 {
			t.Errorf("achieved rate %.1f; want ≈ 1000", rep.AchievedRate)
		}
	})
}

func TestOpenLoopSlotCount(t *testing.T) {
	f := func(name string, cfg Config, wantSent int64, wantBy string) {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg.URL = "http://127.0.0.1:1"
				r := mustNew(t, cfg)
				withExec(r, func(_ []byte, o *outcome) { time.Sleep(3 * time.Millisecond); o.status = 204 })
				var log slotLog
				r.observe = log.observe
				rep, err := r.Run(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if rep.Requests.Sent != wantSent || rep.StoppedBy != wantBy {
					t.Errorf("sent %d stopped by %q; want %d, %q", rep.Requests.Sent, rep.StoppedBy, wantSent, wantBy)
				}
				warm := slotsIn(cfg.Rate, cfg.Warmup)
				if int64(len(log.lat)) != wantSent+warm {
					t.Errorf("observed %d slots; want %d measured + %d warmup", len(log.lat), wantSent, warm)
				}
				if rep.Latency.Count != wantSent || rep.Statuses["204"] != wantSent {
					t.Errorf("latency count %d, statuses %v; want %d", rep.Latency.Count, rep.Statuses, wantSent)
				}
			})
		})
	}
	f("non-integer period", Config{Rate: 333, Duration: time.Second, Requests: Unbounded}, 333, StopDuration)
	f("rounding up", Config{Rate: 1000, Duration: 1000500 * time.Microsecond, Requests: Unbounded}, 1001, StopDuration)
	f("requests bound first", Config{Rate: 1000, Duration: 10 * time.Second, Requests: 250}, 250, StopRequests)
	f("duration bound first", Config{Rate: 1000, Duration: 100 * time.Millisecond, Requests: 250}, 100, StopDuration)
	f("only requests bound", Config{Rate: 50000, Duration: Unbounded, Requests: 2000}, 2000, StopRequests)
	f("warmup excluded", Config{Rate: 1000, Duration: 200 * time.Millisecond, Warmup: 100 * time.Millisecond, Requests: Unbounded}, 200, StopDuration)
	f("high rate batches", Config{Rate: 100000, Duration: 50 * time.Millisecond, Requests: Unbounded, Connections: 400}, 5000, StopDuration)
}

// TestOpenLoopDrainTimeoutReportsUnsent: a target that never answers within
// the run leaves slots queued; after DrainTimeout they are reported as
// unsent (and as failures in ErrorRate), not dropped silently.
func TestOpenLoopDrainTimeoutReportsUnsent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := mustNew(t, Config{URL: "http://127.0.0.1:1", Rate: 100, Duration: time.Second, Requests: Unbounded,
			Connections: 2, DrainTimeout: time.Second})
		withExec(r, func(_ []byte, o *outcome) { time.Sleep(time.Hour); o.status = 200 })
		rep, err := r.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if rep.Requests.Sent != 2 || rep.Requests.Unsent != 98 {
			t.Errorf("sent %d unsent %d; want 2 (one per worker) and 98", rep.Requests.Sent, rep.Requests.Unsent)
		}
		if rep.ErrorRate != 0.98 {
			t.Errorf("error rate %v; want 0.98 (unsent slots count as failed)", rep.ErrorRate)
		}
	})
}

func TestOpenLoopCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := mustNew(t, Config{URL: "http://127.0.0.1:1", Rate: 1000, Duration: time.Second, Requests: Unbounded})
		withExec(r, func(_ []byte, o *outcome) { time.Sleep(time.Millisecond); o.status = 200 })
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		rep, err := r.Run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.StoppedBy != StopCanceled {
			t.Errorf("stopped by %q; want canceled", rep.StoppedBy)
		}
		if n := rep.Requests.Sent + rep.Requests.Unsent; n < 299 || n > 301 {
			t.Errorf("sent+unsent = %d; want ≈ 300 (the slots due before the cancel)", n)
		}
		if _, err := r.Run(context.Background()); err != ErrAlreadyRun {
			t.Errorf("second Run: err = %v; want ErrAlreadyRun", err)
		}
	})
}

// TestOpenLoopPoolGrowsOnlyWhenNeeded: a fast target at a low rate is served
// by one worker; a slow one grows the pool to MaxWorkers and no further.
func TestOpenLoopPoolGrowsOnlyWhenNeeded(t *testing.T) {
	f := func(service time.Duration, maxWorkers, want int) {
		t.Helper()
		synctest.Test(t, func(t *testing.T) {
			r := mustNew(t, Config{URL: "http://127.0.0.1:1", Rate: 100, Duration: time.Second, Requests: Unbounded,
				Connections: 64, MaxWorkers: maxWorkers})
			withExec(r, func(_ []byte, o *outcome) { time.Sleep(service); o.status = 200 })
			rep, err := r.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Generator.Workers != want || rep.Requests.Sent != 100 {
				t.Errorf("service %v, MaxWorkers %d: %d workers, %d sent; want %d workers, 100 sent",
					service, maxWorkers, rep.Generator.Workers, rep.Requests.Sent, want)
			}
		})
	}
	f(time.Millisecond, 64, 1)
	f(35*time.Millisecond, 64, 4) // 3.5 requests in flight at 100/s
	f(500*time.Millisecond, 5, 5)
}

func TestClosedLoopBounds(t *testing.T) {
	f := func(name string, cfg Config, wantSent int64, wantBy string) {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg.URL = "http://127.0.0.1:1"
				cfg.Connections = 4
				r := mustNew(t, cfg)
				withExec(r, func(_ []byte, o *outcome) { time.Sleep(10 * time.Millisecond); o.status = 200 })
				start := time.Now()
				rep, err := r.Run(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if rep.Requests.Sent != wantSent || rep.StoppedBy != wantBy {
					t.Errorf("sent %d stopped by %q; want %d, %q", rep.Requests.Sent, rep.StoppedBy, wantSent, wantBy)
				}
				if !near(rep.Latency.P50, 10_000) || !near(rep.Latency.Max, 10_000) {
					t.Errorf("latency p50 %d max %d; want 10000µs (closed loop: from actual send)", rep.Latency.P50, rep.Latency.Max)
				}
				if el := time.Since(start); cfg.Duration > 0 && el > cfg.Warmup+cfg.Duration+10*time.Millisecond {
					t.Errorf("run took %v; want ≤ warmup+duration+one request", el)
				}
			})
		})
	}
	f("duration", Config{Duration: time.Second, Requests: Unbounded}, 400, StopDuration)
	f("requests", Config{Duration: time.Hour, Requests: 50}, 50, StopRequests)
	f("warmup excluded", Config{Duration: time.Second, Warmup: 100 * time.Millisecond, Requests: Unbounded}, 400, StopDuration)
}

func TestProgressLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		r := mustNew(t, Config{URL: "http://127.0.0.1:1", Rate: 100, Duration: time.Second, Requests: Unbounded,
			Progress: &buf, ProgressInterval: 200 * time.Millisecond, Warmup: 250 * time.Millisecond})
		withExec(r, func(_ []byte, o *outcome) { time.Sleep(time.Millisecond); o.status = 200 })
		if _, err := r.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 6 {
			t.Fatalf("progress lines = %d; want 6 over 1.25s at 200ms:\n%s", len(lines), buf.String())
		}
		if !strings.Contains(lines[0], "(warmup)") || strings.Contains(lines[1], "(warmup)") {
			t.Errorf("warmup marker wrong:\n%s", buf.String())
		}
		if !strings.Contains(lines[1], "rate 100/s") {
			t.Errorf("line %q; want rate 100/s", lines[1])
		}
	})
}

// near reports whether an HdrHistogram value is within its 3-digit
// precision of want (percentile queries return the highest value
// equivalent to the recorded one).
func near(got, want int64) bool {
	d := got - want
	return d >= 0 && d <= want/1000+1
}

// TestStagesScheduleFollowsTheRateCurve: a ramp, steps and a held last
// rate lay slots out by the integral of the rate, and due and offset agree
// everywhere.
func TestStagesScheduleFollowsTheRateCurve(t *testing.T) {
	f := func(name string, cfg Config, checks map[time.Duration]int64, total int64) {
		t.Run(name, func(t *testing.T) {
			cfg.Requests = Unbounded
			s, by := newSchedule(clock.Instant{}, &cfg)
			if s.total != total || by != StopDuration {
				t.Errorf("total %d stopped by %s; want %d, duration", s.total, by, total)
			}
			for at, want := range checks {
				if got := s.due(at); got < want-1 || got > want+1 {
					t.Errorf("due(%v) = %d; want %d ± 1", at, got, want)
				}
			}
			for i := int64(0); i < s.total; i++ {
				off := s.offset(i)
				if i > 0 && off < s.offset(i-1) {
					t.Fatalf("offset(%d) = %v before offset(%d) = %v", i, off, i-1, s.offset(i-1))
				}
				if got := s.due(off); got != i+1 {
					t.Fatalf("due(offset(%d) = %v) = %d; want %d", i, off, got, i+1)
				}
			}
		})
	}
	// Λ(t) = 1000t + 1000t² over the ramp (1000 → 3000 in 1s), then 3000/s.
	f("ramp then hold", Config{Duration: 2 * time.Second, Stages: []Stage{{Duration: time.Second, Rate: 1000, EndRate: 3000}}},
		map[time.Duration]int64{250 * time.Millisecond: 313, 500 * time.Millisecond: 751, time.Second: 2001, 1500 * time.Millisecond: 3501}, 5000)
	f("ramp down", Config{Duration: time.Second, Stages: []Stage{{Duration: time.Second, Rate: 3000, EndRate: 1000}}},
		map[time.Duration]int64{500 * time.Millisecond: 1251}, 2000)
	f("steps", Config{Duration: 3 * time.Second, Stages: []Stage{{Duration: time.Second, Rate: 100}, {Duration: time.Second, Rate: 200}, {Rate: 300}}},
		map[time.Duration]int64{time.Second - 1: 100, 2*time.Second - 1: 300, 2500 * time.Millisecond: 451}, 600)
	// The warmup runs at the first stage's starting rate; measured slots
	// follow the stages from the end of the warmup.
	f("warmup first", Config{Duration: time.Second, Warmup: time.Second, Stages: []Stage{{Duration: time.Second, Rate: 100, EndRate: 300}}},
		map[time.Duration]int64{time.Second - 1: 100, 2*time.Second - 1: 300}, 300)
}
