package fence_test

import (
	"context"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/fence"
	"github.com/pinned-go/pinned/host"
)

// Counter is an object whose count lives in Redis, fenced by its
// activation epoch.
type Counter struct {
	inst  *host.Instance
	rdb   rueidis.Client
	count int64
}

func (c *Counter) key() string { return "counter:" + c.inst.ID() }

// incr answers POST /incr once the new count is stored. A stale activation
// gets a *fence.StaleError, which is host.ErrStale: the host aborts the
// instance and answers 503 stale, and nothing was written.
func (c *Counter) incr(x *host.Ctx) error {
	n, err := fence.Incr(x.Context(), c.rdb, c.key(), c.inst.Epoch(), 1)
	if err != nil {
		return err
	}
	c.count = n
	return x.JSON(200, map[string]any{"count": n, "epoch": c.inst.Epoch()})
}

// An object type whose activation loads its state with fence.Load (which
// fences out every older activation of the id) and whose writes go through
// fence.Incr.
func Example() {
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}, DisableCache: true})
	if err != nil {
		return // no Redis here
	}
	defer rdb.Close()
	routes := host.NewRoutes[*Counter]()
	routes.POST("/incr", (*Counter).incr)
	_, _ = host.New(host.Config{Namespace: "/counter"}, host.Type[*Counter]{
		New: func(inst *host.Instance) (*Counter, error) {
			c := &Counter{inst: inst, rdb: rdb}
			v, err := fence.Load(context.Background(), rdb, c.key(), inst.Epoch())
			if err != nil {
				return nil, err // stale: 503 stale, no instance
			}
			if v != "" {
				if c.count, err = strconv.ParseInt(v, 10, 64); err != nil {
					return nil, err
				}
			}
			return c, nil
		},
		Routes: routes,
	})
}
