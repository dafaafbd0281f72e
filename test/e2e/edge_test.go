package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EKeptAliveClientsLeaveTheActivators: 16 HTTP/1.1 clients that
// keep their connections alive connect to a target at zero, so every
// connection is an activator's; they are held through the cold start and
// answered. Once the target is in Serve (TBC 0), each activator answers
// a kept-alive client's next request with Connection: close, and the
// client's next connection goes to the pods: from 10 s after Serve on,
// none of their requests goes through an activator, and none failed.
func TestE2EKeptAliveClientsLeaveTheActivators(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name, clients = "leave", 16
	url := deployUnready(t, s, stack.App{Name: name, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.InitialScale, p.MinScale, p.MaxScale = ptr.To(int32(0)), ptr.To(int32(0)), ptr.To(int32(2))
		p.TargetBurstCapacity = ptr.To(0.0)
	}})
	load := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=20"}, Concurrency: clients, KeepAlive: true, Spans: true})
	defer load.Stop()
	e2etest.Eventually(t, 2*time.Minute, name+" in Serve", func() error {
		pa, err := s.PA(ctx, appNS, name)
		if err != nil {
			return err
		}
		if pa.Status.Mode != v1alpha1.ModeServe {
			return fmt.Errorf("mode %q (%s)", pa.Status.Mode, pa.Status.ModeReason)
		}
		return nil
	})
	serve := time.Now()
	forwarded := func() float64 {
		t.Helper()
		of := func(result string) float64 {
			_, sum, err := activatorSum(ctx, s, "sockscale_activator_hold_results_total", map[string]string{"namespace": appNS, "name": name, "result": result})
			if err != nil {
				t.Fatal(err)
			}
			return sum
		}
		return of("forwarded") - of("pod_unreachable")
	}
	atServe := forwarded()
	time.Sleep(10 * time.Second)
	from, before := time.Now(), forwarded()
	time.Sleep(5 * time.Second)
	after, to := forwarded(), time.Now()
	r := load.Stop()
	var inWindow int
	for _, sp := range r.Spans {
		if !sp.Start.Before(from) && sp.End.Before(to) {
			inWindow++
		}
	}
	t.Logf("%d kept-alive clients: %d answered, %d failed; the activators forwarded %v by Serve, %v in the 10 s after it, %v of the %d answered between %s and %s after it",
		clients, r.Completed, r.Failed, atServe, before-atServe, after-before, inWindow, from.Sub(serve).Round(100*time.Millisecond), to.Sub(serve).Round(100*time.Millisecond))
	if atServe == 0 {
		t.Errorf("the activators forwarded nothing before Serve: the clients did not connect to them at zero")
	}
	if inWindow == 0 || after-before != 0 {
		t.Errorf("from 10 s after Serve: %v of %d requests through the activators, want 0 of some", after-before, inWindow)
	}
	if r.Failed > 0 {
		t.Errorf("%d of %d requests failed; the first: %v", r.Failed, r.Completed+r.Failed, r.FirstError)
	}
}
