package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// redisCommandStats returns calls per command from INFO commandstats of the
// redis-server at addr (one short connection; its own INFO is excluded by
// the callers' deltas).
func redisCommandStats(addr string) (map[string]int64, error) {
	body, err := redisInfo(addr, "commandstats")
	if err != nil {
		return nil, err
	}
	return parseCommandStats(body), nil
}

// redisInfo returns the text of INFO section ("all" for every section) of
// the redis-server at addr, over one short connection.
func redisInfo(addr, section string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "*2\r\n$4\r\nINFO\r\n$%d\r\n%s\r\n", len(section), section); err != nil {
		return "", err
	}
	br := bufio.NewReader(c)
	head, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(head, "$") {
		return "", fmt.Errorf("INFO %s: unexpected reply %q", section, head)
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n < 0 || n > 1<<20 {
		return "", fmt.Errorf("INFO %s: bad length %q", section, head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return "", err
	}
	return string(body), nil
}

// parseInfo reads the "field:value" lines of an INFO reply.
func parseInfo(s string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out
}

// parseCommandStats reads lines "cmdstat_get:calls=3,usec=…".
func parseCommandStats(s string) map[string]int64 {
	out := map[string]int64{}
	for _, l := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return out
}

func jsonMarshal(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }

// cacheCounters are the pinboard's placement cache counters.
type cacheCounters struct{ misses, refreshes float64 }

// placementCounters reads the pinboard's placement cache misses and
// extended refreshes from its admin /metrics.
func placementCounters(admin string) (cacheCounters, error) {
	code, body := httpGet("http://"+admin+"/metrics", 5*time.Second)
	if code != 200 {
		return cacheCounters{}, fmt.Errorf("pinboard /metrics on %s: status %d", admin, code)
	}
	c := cacheCounters{
		misses:    metricValue(body, `pinned_placecache_misses_total{cache="placements"}`),
		refreshes: metricValue(body, `pinned_placement_refreshes_total{result="extended"}`),
	}
	if c.misses < 0 || c.refreshes < 0 {
		return c, fmt.Errorf("pinboard /metrics on %s lacks the placement cache counters", admin)
	}
	return c, nil
}
