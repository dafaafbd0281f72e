package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// app serves the work endpoint and the readiness endpoint.
type app struct {
	pod string
	log *slog.Logger
	// ready is false while starting (--startup-delay) and again once
	// draining, so /healthz tells the kubelet, and through it every
	// endpoints consumer, to stop sending new requests.
	ready    atomic.Bool
	inFlight atomic.Int64
	// listening is when the listener opened (zero: unknown, no
	// ListeningForHeader).
	listening time.Time
	// health is the gRPC health service's state when --grpc-port serves
	// gRPC (nil otherwise): it follows ready, for the kubelet's gRPC
	// probes.
	health *health.Server
}

// setReady sets readiness for /healthz and, with gRPC on, the health
// service's overall status ("").
func (a *app) setReady(ready bool) {
	a.ready.Store(ready)
	if a.health == nil {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	a.health.SetServingStatus("", st)
}

// InFlightHeader is the answer's header that says how many requests the
// pod had in flight when this one started, itself included: the most
// any answer says is the most the pod ever served at once (a
// containerConcurrency check needs no other bookkeeping).
const InFlightHeader = "X-In-Flight"

// ListeningForHeader is the answer's header that says how long the pod's
// listener had been open when this request arrived, in whole
// microseconds. On a pod's first answer after a cold start it is the time
// from the moment the app could take a request to the moment one came:
// what whoever held the request (the activator) took to notice the pod
// and send it on.
const ListeningForHeader = "X-Listening-For"

func (a *app) handler() http.Handler {
	mux := http.NewServeMux()
	// "GET /{$}": exactly "/"; other paths get 404 and other methods 405
	// from the mux. GET patterns also match HEAD.
	mux.HandleFunc("GET /{$}", a.serveWork)
	mux.HandleFunc("GET /healthz", a.serveHealth)
	return mux
}

// serveWork does what the query asks, in this order: bloat (the memory
// stays allocated until the response is written, so it counts for the
// whole request), prime, then sleep.
func (a *app) serveWork(w http.ResponseWriter, r *http.Request) {
	if !a.listening.IsZero() {
		w.Header().Set(ListeningForHeader, strconv.FormatInt(time.Since(a.listening).Microseconds(), 10))
	}
	w.Header().Set(InFlightHeader, strconv.FormatInt(a.inFlight.Add(1), 10))
	defer a.inFlight.Add(-1)

	wk, err := parseWork(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var did []string
	var mem []byte
	if wk.bloatMB > 0 {
		mem = bloat(wk.bloatMB)
		did = append(did, fmt.Sprintf("allocated %d MB", wk.bloatMB))
	}
	if wk.prime > 0 {
		n, largest := primes(wk.prime)
		did = append(did, fmt.Sprintf("found %d primes up to %d, the largest %d", n, wk.prime, largest))
	}
	if wk.sleep > 0 {
		if err := sleep(r.Context(), wk.sleep); err != nil {
			return // the client went away: nobody to answer
		}
		did = append(did, fmt.Sprintf("slept %s", wk.sleep))
	}
	if len(did) == 0 {
		did = append(did, "did nothing (ask with ?sleep=100&prime=10000&bloat=10)")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "pod %s: %s\n", a.pod, strings.Join(did, "; "))
	runtime.KeepAlive(mem)
}

func (a *app) serveHealth(w http.ResponseWriter, _ *http.Request) {
	if !a.ready.Load() {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// options are the command line's settings.
type options struct {
	port int
	// startupDelay: /healthz answers 503 this long after start, like an
	// application that loads before it can serve.
	startupDelay time.Duration
	// shutdownDelay: after SIGTERM, keep serving (with /healthz at 503)
	// this long before closing the listener, so endpoints and proxies stop
	// routing new connections here before they would be refused.
	shutdownDelay time.Duration
	// drainTimeout: then wait at most this long for requests in flight.
	drainTimeout time.Duration
	// exitOnSIGTERM: exit as soon as SIGTERM comes, dropping whatever is
	// in flight, as most apps (and Knative's autoscale sample) do: the
	// platform has to drain them.
	exitOnSIGTERM bool
	// grpcPort serves gRPC over h2c (the Sleep service and the health
	// service) on a port of its own; 0: no gRPC.
	grpcPort int
}

// serve runs the HTTP server on ln, and the gRPC server on grpcLn unless
// it is nil, until ctx is done (SIGTERM), then drains: readiness 503
// (and NOT_SERVING), shutdownDelay, and a graceful shutdown of both that
// waits for requests and calls in flight up to drainTimeout. It returns
// an error if any were cut off.
func serve(ctx context.Context, ln, grpcLn net.Listener, a *app, o options) error {
	srv := &http.Server{Handler: a.handler(), ReadHeaderTimeout: 10 * time.Second}
	// Each server's Serve sends its end here: before the drain stops
	// them, any end is a failure.
	errc := make(chan error, 2)
	servers := 1
	go func() { errc <- fmt.Errorf("serve: %w", srv.Serve(ln)) }()
	var gs *grpc.Server
	if grpcLn != nil {
		gs = a.grpcServer()
		servers++
		go func() {
			// Serve returns nil only once stopped.
			errc <- fmt.Errorf("serve gRPC: %w", cmp.Or(gs.Serve(grpcLn), grpc.ErrServerStopped))
		}()
	}

	startup := time.NewTimer(o.startupDelay)
	defer startup.Stop()
	select {
	case <-startup.C:
		a.setReady(true)
		a.log.Info("ready", "pod", a.pod, "address", ln.Addr().String(), "grpc", grpcLn != nil)
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}

	a.setReady(false)
	a.log.Info("draining", "inFlight", a.inFlight.Load(), "shutdownDelay", o.shutdownDelay, "drainTimeout", o.drainTimeout)
	select {
	case <-time.After(o.shutdownDelay):
	case err := <-errc:
		return err
	}
	dctx, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
	defer cancel()
	// gRPC's graceful stop has no deadline of its own: it runs beside
	// the HTTP server's, and Stop cuts it off at the same deadline.
	gstopped := make(chan struct{})
	if gs != nil {
		go func() { gs.GracefulStop(); close(gstopped) }()
	}
	err := srv.Shutdown(dctx)
	if gs != nil && err == nil {
		select {
		case <-gstopped:
		case <-dctx.Done():
			err = dctx.Err()
		}
	}
	if err != nil {
		left := a.inFlight.Load()
		// Cut off what is left, so the process can exit.
		_ = srv.Close()
		if gs != nil {
			gs.Stop() // GracefulStop returns too
			<-gstopped
		}
		return fmt.Errorf("drain: %d requests still in flight after %s: %w", left, o.drainTimeout, err)
	}
	for range servers {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
	}
	a.log.Info("drained")
	return nil
}
