package registry

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// DefaultMaxNamespaceSeries is the default Config.MaxNamespaceSeries.
const DefaultMaxNamespaceSeries = 500

// Endpoint names used as the "endpoint" label.
const (
	epRegister   = "register"
	epHeartbeat  = "heartbeat"
	epRelease    = "release"
	epReleases   = "releases"
	epDeregister = "deregister"
	epPush       = "push"
	epWorkers    = "workers"
	epOverview   = "overview"
	epHealthz    = "healthz"
	epPlacement  = "placement" // GET /registry/placements/{ns}/{id}
	epEvict      = "evict"     // DELETE /registry/placements/{ns}/{id}
	epInstances  = "instances"
	epHot        = "hot"
	epTraffic    = "traffic"
)

var endpoints = []string{epRegister, epHeartbeat, epRelease, epReleases, epDeregister, epPush, epWorkers, epOverview, epHealthz,
	epPlacement, epEvict, epInstances, epHot, epTraffic,
	epAlarmSet, epAlarmDelete, epAlarmList, epAlarmsDead}

// codes are the status codes the registry answers; anything else is
// counted as code="other".
var codes = []int{200, 202, 400, 401, 403, 404, 409, 413, 422, 429, 500, 501, 503}

// registryMetrics holds every metric pointer, resolved once in New.
type registryMetrics struct {
	set *metrics.Set

	requests map[string]map[int]*metrics.Counter // endpoint -> code
	other    map[string]*metrics.Counter
	duration map[string]*metrics.PrometheusHistogram

	registrations     *metrics.Counter
	registerFailures  map[string]*metrics.Counter // reason
	superseded        *metrics.Counter
	challengeFailures map[string]*metrics.Counter // reason
	heartbeats        *metrics.Counter
	pushed            *metrics.Counter
	delivered         *metrics.Counter
	released          *metrics.Counter
	releaseNoop       *metrics.Counter
	releaseRefused    *metrics.Counter
	deregistered      *metrics.Counter
	deregisterNoop    *metrics.Counter
	evictQueued       *metrics.Counter
	evictReleased     *metrics.Counter
	rateLimited       map[string]*metrics.Counter // limit
	authFailures      *metrics.Counter
	storeErrors       *metrics.Counter
	reapedSessions    *metrics.Counter
	reapedPlacements  *metrics.Counter
	sweepErrors       *metrics.Counter
	alarmsSet         *metrics.Counter
	alarmRefused      *metrics.Counter

	liveWorkers *metrics.Gauge
	sessions    *metrics.Gauge
	storeUp     *metrics.Gauge

	maxSeries  int
	nsMu       sync.Mutex
	placements *nsGauges // pinned_registry_placements{namespace}
	nsWorkers  *nsGauges // pinned_registry_namespace_workers{namespace}
}

// nsGauges is one per-namespace gauge family whose series follow the
// namespaces the janitor saw last.
type nsGauges struct {
	family string
	gauges map[string]*metrics.Gauge // label value -> gauge
	names  map[string]string         // label value -> metric name
}

func newNSGauges(family string) *nsGauges {
	return &nsGauges{family: family, gauges: map[string]*metrics.Gauge{}, names: map[string]string{}}
}

// Registration failure reasons (besides the challenge reasons).
const (
	failInvalid = "invalid"
	failStore   = "store"
	failBusy    = "busy"
	// failRateLimited: a registration limit (per IP or per token) refused it.
	failRateLimited = "rate_limited"
	// failSessionCap: the token holds MaxSessionsPerToken live sessions;
	// also a label of pinned_registry_rate_limited_total.
	failSessionCap = "session_cap"
)

// Labels of pinned_registry_rate_limited_total (plus failSessionCap).
const (
	limitAuthIP        = "auth_ip"
	limitRegisterIP    = "register_ip"
	limitRegisterToken = "register_token"
)

