package kedascaler

import (
	"context"
	"math"
	"time"

	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"
)

// idleCheckPeriod is how often an open StreamIsActive looks whether its
// Deployment went idle (or, past activationTarget, busy): the Source's
// LatestConcurrency changes once a second, so looking more often finds
// nothing new. Becoming active does not wait for it (WhenActive).
const idleCheckPeriod = time.Second

// scaler answers KEDA's calls from a Source. StreamMetricSpec is left
// Unimplemented, on which KEDA keeps reading GetMetricSpec: a trigger's
// spec changes only with its metadata, and KEDA asks again then.
type scaler struct {
	pb.UnimplementedExternalScalerServer
	source Source
	clock  clock.WithTicker
	// stop is closed when Serve stops: open streams end (KEDA opens them
	// again, to another replica), so stopping waits for none of them.
	stop <-chan struct{}
}

var _ pb.ExternalScalerServer = (*scaler)(nil)

// trigger parses ref's trigger and checks that its Deployment exists.
func (s *scaler) trigger(ref *pb.ScaledObjectRef) (trigger, error) {
	t, err := parseTrigger(ref)
	if err != nil {
		return trigger{}, err
	}
	ok, err := s.source.Exists(t.namespace, t.deployment)
	switch {
	case err != nil:
		return trigger{}, status.Errorf(codes.Unavailable, "look up deployment %q in namespace %q: %v", t.deployment, t.namespace, err)
	case !ok:
		return trigger{}, status.Errorf(codes.NotFound, "deployment %q: no such Deployment in namespace %q (the trigger's metadata key deployment names the Deployment whose load counts)", t.deployment, t.namespace)
	}
	return t, nil
}

// GetMetricSpec says the trigger's metric and its target per pod.
func (s *scaler) GetMetricSpec(_ context.Context, ref *pb.ScaledObjectRef) (*pb.GetMetricSpecResponse, error) {
	t, err := s.trigger(ref)
	if err != nil {
		return nil, err
	}
	return &pb.GetMetricSpecResponse{MetricSpecs: []*pb.MetricSpec{{
		MetricName:      t.metricName(),
		TargetSize:      deprecatedInt(t.target),
		TargetSizeFloat: t.target,
	}}}, nil
}

// GetMetrics says the Deployment's total of the trigger's metric. A
// Deployment never heard of has no load: a new one that has served
// nothing yet reads 0, not an error that would stop KEDA from scaling it
// (one that does not exist is an error).
func (s *scaler) GetMetrics(_ context.Context, req *pb.GetMetricsRequest) (*pb.GetMetricsResponse, error) {
	t, err := s.trigger(req.GetScaledObjectRef())
	if err != nil {
		return nil, err
	}
	if name := req.GetMetricName(); name != t.metricName() {
		return nil, status.Errorf(codes.InvalidArgument, "metric %q: this trigger's metadata gives %q (GetMetricSpec)", name, t.metricName())
	}
	load, _ := s.source.Target(t.namespace, t.deployment)
	v := t.value(load)
	return &pb.GetMetricsResponse{MetricValues: []*pb.MetricValue{{
		MetricName:       t.metricName(),
		MetricValue:      deprecatedInt(v),
		MetricValueFloat: v,
	}}}, nil
}

// IsActive says whether the Deployment should have at least one pod
// (trigger.active).
func (s *scaler) IsActive(_ context.Context, ref *pb.ScaledObjectRef) (*pb.IsActiveResponse, error) {
	t, err := s.trigger(ref)
	if err != nil {
		return nil, err
	}
	return &pb.IsActiveResponse{Result: s.active(t, false)}, nil
}

// StreamIsActive sends IsActive's answer at once, then again each time
// it changes: true the moment WhenActive fires (a request held at zero
// wakes its Deployment without waiting for KEDA's polling interval),
// false at the first idle check that finds it idle. It runs in the
// stream's own goroutine, until KEDA ends the stream or Serve stops.
func (s *scaler) StreamIsActive(ref *pb.ScaledObjectRef, stream grpc.ServerStreamingServer[pb.IsActiveResponse]) error {
	t, err := s.trigger(ref)
	if err != nil {
		return err
	}
	idleCheck := s.clock.NewTicker(idleCheckPeriod)
	defer idleCheck.Stop()
	last := s.active(t, false)
	if err := stream.Send(&pb.IsActiveResponse{Result: last}); err != nil {
		return err
	}
	watch := true
	for {
		// Only an inactive Deployment waits on WhenActive: an active one's
		// channel would be closed at every turn.
		var wake <-chan struct{}
		if !last && watch {
			wake = s.source.WhenActive(t.namespace, t.deployment)
		}
		woke := false
		select {
		case <-stream.Context().Done():
			return nil
		case <-s.stop:
			return nil
		case <-idleCheck.C():
			watch = true
		case <-wake:
			woke = true
		}
		now := s.active(t, woke)
		if woke && !now {
			// In flight but not past activationTarget: the channel stays
			// closed while anything is in flight, so look again at the
			// next check instead of at once.
			watch = false
		}
		if now != last {
			if err := stream.Send(&pb.IsActiveResponse{Result: now}); err != nil {
				return err
			}
			last = now
		}
	}
}

// active reads the Source once for t; woke says WhenActive has fired
// already, else it is asked whether anything is in flight this instant.
func (s *scaler) active(t trigger, woke bool) bool {
	inFlight := woke
	if !inFlight {
		select {
		case <-s.source.WhenActive(t.namespace, t.deployment):
			inFlight = true
		default:
		}
	}
	load, _ := s.source.Target(t.namespace, t.deployment)
	return t.active(load, inFlight)
}

// deprecatedInt is v for the protocol's deprecated integer fields, which
// KEDA reads only when the float field is 0: rounded up, so that any load
// reads as some load; 0 for a value that is not a positive number.
func deprecatedInt(v float64) int64 {
	const maxExact = 1 << 53 // float64 holds every integer up to here
	if !(v > 0) {
		return 0
	}
	return int64(math.Ceil(min(v, maxExact)))
}
