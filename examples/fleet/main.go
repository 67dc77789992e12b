// Command fleet is pinned's fleet demo in one process: a pinboard in
// development mode (in-memory directory, generated token) and three workers
// serving the counter object (examples/counter/counterapp), each on its own
// 127.0.0.1 port and registered with the pinboard like separate processes
// would be. Every request to the pinboard is routed to the worker holding
// the id, which is placed on a worker on its first request.
//
//	go run ./examples/fleet                   # pinboard on 127.0.0.1:8080
//	curl -X POST localhost:8080/counter/alice/incr
//	curl localhost:8080/counter/alice/       # same instance, whatever the worker
//	curl -H "Authorization: Bearer <token>" localhost:8080/registry/workers
//
// `fleet -h` lists the flags: -listen (the pinboard's public address,
// default 127.0.0.1:8080), -admin-listen (the console, /metrics and
// /debug/pprof, default 127.0.0.1:9090), -workers (default 3), -shutdown-timeout. Ctrl-C
// drains the workers, then stops the pinboard, all within -shutdown-timeout
// (what is still open then is closed), logging once a second what it waits
// for and at the end how long it took; a second Ctrl-C exits at once
// (status 130). Every component, the workers' fasthttp servers included,
// logs through slog on stderr (WARN and above); the fleet's own lines
// (logger=fleet: the shutdown) are INFO.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/examples/counter/counterapp"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/internal/pinboard"
	"github.com/pinned-go/pinned/worker"
)

// options is what the demo reads from its flags.
type options struct {
	listen, adminListen string
	workers             int
	shutdownTimeout     time.Duration
}

// loadOptions parses args. For -h it writes every flag to stdout and
// returns flag.ErrHelp (-version: the version, cmdline.ErrVersion); every
// other error is a usage error.
func loadOptions(args []string, stdout io.Writer) (options, error) {
	var o options
	set := cmdline.New("fleet", "", `pinned's fleet demo in one process: a pinboard in development mode and
counter workers on their own 127.0.0.1 ports. It reads no environment variable.
Exit status: 0 after Ctrl-C, 1 when it fails (a port is taken), 2 for bad flags.`)
	set.ListenAddr(&o.listen, "listen", "", "127.0.0.1:8080", "the pinboard's public address (registry and proxy)")
	set.ListenAddr(&o.adminListen, "admin-listen", "", "127.0.0.1:9090", "the pinboard's admin address (the console, /metrics, /debug/pprof)")
	set.Int(&o.workers, "workers", "", 3, "counter workers to start (1 to 16)")
	set.Duration(&o.shutdownTimeout, "shutdown-timeout", "", 5*time.Second,
		"bound on the whole shutdown at exit: the workers drain, then the pinboard stops; a second Ctrl-C exits at once")
	if err := set.Parse(args, nil, stdout); err != nil {
		return o, err
	}
	if o.workers < 1 || o.workers > 16 {
		return o, cmdline.Usagef("-workers %d: want 1 to 16", o.workers)
	}
	return o, nil
}

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Stdout, os.Stderr))
}