func newRegistryMetrics(set *metrics.Set, maxSeries int) *registryMetrics {
	m := &registryMetrics{
		set:               set,
		requests:          map[string]map[int]*metrics.Counter{},
		other:             map[string]*metrics.Counter{},
		duration:          map[string]*metrics.PrometheusHistogram{},
		registerFailures:  map[string]*metrics.Counter{},
		challengeFailures: map[string]*metrics.Counter{},
		rateLimited:       map[string]*metrics.Counter{},
		maxSeries:         maxSeries,
		placements:        newNSGauges("pinned_registry_placements"),
		nsWorkers:         newNSGauges("pinned_registry_namespace_workers"),
	}
	for _, ep := range endpoints {
		m.requests[ep] = map[int]*metrics.Counter{}
		for _, c := range codes {
			m.requests[ep][c] = set.NewCounter(`pinned_registry_requests_total{endpoint="` + ep + `",code="` + strconv.Itoa(c) + `"}`)
		}
		m.other[ep] = set.NewCounter(`pinned_registry_requests_total{endpoint="` + ep + `",code="other"}`)
		m.duration[ep] = set.NewPrometheusHistogram(`pinned_registry_request_duration_seconds{endpoint="` + ep + `"}`)
	}
	m.registrations = set.NewCounter(`pinned_registry_registrations_total`)
	for _, r := range append([]string{failInvalid, failStore, failBusy, failRateLimited, failSessionCap}, challengeReasons...) {
		m.registerFailures[r] = set.NewCounter(`pinned_registry_registration_failures_total{reason="` + r + `"}`)
	}
	for _, r := range challengeReasons {
		m.challengeFailures[r] = set.NewCounter(`pinned_registry_challenge_failures_total{reason="` + r + `"}`)
	}
	m.superseded = set.NewCounter(`pinned_registry_superseded_total`)
	m.heartbeats = set.NewCounter(`pinned_registry_heartbeats_total`)
	m.pushed = set.NewCounter(`pinned_registry_messages_pushed_total`)
	m.delivered = set.NewCounter(`pinned_registry_messages_delivered_total`)
	m.released = set.NewCounter(`pinned_registry_releases_total{result="released"}`)
	m.releaseNoop = set.NewCounter(`pinned_registry_releases_total{result="not_owner"}`)
	m.releaseRefused = set.NewCounter(`pinned_registry_releases_total{result="refused"}`)
	m.deregistered = set.NewCounter(`pinned_registry_deregistrations_total{result="deregistered"}`)
	m.deregisterNoop = set.NewCounter(`pinned_registry_deregistrations_total{result="unknown"}`)
	m.evictQueued = set.NewCounter(`pinned_registry_evictions_total{result="queued"}`)
	m.evictReleased = set.NewCounter(`pinned_registry_evictions_total{result="released"}`)
	for _, l := range []string{limitAuthIP, limitRegisterIP, limitRegisterToken, failSessionCap} {
		m.rateLimited[l] = set.NewCounter(`pinned_registry_rate_limited_total{limit="` + l + `"}`)
	}
	m.authFailures = set.NewCounter(`pinned_registry_auth_failures_total`)
	m.storeErrors = set.NewCounter(`pinned_registry_store_errors_total`)
	m.reapedSessions = set.NewCounter(`pinned_registry_reaped_sessions_total`)
	m.reapedPlacements = set.NewCounter(`pinned_registry_reaped_placements_total`)
	m.sweepErrors = set.NewCounter(`pinned_registry_sweep_errors_total`)
	m.alarmsSet = set.NewCounter(`pinned_registry_alarms_set_total`)
	m.alarmRefused = set.NewCounter(`pinned_registry_alarm_calls_refused_total`)
	m.liveWorkers = set.NewGauge(`pinned_registry_live_workers`, nil)
	m.sessions = set.NewGauge(`pinned_registry_sessions`, nil)
	m.storeUp = set.NewGauge(`pinned_registry_store_up`, nil)
	return m
}

func (m *registryMetrics) request(ep string, code int) {
	if c := m.requests[ep][code]; c != nil {
		c.Inc()
		return
	}
	m.other[ep].Inc()
}

// overflowNamespace is the label value that aggregates namespaces beyond
// Config.MaxNamespaceSeries.
const overflowNamespace = "_other"

// labelValue makes a namespace safe as a Prometheus label value whatever
// the store returned: bytes outside pinned's segment grammar (and '/')
// become '_', so no quote, backslash or newline can reach the exposition.
func labelValue(ns string) string {
	if len(ns) > wire.MaxNamespaceLen+1 {
		ns = ns[:wire.MaxNamespaceLen+1]
	}
	var b strings.Builder
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if c == '/' || wire.CheckSegment([]byte{c}, 1) == wire.SegmentOK || c == '.' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// setPlacements publishes the per-namespace placement gauges, dropping the
// series of namespaces that disappeared.
func (m *registryMetrics) setPlacements(perNS map[string]int) { m.setPerNamespace(m.placements, perNS) }

// setNamespaceWorkers publishes how many live workers serve each namespace.
func (m *registryMetrics) setNamespaceWorkers(perNS map[string]int) {
	m.setPerNamespace(m.nsWorkers, perNS)
}

// setPerNamespace sets v's gauges to perNS: namespaces become label values
// (labelValue), those beyond maxSeries add up under overflowNamespace, and
// the series of namespaces no longer present are unregistered.
func (m *registryMetrics) setPerNamespace(v *nsGauges, perNS map[string]int) {
	m.nsMu.Lock()
	defer m.nsMu.Unlock()
	names := make([]string, 0, len(perNS))
	for ns := range perNS {
		names = append(names, ns)
	}
	slices.Sort(names)
	vals := map[string]int{}
	for _, ns := range names {
		lv := labelValue(ns)
		if _, ok := vals[lv]; !ok && len(vals) >= m.maxSeries {
			lv = overflowNamespace
		}
		vals[lv] += perNS[ns]
	}
	for lv, n := range vals {
		g := v.gauges[lv]
		if g == nil {
			name := v.family + `{namespace="` + lv + `"}`
			g = m.set.GetOrCreateGauge(name, nil)
			v.gauges[lv], v.names[lv] = g, name
		}
		g.Set(float64(n))
	}
	for lv, name := range v.names {
		if _, ok := vals[lv]; !ok {
			m.set.UnregisterMetric(name)
			delete(v.gauges, lv)
			delete(v.names, lv)
		}
	}
}
