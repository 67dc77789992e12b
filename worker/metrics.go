package worker

import (
	"github.com/VictoriaMetrics/metrics"
)

// Result label values of the worker's counters.
const (
	resultOK           = "ok"
	resultLate         = "late"         // heartbeat acked after RetryInterval
	resultFailed       = "failed"       // transport error, 5xx, malformed answer, other status
	resultUnauthorized = "unauthorized" // 401: the token is wrong
	resultReregister   = "reregister"   // 409 reregister (or an ack asking for it)
	resultSuperseded   = "superseded"   // 409 superseded
	resultGaveUp       = "gave_up"      // release: attempts exhausted
	resultSkipped      = "skipped"      // deregister: instances still tearing down
	resultDeferred     = "deferred"     // release: queued during a Shutdown, sent in the background
	resultRefused      = "refused"      // alarm call: a 4xx a retry cannot fix (not the holder, invalid, cap)
)

// workerMetrics are the worker's series, resolved once in New.
type workerMetrics struct {
	heartbeats    map[string]*metrics.Counter
	registrations map[string]*metrics.Counter
	releases      map[string]*metrics.Counter
	deregisters   map[string]*metrics.Counter
	leaseLost     map[string]*metrics.Counter
	alarmCalls    map[string]*metrics.Counter // alarms.go
	// laterPauses counts the pauses of a Shutdown's release senders while
	// a heartbeat was late (laterrelease.go).
	laterPauses *metrics.Counter
}

func newWorkerMetrics(s *metrics.Set, w *Worker) *workerMetrics {
	vec := func(name, label string, values ...string) map[string]*metrics.Counter {
		m := make(map[string]*metrics.Counter, len(values))
		for _, v := range values {
			m[v] = s.NewCounter(name + `{` + label + `="` + v + `"}`)
		}
		return m
	}
	m := &workerMetrics{
		heartbeats: vec("pinned_heartbeats_total", "result",
			resultOK, resultLate, resultFailed, resultUnauthorized, resultReregister, resultSuperseded),
		registrations: vec("pinned_registrations_total", "result",
			resultOK, resultFailed, resultUnauthorized),
		releases: vec("pinned_releases_total", "result",
			resultOK, resultFailed, resultUnauthorized, resultGaveUp, resultDeferred),
		deregisters: vec("pinned_deregistrations_total", "result",
			resultOK, resultFailed, resultUnauthorized, resultSkipped),
		leaseLost: vec("pinned_lease_lost_total", "reason",
			lossExpired, lossReregister, lossSuperseded, lossStopped, lossTiming),
		alarmCalls: vec("pinned_alarm_calls_total", "result",
			resultOK, resultRefused, resultFailed, resultUnauthorized),
		laterPauses: s.NewCounter("pinned_release_pauses_total"),
	}
	s.NewGauge("pinned_registered", func() float64 { return b2f(w.Ready()) })
	s.NewGauge("pinned_lease_remaining_seconds", func() float64 { return w.Remaining().Seconds() })
	s.NewGauge("pinned_draining", func() float64 { return b2f(w.Draining()) })
	return m
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
