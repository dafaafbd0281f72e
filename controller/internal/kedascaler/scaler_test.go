package kedascaler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/controller/internal/kedascaler"
)

// GetMetricSpec names the trigger's metric and its target per pod;
// GetMetrics answers the Source's total for that metric.
func TestMetricSpecAndMetrics(t *testing.T) {
	src := newFakeSource()
	src.set(ns, "web", kedascaler.Load{Concurrency: 250.5, RPS: 731.25, ActivatorConcurrency: 2, LatestConcurrency: 240, Pods: 3})
	src.set(ns, "api.v2", kedascaler.Load{Concurrency: 12, RPS: 40.5, Pods: 1})
	c := startServer(t, src, nil).keda(t)
	for _, tt := range []struct {
		name  string
		md    map[string]string
		want  *pb.MetricSpec
		value float64
	}{
		{"concurrency by default, Knative's target", map[string]string{"deployment": "web"},
			&pb.MetricSpec{MetricName: "sockscale-concurrency-web", TargetSize: 100, TargetSizeFloat: 100}, 250.5},
		{"rps, Knative's target", map[string]string{"deployment": "web", "metric": "rps"},
			&pb.MetricSpec{MetricName: "sockscale-rps-web", TargetSize: 200, TargetSizeFloat: 200}, 731.25},
		{"a target of its own, a dot in the name", map[string]string{"deployment": "api.v2", "metric": "rps", "target": "12.5", "activationTarget": "1"},
			&pb.MetricSpec{MetricName: "sockscale-rps-api-v2", TargetSize: 13, TargetSizeFloat: 12.5}, 40.5},
		{"FromEnv keys, KEDA's own keys", map[string]string{"scalerAddress": "sockscale-keda.sockscale-system:9443", "enableTLS": "true", "unsafeSsl": "false",
			"deploymentFromEnv": "web", "targetFromEnv": "50"},
			&pb.MetricSpec{MetricName: "sockscale-concurrency-web", TargetSize: 50, TargetSizeFloat: 50}, 250.5},
		{"a Deployment never heard of has no load", map[string]string{"deployment": "new"},
			&pb.MetricSpec{MetricName: "sockscale-concurrency-new", TargetSize: 100, TargetSizeFloat: 100}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := c.GetMetricSpec(t.Context(), ref(tt.md))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(&pb.GetMetricSpecResponse{MetricSpecs: []*pb.MetricSpec{tt.want}}, spec, protocmp.Transform()); diff != "" {
				t.Errorf("GetMetricSpec (-want +got):\n%s", diff)
			}
			got, err := c.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: ref(tt.md), MetricName: tt.want.MetricName})
			if err != nil {
				t.Fatal(err)
			}
			want := &pb.GetMetricsResponse{MetricValues: []*pb.MetricValue{{
				MetricName: tt.want.MetricName, MetricValue: int64(math.Ceil(tt.value)), MetricValueFloat: tt.value}}}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("GetMetrics (-want +got):\n%s", diff)
			}
		})
	}
}

