package kpa

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/collect"
	"github.com/sockscale/sockscale/internal/stats"
)

// TestConcurrentReconciles reconciles many targets on several workers at
// once, as --concurrent-reconciles does (each key on one worker at a time,
// as controller-runtime guarantees), while batches arrive and poke, and
// PodAutoscalers are deleted: run with -race, it checks the state the
// workers share.
func TestConcurrentReconciles(t *testing.T) {
	const targets, workers, rounds = 32, 8, 4
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	var objs []client.Object
	for i := range targets {
		name := fmt.Sprintf("t%d", i)
		one := int32(1)
		objs = append(objs,
			&appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
				Spec:       appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}},
				Status:     appsv1.DeploymentStatus{ReadyReplicas: 1},
			},
			&v1alpha1.PodAutoscaler{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
				Spec: v1alpha1.PodAutoscalerSpec{
					ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
					Service:        v1alpha1.ServiceRef{Name: name},
				},
			})
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.PodAutoscaler{}).WithObjects(objs...).Build()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	col := collector.New(clk)
	r := &PodAutoscaler{Client: c, Collector: col, Clock: clk, Config: config.Defaults, Metrics: NewMetrics(prometheus.NewRegistry())}
	// The collect reconciler registers the windows, as on every replica.
	cr := &collect.Reconciler{Client: c, Collector: col, Config: config.Defaults}
	ctx := context.Background()

	done := make(chan struct{})
	var feed sync.WaitGroup
	feed.Go(func() { // an agent's batches, and the pokes they make
		for {
			select {
			case <-done:
				return
			default:
			}
			b := &stats.Batch{Node: "node-a", Period: time.Second}
			for i := range targets {
				b.Pods = append(b.Pods, stats.PodStat{IP: netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), Namespace: "default",
					Workload: fmt.Sprintf("t%d", i), Concurrency: float64(i), Requests: uint64(i)})
			}
			r.Poke(col.RecordPods(b))
			clk.Step(100 * time.Millisecond)
			time.Sleep(time.Millisecond) // leave the workers the CPU
		}
	})
	feed.Go(func() { // drain pokes as the controller's source would
		for {
			select {
			case <-done:
				return
			case <-r.pokeChannel():
			}
		}
	})

	var work sync.WaitGroup
	errs := make(chan error, targets*rounds)
	for w := range workers {
		work.Go(func() {
			for round := range rounds {
				for i := w; i < targets; i += workers {
					name := fmt.Sprintf("t%d", i)
					if round == rounds-1 && i%4 == 0 { // some PodAutoscalers go
						if err := c.Delete(ctx, &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}); err != nil {
							errs <- err
						}
					}
					req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}
					if _, err := cr.Reconcile(ctx, req); err != nil {
						errs <- fmt.Errorf("collect %s in round %d: %w", name, round, err)
					}
					if _, err := r.Reconcile(ctx, req); err != nil {
						errs <- fmt.Errorf("reconcile %s in round %d: %w", name, round, err)
					}
				}
			}
		})
	}
	work.Wait()
	close(done)
	feed.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if want := targets - targets/4; len(r.targets) != want {
		t.Errorf("%d targets kept, want %d (the deleted ones forgotten)", len(r.targets), want)
	}
	if want := targets - targets/4; col.Len() != want {
		t.Errorf("collector keeps %d targets, want %d", col.Len(), want)
	}
}
