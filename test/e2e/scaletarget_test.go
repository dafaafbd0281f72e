package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EStatefulSetTarget: a PodAutoscaler scales a StatefulSet through
// its /scale, its pods found by the /scale's selector and counted by the
// agents as the StatefulSet's:
//
//   - a request at zero is held by an activator, the StatefulSet scaled
//     0 -> 1, and answered by its pod <name>-0;
//   - 14 requests in flight at a target of 10 (7 per pod) bring a second
//     pod, <name>-1;
//   - idle, it goes back to zero.
func TestE2EStatefulSetTarget(t *testing.T) {
	t.Parallel() // with the package's other parallel scenarios, after the rest: it has its own app
	s := up(t)
	ctx := context.Background()
	const name = "sts"
	url := deployUnready(t, s, stack.App{Name: name, StatefulSet: true, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.InitialScale, p.MinScale, p.MaxScale = ptr.To(int32(0)), ptr.To(int32(0)), ptr.To(int32(3))
		p.Target = ptr.To(10.0)
		p.TargetBurstCapacity = ptr.To(0.0)
		p.Window = &metav1.Duration{Duration: 10 * time.Second}
	}})
	sts := func() (wanted, ready int32) {
		t.Helper()
		var st appsv1.StatefulSet
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &st); err != nil {
			t.Fatal(err)
		}
		return ptr.Deref(st.Spec.Replicas, 1), st.Status.ReadyReplicas
	}

	cold := get(oneShotClient(2*time.Minute), url+"?sleep=0")
	if cold.err != nil || cold.code != 200 || podOf(cold.body) != name+"-0" {
		t.Fatalf("a request at zero: %v, want it answered by %s-0", cold, name)
	}
	t.Logf("a request at zero woke the StatefulSet: answered by %s after %s (%s %s)", podOf(cold.body), cold.took.Round(time.Millisecond),
		v1alpha1.ColdStartHeader, cold.header.Get(v1alpha1.ColdStartHeader))

	load := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: 14, KeepAlive: false})
	start := time.Now()
	e2etest.Eventually(t, 2*time.Minute, "2 ready pods at 14 in flight", func() error {
		if wanted, ready := sts(); ready < 2 {
			return fmt.Errorf("StatefulSet wants %d, %d ready: %s", wanted, ready, paLine(t, s, name))
		}
		return nil
	})
	t.Logf("14 in flight: 2 ready pods after %s: %s", time.Since(start).Round(time.Second), paLine(t, s, name))
	r := load.Stop()
	if r.Failed > 0 {
		t.Errorf("%d of %d requests failed; the first: %v", r.Failed, r.Completed+r.Failed, r.FirstError)
	}
	idle := time.Now()
	e2etest.Eventually(t, 3*time.Minute, "back to zero", func() error {
		if wanted, ready := sts(); wanted != 0 || ready != 0 {
			return fmt.Errorf("StatefulSet wants %d, %d ready: %s", wanted, ready, paLine(t, s, name))
		}
		return nil
	})
	t.Logf("idle: zero after %s", time.Since(idle).Round(time.Second))
}
