package registry

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// Alarm limits of the registry.
const (
	// DefaultMaxDeadAlarmsListed is the default and MaxDeadAlarmsListed the
	// largest ?limit= of GET /registry/alarms/dead.
	DefaultMaxDeadAlarmsListed = 100
	MaxDeadAlarmsListed        = 1000
)

// Endpoint labels of the alarm calls.
const (
	epAlarmSet    = "alarm_set"
	epAlarmDelete = "alarm_delete"
	epAlarmList   = "alarm_list"
	epAlarmsDead  = "alarms_dead"
)

// alarmRoutes mounts the alarm calls. Without a store that keeps alarms
// (store.Alarms) they answer 501.
func (r *Registry) alarmRoutes(mount func(method, path, ep string, h handler)) {
	mount(fasthttp.MethodPost, wire.PathAlarmSet, epAlarmSet, r.alarmSet)
	mount(fasthttp.MethodPost, wire.PathAlarmDelete, epAlarmDelete, r.alarmDelete)
	mount(fasthttp.MethodPost, wire.PathAlarmList, epAlarmList, r.alarmList)
	mount(fasthttp.MethodGet, wire.PathAlarmsDead, epAlarmsDead, r.alarmsDead)
}

func (r *Registry) noAlarms(ctx *fasthttp.RequestCtx) (int, bool) {
	if r.alarms != nil {
		return 0, false
	}
	return writeError(ctx, fasthttp.StatusNotImplemented, "this pinboard's store keeps no alarms", ""), true
}

// checkInstance validates the (sessionId, namespace, id) of an alarm call.
func checkInstance(sessionID, ns, id string) *badRequest {
	if e := checkSessionID(sessionID); e != nil {
		return e
	}
	if e := wire.CheckNamespace(ns); e != wire.SegmentOK {
		return bad("namespace", "%v", e)
	}
	if e := wire.CheckSegment([]byte(id), wire.MaxIDLen); e != wire.SegmentOK {
		return bad("id", "%v", e)
	}
	return nil
}

func parseAlarmSet(body []byte) (wire.AlarmSetRequest, *badRequest) {
	var r wire.AlarmSetRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	if e := checkInstance(r.SessionID, r.Namespace, r.ID); e != nil {
		return r, e
	}
	if field, err := r.Alarm.Check(); err != nil {
		return r, bad("alarm."+field, "%v", err)
	}
	return r, nil
}

func parseAlarmDelete(body []byte) (wire.AlarmDeleteRequest, *badRequest) {
	var r wire.AlarmDeleteRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	if e := checkInstance(r.SessionID, r.Namespace, r.ID); e != nil {
		return r, e
	}
	if e := wire.CheckSegment([]byte(r.Name), wire.MaxAlarmNameLen); e != wire.SegmentOK {
		return r, bad("name", "%v", e)
	}
	return r, nil
}

func parseAlarmList(body []byte) (wire.AlarmListRequest, *badRequest) {
	var r wire.AlarmListRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	return r, checkInstance(r.SessionID, r.Namespace, r.ID)
}

// holds answers the call itself (409, or a store failure) and returns false
// unless sessionID is live and holds the placement of (ns, id): only the
// worker serving an instance touches its alarms, so a worker that lost its
// lease cannot change the alarms of an id placed elsewhere since.
func (r *Registry) holds(ctx *fasthttp.RequestCtx, sctx context.Context, sessionID, ns, id string) (int, bool) {
	_, err := r.st.Session(sctx, sessionID)
	switch {
	case errors.Is(err, store.ErrUnknownSession):
		r.m.alarmRefused.Inc()
		return writeError(ctx, fasthttp.StatusConflict, "unknown session: its lease ended; the instance is no longer this worker's", "sessionId"), false
	case err != nil:
		return r.storeFailed(ctx, "session", err), false
	}
	holder, err := r.st.Placement(sctx, ns, id)
	if err != nil {
		return r.storeFailed(ctx, "placement", err), false
	}
	if holder != sessionID {
		r.m.alarmRefused.Inc()
		return writeError(ctx, fasthttp.StatusConflict, "the session does not hold this instance's placement", "sessionId"), false
	}
	return 0, true
}

// mintGen returns a new alarm generation: 64 random bits, hex.
func mintGen() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go ≥ 1.24)
	return fmt.Sprintf("%x", b)
}

