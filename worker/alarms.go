package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// ErrAlarmRefused is returned (wrapped) by the alarm calls for any other
// refusal a retry cannot fix (an invalid alarm, a wrong token, a pinboard
// that keeps no alarms).
var ErrAlarmRefused = errors.New("the pinboard refused the alarm call")

// alarmRetryMin and alarmRetryMax bound the wait between two attempts of an
// alarm call.
const (
	alarmRetryMin = 100 * time.Millisecond
	alarmRetryMax = time.Second
)

var _ host.AlarmStore = (*Worker)(nil)

// SetAlarm implements host.AlarmStore: POST /registry/alarms/set for the
// session ctx carries (SessionOf; the host passes the instance's context),
// else the current one. The pinboard stores the alarm only while that
// session holds the placement of (namespace, id) (host.ErrAlarmNotHolder
// otherwise).
func (w *Worker) SetAlarm(ctx context.Context, namespace, id string, a host.Alarm) error {
	body := wire.AlarmSetRequest{SessionID: w.alarmSession(ctx), Namespace: namespace, ID: id, Alarm: wire.Alarm{
		Name: a.Name, AtMs: a.At.UnixMilli(), EveryMs: a.Every.Milliseconds(), SkipMissed: a.SkipMissed,
		MaxAttempts: a.MaxAttempts, BackoffMs: a.Backoff.Milliseconds(),
	}}
	_, err := w.alarmCall(ctx, wire.PathAlarmSet, body)
	return err
}

// DeleteAlarm implements host.AlarmStore (POST /registry/alarms/delete).
func (w *Worker) DeleteAlarm(ctx context.Context, namespace, id, name string) (bool, error) {
	b, err := w.alarmCall(ctx, wire.PathAlarmDelete, wire.AlarmDeleteRequest{SessionID: w.alarmSession(ctx), Namespace: namespace, ID: id, Name: name})
	if err != nil {
		return false, err
	}
	var r wire.AlarmDeleteResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return false, fmt.Errorf("malformed alarm delete answer: %w", err)
	}
	return r.Deleted, nil
}

// Alarms implements host.AlarmStore (POST /registry/alarms/list).
func (w *Worker) Alarms(ctx context.Context, namespace, id string) ([]host.Alarm, error) {
	b, err := w.alarmCall(ctx, wire.PathAlarmList, wire.AlarmListRequest{SessionID: w.alarmSession(ctx), Namespace: namespace, ID: id})
	if err != nil {
		return nil, err
	}
	var r wire.AlarmListResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("malformed alarm list answer: %w", err)
	}
	out := make([]host.Alarm, 0, len(r.Alarms))
	for _, a := range r.Alarms {
		h := host.Alarm{Name: a.Name, At: time.UnixMilli(a.AtMs), Every: time.Duration(a.EveryMs) * time.Millisecond,
			SkipMissed: a.SkipMissed, MaxAttempts: a.MaxAttempts, Backoff: time.Duration(a.BackoffMs) * time.Millisecond,
			Failures: a.Failures}
		if a.DueMs > 0 {
			h.Due = time.UnixMilli(a.DueMs)
		}
		out = append(out, h)
	}
	return out, nil
}

// alarmSession is the session an alarm call names: ctx's, else the current
// one.
func (w *Worker) alarmSession(ctx context.Context) string {
	if sid, ok := SessionOf(ctx); ok {
		return sid
	}
	return w.Session()
}

// alarmCall posts body to path until the pinboard answers 200 or a refusal
// a retry cannot fix, or ctx ends (without a deadline: Config.RequestTimeout
// after the first call). Transport errors, 5xx (but 501) and 429 are retried
// after a short backoff.
func (w *Worker) alarmCall(ctx context.Context, path string, body any) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.cfg.RequestTimeout)
		defer cancel()
	}
	wait := alarmRetryMin
	for {
		var deadline time.Time
		if d, ok := ctx.Deadline(); ok {
			deadline = d
		}
		rep := w.pinboard.post(path, body, deadline)
		switch {
		case rep.err == nil && rep.status == fasthttp.StatusOK:
			w.m.alarmCalls[resultOK].Inc()
			return rep.body, nil
		case rep.err == nil && rep.status == fasthttp.StatusUnauthorized:
			w.m.alarmCalls[resultUnauthorized].Inc()
			return nil, fmt.Errorf("%s: %w: %s (set %s to the pinboard's token)", path, ErrAlarmRefused, rep.describe(), w.cfg.TokenSource)
		case rep.err == nil && rep.status == fasthttp.StatusConflict && rep.field() == "sessionId":
			w.m.alarmCalls[resultRefused].Inc()
			return nil, fmt.Errorf("%s: %w: %s", path, host.ErrAlarmNotHolder, rep.describe())
		case rep.err == nil && rep.status == fasthttp.StatusConflict && rep.field() == "alarm":
			w.m.alarmCalls[resultRefused].Inc()
			return nil, fmt.Errorf("%s: %w: %s", path, host.ErrTooManyAlarms, rep.describe())
		case rep.err == nil && (rep.status < 500 || rep.status == fasthttp.StatusNotImplemented) && rep.status != fasthttp.StatusTooManyRequests:
			w.m.alarmCalls[resultRefused].Inc()
			return nil, fmt.Errorf("%s: %w: %s", path, ErrAlarmRefused, rep.describe())
		}
		w.m.alarmCalls[resultFailed].Inc()
		t := w.clock.NewTimer(wait)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%s: %w: %w (last answer: %s)", path, host.ErrAlarmUnavailable, context.Cause(ctx), rep.describe())
		}
		wait = min(2*wait, alarmRetryMax)
	}
}