// Every bad key is named with its value and what is allowed, by every
// call, before the Source is read.
func TestMetadataRefused(t *testing.T) {
	src := newFakeSource()
	c := startServer(t, src, nil).keda(t)
	calls := map[string]func(ctx context.Context, md map[string]string) error{
		"GetMetricSpec": func(ctx context.Context, md map[string]string) error {
			_, err := c.GetMetricSpec(ctx, ref(md))
			return err
		},
		"GetMetrics": func(ctx context.Context, md map[string]string) error {
			_, err := c.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: ref(md), MetricName: "sockscale-concurrency-web"})
			return err
		},
		"IsActive": func(ctx context.Context, md map[string]string) error {
			_, err := c.IsActive(ctx, ref(md))
			return err
		},
		"StreamIsActive": func(ctx context.Context, md map[string]string) error {
			stream, err := c.StreamIsActive(ctx, ref(md))
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		},
	}
	for _, tt := range []struct {
		name string
		md   map[string]string
		say  []string
	}{
		{"no deployment", map[string]string{"metric": "rps"},
			[]string{`deployment is required: the name of the Deployment to scale, in the ScaledObject's namespace "tenant-a"`}},
		{"not a Deployment's name", map[string]string{"deployment": "Web_1"},
			[]string{`deployment "Web_1": want a Deployment's name: a lowercase RFC 1123 subdomain`}},
		{"unknown metric", map[string]string{"deployment": "web", "metric": "cpu"},
			[]string{`metric "cpu": want "concurrency" (the default: requests in flight) or "rps" (requests per second)`}},
		{"target 0", map[string]string{"deployment": "web", "target": "0"},
			[]string{`target "0": want a number > 0, the requests in flight per pod to aim for (default 100 for concurrency, 200 for rps)`}},
		{"negative rps target", map[string]string{"deployment": "web", "metric": "rps", "target": "-3"},
			[]string{`target "-3": want a number > 0, the requests per second per pod to aim for`}},
		{"target not a number", map[string]string{"deployment": "web", "target": "ten"}, []string{`target "ten": want a number > 0`}},
		{"target NaN", map[string]string{"deployment": "web", "target": "NaN"}, []string{`target "NaN": want a number > 0`}},
		{"target infinite", map[string]string{"deployment": "web", "target": "+Inf"}, []string{`target "+Inf": want a number > 0`}},
		{"target out of range", map[string]string{"deployment": "web", "target": "1e999"}, []string{`target "1e999": want a number > 0`}},
		{"negative activationTarget", map[string]string{"deployment": "web", "activationTarget": "-1"},
			[]string{`activationTarget "-1": want a number >= 0, the requests in flight at or below which the Deployment may rest at zero (default 0)`}},
		{"activationTarget not a number", map[string]string{"deployment": "web", "activationTarget": "x"}, []string{`activationTarget "x": want a number >= 0`}},
		{"another namespace", map[string]string{"deployment": "web", "namespace": "tenant-b"},
			[]string{`namespace "tenant-b": a trigger reads its ScaledObject's own namespace, "tenant-a"; remove the key`}},
		{"another namespace from the environment", map[string]string{"deployment": "web", "namespaceFromEnv": "tenant-b"},
			[]string{`namespaceFromEnv "tenant-b": a trigger reads its ScaledObject's own namespace, "tenant-a"`}},
		{"misspelled key", map[string]string{"deployment": "web", "tagret": "10"},
			[]string{`unknown key "tagret": a sockscale trigger takes deployment, metric, target, activationTarget (each also as <key>FromEnv), besides KEDA's scalerAddress, enableTLS, unsafeSsl, caCert, tlsClientCert, tlsClientKey`}},
		{"key in the wrong case", map[string]string{"deployment": "web", "Target": "10"}, []string{`unknown key "Target": did you mean "target"?`}},
		{"FromEnv key in the wrong case", map[string]string{"DeploymentFromEnv": "web"},
			[]string{`unknown key "DeploymentFromEnv": did you mean "deploymentFromEnv"?`, `deployment is required`}},
		{"a key given twice", map[string]string{"deployment": "web", "target": "10", "targetFromEnv": "20"}, []string{`target and targetFromEnv both given: keep one`}},
		{"every problem at once", map[string]string{"deployment": "web", "metric": "cpu", "target": "0"},
			[]string{`metric "cpu": want`, `target "0": want`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for call, f := range calls {
				err := f(t.Context(), tt.md)
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("%s: %v, want InvalidArgument", call, err)
				}
				for _, say := range tt.say {
					if !strings.Contains(status.Convert(err).Message(), say) {
						t.Errorf("%s: %q does not say %q", call, status.Convert(err).Message(), say)
					}
				}
			}
		})
	}
	if asked := src.askedNamespaces(); len(asked) != 0 {
		t.Errorf("the Source was read for refused metadata: %v", asked)
	}
	// A Deployment that is not there (a typo) is an error KEDA shows, not
	// an idle Deployment; a lookup that fails says so.
	src.mu.Lock()
	src.missing[targetKey{"tenant-a", "webb"}] = true
	src.mu.Unlock()
	for call, f := range calls {
		err := f(t.Context(), map[string]string{"deployment": "webb"})
		if want := `deployment "webb": no such Deployment in namespace "tenant-a"`; status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("%s of a missing Deployment: %v, want NotFound saying %q", call, err, want)
		}
	}
	src.mu.Lock()
	src.lookupErr = errors.New("cache not synced")
	src.mu.Unlock()
	for call, f := range calls {
		if err := f(t.Context(), map[string]string{"deployment": "web"}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "cache not synced") {
			t.Errorf("%s while the lookup fails: %v, want Unavailable with its error", call, err)
		}
	}
	src.mu.Lock()
	src.lookupErr = nil
	src.mu.Unlock()
	noNamespace := &pb.ScaledObjectRef{Name: "web-scaler", ScalerMetadata: map[string]string{"deployment": "web"}}
	if _, err := c.IsActive(t.Context(), noNamespace); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "no namespace") {
		t.Errorf("IsActive without a namespace: %v, want InvalidArgument saying so", err)
	}
}