// holderCall serves one of the worker's alarm calls: the store must keep
// alarms (501), the body must parse (400), and the session it names must
// hold the placement (holds); then fn answers with the store context.
func holderCall[T any](r *Registry, ctx *fasthttp.RequestCtx, parse func([]byte) (T, *badRequest), inst func(T) (sid, ns, id string),
	fn func(sctx context.Context, req T) int) int {
	if code, off := r.noAlarms(ctx); off {
		return code
	}
	req, e := decodeRequest(ctx, parse)
	if e != nil {
		return writeBad(ctx, e)
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	sid, ns, id := inst(req)
	if code, ok := r.holds(ctx, sctx, sid, ns, id); !ok {
		return code
	}
	return fn(sctx, req)
}

func (r *Registry) alarmSet(ctx *fasthttp.RequestCtx, _ string) int {
	return holderCall(r, ctx, parseAlarmSet, func(q wire.AlarmSetRequest) (string, string, string) { return q.SessionID, q.Namespace, q.ID },
		func(sctx context.Context, req wire.AlarmSetRequest) int {
			a := req.Alarm.Normalized(mintGen())
			err := r.alarms.SetAlarm(sctx, req.Namespace, req.ID, a, r.maxAlarms)
			switch {
			case errors.Is(err, store.ErrTooManyAlarms):
				r.m.alarmRefused.Inc()
				return writeError(ctx, fasthttp.StatusConflict, fmt.Sprintf("the instance already holds %d alarms, the most allowed; delete one first", r.maxAlarms), "alarm")
			case err != nil:
				return r.storeFailed(ctx, "set alarm", err)
			}
			r.m.alarmsSet.Inc()
			if r.onAlarmSet != nil {
				r.onAlarmSet(wire.AlarmShard(wire.PlacementName(req.Namespace, req.ID)), a.AtMs)
			}
			r.log.Debug("alarm set", "namespace", req.Namespace, "instance", req.ID, "alarm", a.Name, "atMs", a.AtMs, "session", req.SessionID)
			return writeJSON(ctx, fasthttp.StatusOK, wire.AlarmSetResponse{Gen: a.Gen})
		})
}

func (r *Registry) alarmDelete(ctx *fasthttp.RequestCtx, _ string) int {
	return holderCall(r, ctx, parseAlarmDelete, func(q wire.AlarmDeleteRequest) (string, string, string) { return q.SessionID, q.Namespace, q.ID },
		func(sctx context.Context, req wire.AlarmDeleteRequest) int {
			deleted, err := r.alarms.DeleteAlarm(sctx, req.Namespace, req.ID, req.Name)
			if err != nil {
				return r.storeFailed(ctx, "delete alarm", err)
			}
			return writeJSON(ctx, fasthttp.StatusOK, wire.AlarmDeleteResponse{Deleted: deleted})
		})
}

func (r *Registry) alarmList(ctx *fasthttp.RequestCtx, _ string) int {
	return holderCall(r, ctx, parseAlarmList, func(q wire.AlarmListRequest) (string, string, string) { return q.SessionID, q.Namespace, q.ID },
		func(sctx context.Context, req wire.AlarmListRequest) int {
			as, err := r.alarms.ListAlarms(sctx, req.Namespace, req.ID)
			if err != nil {
				return r.storeFailed(ctx, "list alarms", err)
			}
			return writeJSON(ctx, fasthttp.StatusOK, wire.AlarmListResponse{Alarms: as})
		})
}

func (r *Registry) alarmsDead(ctx *fasthttp.RequestCtx, _ string) int {
	if code, off := r.noAlarms(ctx); off {
		return code
	}
	limit := DefaultMaxDeadAlarmsListed
	if v := ctx.QueryArgs().Peek("limit"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > MaxDeadAlarmsListed {
			return writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("must be an integer from 1 to %d", MaxDeadAlarmsListed), "limit")
		}
		limit = n
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	ds, err := r.alarms.DeadAlarms(sctx, limit)
	if err != nil {
		return r.storeFailed(ctx, "dead alarms", err)
	}
	return writeJSON(ctx, fasthttp.StatusOK, wire.DeadAlarmsResponse{DeadAlarms: ds})
}
