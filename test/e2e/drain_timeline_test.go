package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/test/stack"
)

// timeline records what a drain case's failure must be lined up with:
// every change of the Service's endpoints (address and ready, serving,
// terminating) and of the Revision's pods (address, deleting), looked at
// every 100 ms, and each failed request as it fails. A failed case logs
// it.
type timeline struct {
	t0     time.Time
	mu     sync.Mutex
	events []string
}

func (tl *timeline) add(format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, fmt.Sprintf("%7.3fs ", time.Since(tl.t0).Seconds())+fmt.Sprintf(format, args...))
}

// failed is a loadgen.Options.OnError that records the failure.
func (tl *timeline) failed(kind string) func(error, net.Addr) {
	return func(err error, local net.Addr) {
		tl.add("%s request failed (connection from %v): %v", kind, local, err)
	}
}

func startTimeline(t *testing.T, s *stack.Stack, service, rev string) *timeline {
	tl := &timeline{t0: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		var lastSlices, lastPods string
		for ctx.Err() == nil {
			var slices discoveryv1.EndpointSliceList
			if err := s.Client.List(ctx, &slices, client.InNamespace(appNS), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err == nil {
				var eps []string
				for _, sl := range slices.Items {
					for _, e := range sl.Endpoints {
						c := e.Conditions
						eps = append(eps, fmt.Sprintf("%s[ready=%v serving=%v terminating=%v]", strings.Join(e.Addresses, ","), deref(c.Ready), deref(c.Serving), deref(c.Terminating)))
					}
				}
				if cur := strings.Join(eps, " "); cur != lastSlices {
					tl.add("%s's endpoints: %s", service, cur)
					lastSlices = cur
				}
			}
			var pods corev1.PodList
			if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{servingv1alpha1.RevisionLabelKey: rev}); err == nil {
				var ps []string
				for _, p := range pods.Items {
					state := map[bool]string{false: "up", true: "deleting"}[p.DeletionTimestamp != nil]
					ps = append(ps, p.Name[strings.LastIndex(p.Name, "-")+1:]+"/"+p.Status.PodIP+":"+state)
				}
				if cur := strings.Join(ps, " "); cur != lastPods {
					tl.add("%s's pods: %s", rev, cur)
					lastPods = cur
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			for _, e := range tl.events {
				t.Log(e)
			}
		}
	})
	return tl
}