// The namespace read is the ScaledObject's, which KEDA sends: a tenant
// reads its own Deployment, not another tenant's of the same name.
func TestNamespaceIsTheScaledObjects(t *testing.T) {
	src := newFakeSource()
	src.set("tenant-a", "web", kedascaler.Load{Concurrency: 7})
	src.set("tenant-b", "web", kedascaler.Load{Concurrency: 70})
	c := startServer(t, src, nil).keda(t)
	for _, tt := range []struct {
		namespace string
		want      float64
	}{{"tenant-a", 7}, {"tenant-b", 70}} {
		r := &pb.ScaledObjectRef{Name: "web-scaler", Namespace: tt.namespace, ScalerMetadata: map[string]string{"deployment": "web"}}
		got, err := c.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "sockscale-concurrency-web"})
		if err != nil {
			t.Fatal(err)
		}
		if v := got.GetMetricValues()[0].GetMetricValueFloat(); v != tt.want {
			t.Errorf("ScaledObject in %s: %v, want %v", tt.namespace, v, tt.want)
		}
	}
}

// GetMetrics answers only for the metric the metadata names.
func TestGetMetricsOfAnotherMetricRefused(t *testing.T) {
	c := startServer(t, newFakeSource(), nil).keda(t)
	_, err := c.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: ref(map[string]string{"deployment": "web"}), MetricName: "sockscale-rps-web"})
	if want := `metric "sockscale-rps-web": this trigger's metadata gives "sockscale-concurrency-web"`; status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
		t.Errorf("GetMetrics of another metric: %v, want InvalidArgument saying %q", err, want)
	}
}

// KEDA falls back to GetMetricSpec on Unimplemented.
func TestStreamMetricSpecUnimplemented(t *testing.T) {
	c := startServer(t, newFakeSource(), nil).keda(t)
	stream, err := c.StreamMetricSpec(t.Context(), ref(map[string]string{"deployment": "web"}))
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("StreamMetricSpec: %v, want Unimplemented", err)
	}
}

func TestIsActive(t *testing.T) {
	src := newFakeSource()
	c := startServer(t, src, nil).keda(t)
	for i, tt := range []struct {
		name       string
		load       *kedascaler.Load // nil: never heard of
		inFlight   bool             // WhenActive has fired
		activation string           // activationTarget, "" for the default
		want       bool
	}{
		{"idle", &kedascaler.Load{Pods: 1}, false, "", false},
		{"never heard of", nil, false, "", false},
		{"a request held for a Deployment never heard of", nil, true, "", true},
		{"load in the latest second", &kedascaler.Load{Pods: 1, LatestConcurrency: 0.2}, false, "", true},
		{"a request started this instant", &kedascaler.Load{Pods: 3}, true, "", true},
		{"at activationTarget", &kedascaler.Load{Pods: 2, LatestConcurrency: 5}, true, "5", false},
		{"past activationTarget", &kedascaler.Load{Pods: 2, LatestConcurrency: 5.5}, false, "5", true},
		{"held at zero, under activationTarget", &kedascaler.Load{}, true, "5", true},
		{"held at zero in the latest second", &kedascaler.Load{LatestConcurrency: 0.3}, false, "5", true},
		// Scaled to zero a moment ago: the window still averages the
		// load before, which must not wake it again.
		{"window averages only", &kedascaler.Load{Concurrency: 40, RPS: 90, ActivatorConcurrency: 10}, false, "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			deployment := fmt.Sprintf("d%d", i)
			if tt.load != nil {
				src.set(ns, deployment, *tt.load)
			}
			if tt.inFlight {
				src.start(ns, deployment)
			}
			md := map[string]string{"deployment": deployment}
			if tt.activation != "" {
				md["activationTarget"] = tt.activation
			}
			got, err := c.IsActive(t.Context(), ref(md))
			if err != nil {
				t.Fatal(err)
			}
			if got.GetResult() != tt.want {
				t.Errorf("IsActive = %v, want %v", got.GetResult(), tt.want)
			}
		})
	}
}

// recv is the stream's next answer; it fails the test after a second.
func recv(t *testing.T, stream pb.ExternalScaler_StreamIsActiveClient) bool {
	t.Helper()
	got := make(chan *pb.IsActiveResponse, 1)
	errs := make(chan error, 1)
	go func() {
		r, err := stream.Recv()
		if err != nil {
			errs <- err
			return
		}
		got <- r
	}()
	select {
	case r := <-got:
		return r.GetResult()
	case err := <-errs:
		t.Fatalf("StreamIsActive: %v", err)
	case <-time.After(time.Second):
		t.Fatal("StreamIsActive sent nothing within a second")
	}
	return false
}