// mainStatus is the whole command; it returns the exit status
// (cmdline.Status).
func mainStatus(args []string, stdout, stderr io.Writer) int {
	opts, err := loadOptions(args, stdout)
	if err != nil {
		return cmdline.Exit(stderr, "fleet", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	own := slog.New(slog.NewTextHandler(stderr, nil)).With("logger", "fleet")
	sigs := cmdline.NotifySignals(own)
	defer sigs.Stop()
	return sigs.Run(own, func(ctx context.Context) int {
		return cmdline.Exit(stderr, "fleet", run(ctx, opts, logger, own, func(f fleet) { f.print(stdout) }))
	})
}

// fleet is what the demo started: where to reach it.
type fleet struct {
	Pinboard string   // http://host:port of the pinboard's public listener
	Admin    string   // http://host:port of its admin listener
	Workers  []string // each worker's advertise URL
	Token    string   // the generated deployment token
}

func (f fleet) print(w io.Writer) {
	fmt.Fprintf(w, "pinboard   %s   (registry, proxy; admin %s/metrics)\n", f.Pinboard, f.Admin)
	fmt.Fprintf(w, "console    %s/   (open it in a browser; it asks for the token)\n", f.Admin)
	for i, u := range f.Workers {
		fmt.Fprintf(w, "worker %d   %s   (counter host; reached through the pinboard)\n", i+1, u)
	}
	fmt.Fprintf(w, "token      %s\n\n", f.Token)
	fmt.Fprintf(w, "try:\n  curl -X POST %s/counter/alice/incr\n  curl %s/counter/alice/\n", f.Pinboard, f.Pinboard)
	fmt.Fprintf(w, "  curl -H 'Authorization: Bearer %s' %s/registry/workers\n", f.Token, f.Pinboard)
	fmt.Fprintln(w, "Ctrl-C stops the fleet.")
}

// run starts the pinboard and the workers, calls ready once every worker
// is registered, and runs until ctx ends; then it shuts down (shutdown).
// logger is the components' logger, own the fleet's (the shutdown's lines).
func run(ctx context.Context, o options, logger, own *slog.Logger, ready func(fleet)) (err error) {
	settings, err := pinboard.ParseSettings([]string{"-dev", "-listen", o.listen, "-admin-listen", o.adminListen,
		"-shutdown-timeout", o.shutdownTimeout.String()}, nil, io.Discard)
	if err != nil {
		return err
	}
	pub, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("pinboard: %w", err)
	}
	adm, err := net.Listen("tcp", o.adminListen)
	if err != nil {
		pub.Close()
		return fmt.Errorf("pinboard admin: %w", err)
	}
	pb, err := pinboard.New(pinboard.Config{Settings: settings, Logger: logger, PublicListener: pub, AdminListener: adm})
	if err != nil {
		pub.Close()
		adm.Close()
		return err
	}
	pbCtx, stopPinboard := context.WithCancel(context.Background())
	pbDone := make(chan error, 1)
	go func() { pbDone <- pb.Run(pbCtx) }() // owned by run: joined by shutdown (until its deadline)
	var workers []*fleetWorker
	defer func() {
		err = errors.Join(err, shutdown(workers, stopPinboard, pbDone, o.shutdownTimeout, own))
	}()

	f := fleet{Pinboard: "http://" + pub.Addr().String(), Admin: "http://" + adm.Addr().String(), Token: settings.Tokens[0]}
	for i := range o.workers {
		w, err := startWorker(fmt.Sprintf("w%d", i+1), f.Pinboard, f.Token, logger)
		if err != nil {
			return err
		}
		workers = append(workers, w)
		f.Workers = append(f.Workers, w.url)
	}
	// Registration is a round trip through the pinboard (and its challenge
	// back to the worker): wait for every worker to hold a lease.
	deadline := time.Now().Add(10 * time.Second)
	for _, w := range workers {
		for !w.w.Ready() {
			if time.Now().After(deadline) {
				return fmt.Errorf("worker %s did not register within 10s", w.url)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	if ready != nil {
		ready(f)
	}
	<-ctx.Done()
	return nil
}

// shutdown stops the fleet within timeout: the workers drain in parallel
// while the pinboard still takes their releases (idle instances close and
// release their ids; the rest are aborted at the deadline), then the
// pinboard stops (its own shutdown bounded by the same timeout). If the
// pinboard has not stopped by the deadline, shutdown returns without it
// (the process exits). It logs on log what it waits for, once a second,
// and how long it took.
func shutdown(workers []*fleetWorker, stopPinboard func(), pbDone <-chan error, timeout time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	instances := func() int {
		n := 0
		for _, w := range workers {
			n += w.h.Len()
		}
		return n
	}
	log.Info("shutting down: draining the workers, then the pinboard", "timeout", timeout, "workers", len(workers), "instances", instances())
	var draining, pinboardUp atomic.Int32
	draining.Store(int32(len(workers)))
	pinboardUp.Store(1)
	progress := cmdline.StartShutdownLog(log, deadline, 0, func() []cmdline.Waiting {
		return []cmdline.Waiting{{What: "workers", N: int(draining.Load())}, {What: "instances", N: instances()},
			{What: "pinboard", N: int(pinboardUp.Load())}}
	})
	var wg sync.WaitGroup
	errs := make([]error, len(workers)+1)
	for i, w := range workers {
		wg.Go(func() {
			defer draining.Add(-1)
			errs[i] = w.stop(ctx)
		})
	}
	wg.Wait()
	stopPinboard()
	select {
	case errs[len(workers)] = <-pbDone:
		pinboardUp.Store(0)
	case <-ctx.Done():
		errs[len(workers)] = errors.New("the pinboard did not stop within the shutdown timeout")
	}
	progress.Done("fleet stopped")
	return errors.Join(errs...)
}

// fleetWorker is one counter worker: a worker.Worker, the counter host
// attached to it, and its fasthttp server.
type fleetWorker struct {
	url    string
	w      *worker.Worker
	h      *host.Host
	srv    *fasthttp.Server
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func startWorker(name, pinboardURL, token string, logger *slog.Logger) (*fleetWorker, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	fw := &fleetWorker{url: "http://" + ln.Addr().String()}
	log := logger.With("worker", name)
	fw.w, err = worker.New(worker.Config{PinboardURL: pinboardURL, AdvertiseURL: fw.url, Token: token, Logger: log})
	if err == nil {
		fw.h, err = host.New(host.Config{Namespace: "/counter", Worker: fw.w, Logger: log}, counterapp.Type())
	}
	if err == nil {
		err = fw.h.Start()
	}
	if err != nil {
		ln.Close()
		return nil, err
	}
	r := router.New()
	fw.w.Mount(r) // GET /_pinned/challenge, the pinboard's proof that this URL is this worker
	fw.srv = &fasthttp.Server{
		Handler:     fw.h.Wrap(r.Handler),
		Name:        "pinned-fleet-" + name,
		ReadTimeout: 30 * time.Second,
		// Above the proxy's pooled-connection idle timeout (10 s): the
		// pinboard closes idle connections first.
		IdleTimeout:     2 * time.Minute,
		Logger:          counterapp.ServerLogger(log),
		CloseOnShutdown: true,
	}
	// The server accepts exactly the bodies the host does (413 with a JSON
	// error beyond), the limit the worker tells the pinboard.
	if err := fw.h.ConfigureServer(fw.srv); err != nil {
		ln.Close()
		_ = fw.h.Close(context.Background())
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	fw.cancel = cancel
	fw.done.Go(func() { _ = fw.srv.Serve(ln) })
	fw.done.Go(func() {
		if err := fw.w.Run(ctx); err != nil {
			log.Error("worker stopped", "err", err)
		}
	})
	return fw, nil
}

// stop drains the worker (idle instances close and release their ids; the
// rest are aborted when ctx ends), closes the host and the server, all by
// ctx's deadline.
func (fw *fleetWorker) stop(ctx context.Context) error {
	var errs []error
	if err := fw.w.Shutdown(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := fw.h.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := fw.srv.ShutdownWithContext(ctx); err != nil {
		errs = append(errs, err)
	}
	fw.cancel()
	fw.done.Wait()
	return errors.Join(errs...)
}
