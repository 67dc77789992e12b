package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The suites' own HTTP calls, where loadgen does not fit: many requests
// of one kind at a bounded concurrency (alarms set, ids placed), the
// registry's JSON.

// parallel runs fn(0) … fn(n-1), conc at a time, and returns their errors
// joined; once one failed, the rest are not started.
func parallel(ctx context.Context, n, conc int, fn func(i int) error) error {
	var next atomic.Int64
	var failed atomic.Bool
	errs := make(chan error, conc)
	var wg sync.WaitGroup
	for range min(conc, n) {
		wg.Go(func() {
			for ctx.Err() == nil && !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					failed.Store(true)
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for e := range errs {
		all = append(all, e)
	}
	if err := errors.Join(all...); err != nil {
		return err
	}
	return ctx.Err()
}

// doer is a fasthttp client: *fasthttp.Client or *fasthttp.HostClient.
type doer interface {
	DoTimeout(req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error
}

// retryAttempts and retryWait: doExpect's attempts and the wait between
// them (an answer's Retry-After is whole seconds; a short wait suffices
// for a placement in progress or a worker just registered).
const (
	retryAttempts = 5
	retryWait     = 100 * time.Millisecond
)

// doExpect sends req through c until it is answered want: a 503 or a
// failed attempt is tried again, retryAttempts in all; another answer is
// an error at once.
func doExpect(ctx context.Context, c doer, req *fasthttp.Request, resp *fasthttp.Response, want int) error {
	var err error
	for attempt := 0; attempt < retryAttempts; attempt++ {
		if err = c.DoTimeout(req, resp, 30*time.Second); err == nil {
			if resp.StatusCode() == want {
				return nil
			}
			err = fmt.Errorf("%s %s = %d %s", req.Header.Method(), req.URI(), resp.StatusCode(), resp.Body())
			if resp.StatusCode() != fasthttp.StatusServiceUnavailable {
				return err
			}
		}
		if err := sleepCtx(ctx, retryWait); err != nil {
			return err
		}
	}
	return err
}

// getOK asks GET u through c until it is answered 200 (doExpect).
func getOK(ctx context.Context, c doer, u string) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(u)
	return doExpect(ctx, c, req, resp, fasthttp.StatusOK)
}

// registryGet decodes the JSON answer of GET path on the pinboard's
// registry (with the deployment token) into out.
func registryGet(pinboardAddr, path string, out any) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + pinboardAddr + path)
	req.Header.Set("Authorization", "Bearer "+token)
	if err := httpClient.DoTimeout(req, resp, 10*time.Second); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode(), resp.Body())
	}
	if err := json.Unmarshal(resp.Body(), out); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}
