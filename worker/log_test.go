package worker

import (
	"strconv"
	"strings"
)

// logged reports whether the captured text log holds a record at level
// (DEBUG, INFO, WARN, ERROR) with message msg and every key=value of kv.
func (h *harness) logged(level, msg string, kv ...string) bool {
	has := func(line, k, v string) bool {
		return strings.Contains(line, " "+k+"="+v+" ") || strings.HasSuffix(line, " "+k+"="+v) ||
			strings.Contains(line, " "+k+"="+strconv.Quote(v))
	}
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if !strings.Contains(line, "level="+level+" ") || !has(line, "msg", msg) {
			continue
		}
		ok := true
		for i := 0; i+1 < len(kv); i += 2 {
			if !has(line, kv[i], kv[i+1]) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// expectLogged waits (on the loop's progress) for a record, then fails
// the test if none came.
func (h *harness) expectLogged(level, msg string, kv ...string) {
	h.t.Helper()
	if h.logged(level, msg, kv...) {
		return
	}
	h.until(level+" "+msg+" "+strings.Join(kv, " "), func() bool { return h.logged(level, msg, kv...) })
	if !h.logged(level, msg, kv...) {
		h.t.Errorf("no %s record %q with %v", level, msg, kv)
	}
}
