package kpa

import (
	"testing"
	"time"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
)

// TestScaleToZeroTimeline replays a target's life with explicit time:
// defaults (stable window 60 s, grace 30 s, retention 0).
func TestScaleToZeroTimeline(t *testing.T) {
	s, err := config.Effective(config.Defaults(), 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	probeOK := true
	probes := 0
	var z zeroState
	step := func(at time.Duration, want, current, ready int32, mode v1alpha1.Mode) zeroOutcome {
		t.Helper()
		return z.apply(zeroInputs{now: t0.Add(at), want: want, current: current, ready: ready, mode: mode, s: s, reachable: true,
			progressDeadline: 600 * time.Second, activatorInPath: func() bool { probes++; return probeOK }})
	}
	expect := func(got zeroOutcome, pods int32, reason string) {
		t.Helper()
		if got.pods != pods || got.reason != reason {
			t.Fatalf("got %d pods (%s: %s), want %d (%s)", got.pods, got.reason, got.message, pods, reason)
		}
	}
	serve, proxy := v1alpha1.ModeServe, v1alpha1.ModeProxy

	expect(step(0, 1, 1, 1, serve), 1, ReasonActive)
	// Idle 10 s after the first pod was ready: active less than a stable
	// window, so it stays although the decision wants 0.
	expect(step(10*time.Second, 0, 1, 1, proxy), 1, ReasonWaitingToScaleDown)
	// At 60 s a stable window has passed, but it has been idle only 50 s
	// ... which is past the grace period and in Proxy since 10 s: goes,
	// once the probe finds the activator.
	probeOK = false
	expect(step(60*time.Second, 0, 1, 1, proxy), 1, ReasonWaitingForActivator)
	probeOK = true
	expect(step(62*time.Second, 0, 1, 1, proxy), 0, ReasonNoTraffic)
	expect(step(64*time.Second, 0, 0, 0, proxy), 0, ReasonNoTraffic)
	if probes != 2 {
		t.Errorf("probed %d times, want 2 (only when the last pod is about to go)", probes)
	}

	// Load comes back: a scale from zero, no pod ready yet.
	expect(step(100*time.Second, 2, 0, 0, proxy), 2, ReasonActivating)
	expect(step(102*time.Second, 2, 2, 0, proxy), 2, ReasonActivating)
	// Pods never become ready: given up after 600 s + 30 s.
	expect(step(700*time.Second, 2, 2, 0, proxy), 2, ReasonActivating)
	expect(step(733*time.Second, 2, 2, 0, proxy), 0, ReasonActivationTimeout)
}

func TestScaleToZeroNeedsTheActivatorInThePath(t *testing.T) {
	base, _ := config.Effective(config.Defaults(), 0, nil, nil)
	t0 := time.Unix(1_700_000_000, 0)
	retention := func(s *config.Settings) { s.ScaleToZeroPodRetentionPeriod = 5 * time.Minute }
	tests := []struct {
		name   string
		mutate func(*config.Settings)
		mode   v1alpha1.Mode
		probe  bool
		reach  reach
		want   int32
		reason string
	}{
		{"Serve mode (no activator): the last pod stays", nil, v1alpha1.ModeServe, true, reach{ok: true}, 1, ReasonWaitingForActivator},
		{"Proxy but the probe fails: stays", nil, v1alpha1.ModeProxy, false, reach{ok: true}, 1, ReasonWaitingForActivator},
		{"Proxy and probe answered: goes", nil, v1alpha1.ModeProxy, true, reach{ok: true}, 0, ReasonNoTraffic},
		{"TBC -1: Proxy is enough without a probe", func(s *config.Settings) { s.TargetBurstCapacity = -1 }, v1alpha1.ModeProxy, false, reach{ok: true}, 0, ReasonNoTraffic},
		{"retention 5 min holds the last pod", retention, v1alpha1.ModeProxy, true, reach{ok: true}, 1, ReasonWaitingToScaleDown},
		// Knative: an unreachable target keeps no pod for the retention.
		{"unreachable: retention does not hold", retention, v1alpha1.ModeProxy, true, reach{}, 0, ReasonNoTraffic},
		{"unreachable with its Service: still needs the activator", nil, v1alpha1.ModeServe, true, reach{}, 1, ReasonWaitingForActivator},
		// No public Service: no request can come, no activator is needed.
		{"no public Service: goes without the activator", nil, v1alpha1.ModeServe, false, reach{noPath: true}, 0, ReasonNoTraffic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			if tt.mutate != nil {
				tt.mutate(&s)
			}
			// Active long ago, idle for 2 minutes.
			z := zeroState{activeSince: t0.Add(-time.Hour), inactiveSince: t0.Add(-2 * time.Minute), proxySince: t0.Add(-2 * time.Minute)}
			got := z.apply(zeroInputs{now: t0, want: 0, current: 1, ready: 1, mode: tt.mode, s: s, progressDeadline: time.Minute,
				reachable: tt.reach.ok, noPath: tt.reach.noPath,
				activatorInPath: func() bool { return tt.probe }})
			if got.pods != tt.want || got.reason != tt.reason {
				t.Errorf("got %d pods (%s: %s), want %d (%s)", got.pods, got.reason, got.message, tt.want, tt.reason)
			}
		})
	}
}