// StreamIsActive sends the state at once, true the moment WhenActive
// fires (the clock stands still: no idle check ran), false at the next
// idle check once the Deployment is idle, and true again.
func TestStreamIsActive(t *testing.T) {
	src := newFakeSource()
	src.set(ns, "web", kedascaler.Load{}) // at zero, idle
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	c := startServer(t, src, clk).keda(t)
	stream, err := c.StreamIsActive(t.Context(), ref(map[string]string{"deployment": "web", "activationTarget": "5"}))
	if err != nil {
		t.Fatal(err)
	}
	if recv(t, stream) {
		t.Fatal("first answer true, want false (idle at zero)")
	}
	for round := range 2 {
		fired := time.Now()
		src.start(ns, "web") // a request held at zero
		if !recv(t, stream) {
			t.Fatalf("round %d: false once a request is held, want true", round)
		}
		// A wall-clock bound would make this test flaky on a busy
		// machine: the fake clock not moving shows nothing waited for a
		// check or a poll.
		t.Logf("round %d: true %v after WhenActive fired", round, time.Since(fired))

		src.stop(ns, "web")
		src.set(ns, "web", kedascaler.Load{Pods: 1, Concurrency: 0.5}) // served, idle since
		clk.Step(time.Second)
		if recv(t, stream) {
			t.Fatalf("round %d: true at the idle check after the request, want false", round)
		}
		src.set(ns, "web", kedascaler.Load{Concurrency: 0.5}) // scaled to zero again
	}
}

// In flight but under activationTarget with pods: nothing is sent, and
// the stream does not spin on WhenActive's closed channel; past it at the
// next check, true.
func TestStreamIsActiveUnderActivationTarget(t *testing.T) {
	src := newFakeSource()
	src.set(ns, "web", kedascaler.Load{Pods: 2, LatestConcurrency: 3})
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	c := startServer(t, src, clk).keda(t)
	stream, err := c.StreamIsActive(t.Context(), ref(map[string]string{"deployment": "web", "activationTarget": "5"}))
	if err != nil {
		t.Fatal(err)
	}
	if recv(t, stream) {
		t.Fatal("first answer true, want false (3 in flight, activationTarget 5)")
	}
	src.start(ns, "web")
	before := src.whenActiveCount()
	time.Sleep(100 * time.Millisecond)
	if n := src.whenActiveCount() - before; n > 1 {
		t.Fatalf("WhenActive called %d times in 100 ms while in flight under activationTarget, want at most once", n)
	}
	src.set(ns, "web", kedascaler.Load{Pods: 2, LatestConcurrency: 6})
	clk.Step(time.Second)
	if !recv(t, stream) {
		t.Fatal("false at 6 in flight, activationTarget 5: want true")
	}
}

// One goroutine per open stream, none left once the streams end, and
// none once the server stops with streams open (they end with EOF, on
// which KEDA opens them again).
func TestStreamsLeaveNoGoroutines(t *testing.T) {
	// gRPC starts some goroutines once per process: a first server and
	// client start them before counting.
	warm := startServer(t, newFakeSource(), nil)
	if err := warm.tryIsActive(t, &warm.kedaCert.pair, warm.serverCA.pool()); err != nil {
		t.Fatal(err)
	}
	if err := warm.stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	baseline := runtime.NumGoroutine()

	src := newFakeSource()
	s := startServer(t, src, nil)
	conn := s.dial(t, &s.kedaCert.pair, s.serverCA.pool())
	c := pb.NewExternalScalerClient(conn)
	if _, err := c.IsActive(t.Context(), ref(map[string]string{"deployment": "web"})); err != nil {
		t.Fatal(err)
	}
	connected := runtime.NumGoroutine()

	const streams = 20
	open := func(ctx context.Context) []pb.ExternalScaler_StreamIsActiveClient {
		var all []pb.ExternalScaler_StreamIsActiveClient
		for i := range streams {
			stream, err := c.StreamIsActive(ctx, ref(map[string]string{"deployment": fmt.Sprintf("web-%d", i)}))
			if err != nil {
				t.Fatal(err)
			}
			recv(t, stream)
			all = append(all, stream)
		}
		return all
	}
	ctx, cancel := context.WithCancel(t.Context())
	open(ctx)
	// Each stream: its handler on the server, its watcher in the client.
	if n := runtime.NumGoroutine() - connected; n > 2*streams+2 {
		t.Errorf("%d streams open: %d goroutines more than with none, want about %d", streams, n, 2*streams)
	}
	cancel()
	settleGoroutines(t, connected, "streams ended by KEDA")

	open2 := open(t.Context())
	if err := s.stop(); err != nil {
		t.Errorf("Serve: %v", err)
	}
	for i, stream := range open2 {
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			t.Errorf("stream %d after Serve stopped: %v, want EOF", i, err)
		}
	}
	conn.Close()
	settleGoroutines(t, baseline, "server stopped with streams open")
}
