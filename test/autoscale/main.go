package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	o, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "autoscale:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "autoscale")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if o.exitOnSIGTERM {
		go func() {
			<-ctx.Done()
			log.Info("SIGTERM: exiting at once")
			os.Exit(0)
		}()
	}
	if err := run(ctx, o, log); err != nil {
		log.Error("exit", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", o.port))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var grpcLn net.Listener
	if o.grpcPort != 0 {
		if grpcLn, err = net.Listen("tcp", fmt.Sprintf(":%d", o.grpcPort)); err != nil {
			_ = ln.Close()
			return fmt.Errorf("listen for gRPC: %w", err)
		}
	}
	return serve(ctx, ln, grpcLn, &app{pod: podName(os.Getenv, os.Hostname), log: log, listening: time.Now()}, o)
}

// parseFlags reads the command line; the port defaults to $PORT (as
// Knative sets it), else 8080.
func parseFlags(args []string, getenv func(string) string, out io.Writer) (options, error) {
	port := 8080
	if p := getenv("PORT"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			return options{}, fmt.Errorf("$PORT %q: want a port number", p)
		}
		port = n
	}
	var o options
	fs := flag.NewFlagSet("autoscale", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.IntVar(&o.port, "port", port, "port to listen on (default: $PORT, else 8080)")
	fs.DurationVar(&o.startupDelay, "startup-delay", 0, "answer 503 on /healthz for this long after start")
	fs.DurationVar(&o.shutdownDelay, "shutdown-delay", 3*time.Second, "after SIGTERM, keep serving (with /healthz at 503) this long before closing the listener")
	// 3s + 25s stays within the pod's default terminationGracePeriodSeconds
	// (30s), so the kubelet's SIGKILL never cuts a drain short.
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 25*time.Second, "then wait at most this long for requests in flight")
	fs.BoolVar(&o.exitOnSIGTERM, "exit-on-sigterm", false, "exit at once on SIGTERM, dropping requests in flight (as most apps do); the delays above are then unused")
	fs.IntVar(&o.grpcPort, "grpc-port", 0, "also serve gRPC over h2c on this port: the Sleep service and the standard health service (0: no gRPC)")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q: autoscale takes flags only", fs.Args())
	}
	if o.port < 1 || o.port > 65535 {
		return options{}, fmt.Errorf("--port %d: want 1 to 65535", o.port)
	}
	switch {
	case o.grpcPort < 0 || o.grpcPort > 65535:
		return options{}, fmt.Errorf("--grpc-port %d: want 1 to 65535, or 0 for no gRPC", o.grpcPort)
	case o.grpcPort == o.port:
		// One listener cannot serve both: HTTP/1.x clients and gRPC's
		// HTTP/2 would need a server that tells them apart.
		return options{}, fmt.Errorf("--grpc-port %d: the HTTP port (--port); gRPC needs a port of its own", o.grpcPort)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"startup-delay", o.startupDelay}, {"shutdown-delay", o.shutdownDelay}, {"drain-timeout", o.drainTimeout}} {
		if d.v < 0 {
			return options{}, fmt.Errorf("--%s %s: want a duration >= 0", d.name, d.v)
		}
	}
	return o, nil
}

// podName is $POD_NAME (the downward API), else the hostname, which is the
// pod's name in Kubernetes too unless the pod sets its own.
func podName(getenv func(string) string, hostname func() (string, error)) string {
	if n := getenv("POD_NAME"); n != "" {
		return n
	}
	if h, err := hostname(); err == nil && h != "" {
		return h
	}
	return "unknown"
}
