package kpa_test

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/collect"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

const activatorNS = "sockscale-system"

// TestIntegrationScenarios replays the autoscaling scenarios
// (docs/autoscaling.md, "Scenarios the tests replay") against a real
// kube-apiserver: both reconcilers, scripted per-second stats and a
// controlled clock. The test plays the parts no controller-manager plays
// here: a Deployment's pods become ready as soon as they are asked for,
// and its private Service's EndpointSlice lists them.
func TestIntegrationScenarios(t *testing.T) {
	cl := testenv.ControlPlane(t)
	createActivators(t, cl.Client, 3)

	t.Run("step load follows 1-2-3-4 pods within the band", func(t *testing.T) {
		// target 10 x 70 % = 7 concurrent requests per pod.
		r := newRig(t, cl, "step", func(s *v1alpha1.PodAutoscalerSpec) { s.Target = ptr.To(10.0); s.MinScale = ptr.To(int32(1)) })
		for _, offered := range []float64{7, 14, 21, 28} {
			r.offered = offered
			for range 45 { // 90 s per step
				r.tick()
				// The step-load band (docs/autoscaling.md): floor(load/targetValue) - 1 .. ceil(ceil(load/targetValue) * 1.1).
				lo, hi := int32(math.Floor(offered/7))-1, int32(math.Ceil(math.Ceil(offered/7)*1.1))
				if got := r.replicas(); got < lo || got > hi {
					t.Fatalf("%s: at %v in flight the target has %d pods, outside [%d, %d]", r.elapsed(), offered, got, lo, hi)
				}
			}
			if got, want := r.replicas(), int32(offered/7); got != want {
				t.Errorf("after 90 s at %v in flight: %d pods, want %d", offered, got, want)
			}
		}
		// Default TBC 211 with 4 pods of 10: EBC = 40 - 211 - 28 < 0, so the
		// activators stay in the path.
		r.expectPublic(v1alpha1.ModeProxy, 3)
	})

	t.Run("a min-scale window raises the floor while it applies", func(t *testing.T) {
		// The rig's clock starts on Tuesday 2023-11-14 at 22:13:20 UTC.
		r := newRig(t, cl, "window", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Target = ptr.To(10.0)
			s.Window = &metav1.Duration{Duration: 6 * time.Second}
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: []v1alpha1.MinScaleWindow{
				{Name: "weekend", Days: []v1alpha1.Weekday{"Sat", "Sun"}, Start: "00:00", End: "24:00", MinScale: 5},
				{Name: "late-shift", Days: []v1alpha1.Weekday{"Tue"}, Start: "22:14", End: "22:16", MinScale: 3},
			}}
		})
		r.offered = 1
		r.run(30 * time.Second) // to 22:13:50
		if pa := r.pa(); r.replicas() != 1 || pa.Status.MinScaleWindow != "" {
			t.Fatalf("%s, before the window: %d pods, window %q; want 1, none", r.clk.Now().UTC().Format("Mon 15:04:05"), r.replicas(), pa.Status.MinScaleWindow)
		}
		r.run(14 * time.Second) // into 22:14
		if pa := r.pa(); r.replicas() != 3 || pa.Status.MinScaleWindow != "late-shift" {
			t.Fatalf("%s, in the window: %d pods, window %q; want 3, late-shift: %+v", r.clk.Now().UTC().Format("Mon 15:04:05"), r.replicas(), pa.Status.MinScaleWindow, pa.Status.Conditions)
		}
		r.run(150 * time.Second) // past 22:16
		if pa := r.pa(); r.replicas() != 1 || pa.Status.MinScaleWindow != "" {
			t.Errorf("%s, after the window: %d pods, window %q; want 1 again, none", r.clk.Now().UTC().Format("Mon 15:04:05"), r.replicas(), pa.Status.MinScaleWindow)
		}
	})

	t.Run("a burst panics and panic never scales down", func(t *testing.T) {
		r := newRig(t, cl, "burst", func(s *v1alpha1.PodAutoscalerSpec) { s.Target = ptr.To(10.0); s.MinScale = ptr.To(int32(1)) })
		r.offered = 7
		r.run(70 * time.Second)
		if got := r.replicas(); got != 1 {
			t.Fatalf("steady at 7: %d pods, want 1", got)
		}
		r.offered = 35 // 5 pods' worth: 5/1 >= 200 % => panic
		r.run(6 * time.Second)
		pa := r.pa()
		if !pa.Status.Panicking || r.replicas() != 5 {
			t.Fatalf("after a burst to 35: panicking=%v with %d pods, want panic with 5", pa.Status.Panicking, r.replicas())
		}
		burstEnd := r.clk.Now()
		r.offered = 7
		for r.clk.Now().Sub(burstEnd) < 50*time.Second {
			r.tick()
			if got := r.replicas(); got < 5 {
				t.Fatalf("%s after the burst ended: scaled down to %d pods while panicking", r.clk.Now().Sub(burstEnd), got)
			}
		}
		r.run(90 * time.Second)
		if pa := r.pa(); pa.Status.Panicking || r.replicas() != 1 {
			t.Errorf("long after the burst: panicking=%v with %d pods, want 1 pod out of panic", pa.Status.Panicking, r.replicas())
		}
	})

	t.Run("scale-down delay holds the count", func(t *testing.T) {
		r := newRig(t, cl, "delay", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Target = ptr.To(10.0)
			s.MinScale = ptr.To(int32(1))
			s.ScaleDownDelay = &metav1.Duration{Duration: 30 * time.Second}
			s.Window = &metav1.Duration{Duration: 6 * time.Second}
		})
		r.offered = 28
		r.run(60 * time.Second)
		if got := r.replicas(); got != 4 {
			t.Fatalf("at 28 in flight: %d pods, want 4", got)
		}
		drop := r.clk.Now()
		r.offered = 7
		for r.clk.Now().Sub(drop) < 28*time.Second { // 4 was last wanted at the drop: held 30 s
			r.tick()
			if got := r.replicas(); got != 4 {
				t.Fatalf("%s after the load dropped: %d pods, want 4 for the delay", r.clk.Now().Sub(drop), got)
			}
		}
		r.run(40 * time.Second)
		if got := r.replicas(); got != 1 {
			t.Errorf("after the delay: %d pods, want 1", got)
		}
	})

	t.Run("TBC 7 with target 10 settles at 2 pods served directly", func(t *testing.T) {
		// Knative's version sets containerConcurrency 10 (the same
		// numbers); here that would keep the activators in the path (the
		// next case).
		r := newRig(t, cl, "tbc", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Target = ptr.To(10.0)
			s.TargetBurstCapacity = ptr.To(7.0)
			s.MinScale = ptr.To(int32(1))
		})
		// 12 in flight: ceil(12/7) = 2 pods; EBC = 2*10 - 7 - 12 = 1 >= 0.
		r.offered = 12
		r.run(90 * time.Second)
		if got := r.replicas(); got != 2 {
			t.Errorf("%d pods, want 2", got)
		}
		r.expectPublic(v1alpha1.ModeServe, 2)
		r.expectModeReason("Serving")
	})

	t.Run("CC 10 keeps the activators in the path, even with TBC 0", func(t *testing.T) {
		r := newRig(t, cl, "cc10", func(s *v1alpha1.PodAutoscalerSpec) {
			s.ContainerConcurrency = 10
			s.TargetBurstCapacity = ptr.To(0.0)
			s.MinScale = ptr.To(int32(1))
		})
		// 12 in flight: ceil(12/7) = 2 pods, EBC 0 (TBC 0), which
		// would be Serve without the limit; max(2, ceil(2 x 7 / 100))
		// = 2 activators.
		r.offered = 12
		r.run(90 * time.Second)
		if got := r.replicas(); got != 2 {
			t.Errorf("%d pods, want 2", got)
		}
		r.expectPublic(v1alpha1.ModeProxy, 2)
		r.expectModeReason("ContainerConcurrency")
	})

	t.Run("TBC -1 keeps the activators in the path", func(t *testing.T) {
		r := newRig(t, cl, "always-proxy", func(s *v1alpha1.PodAutoscalerSpec) {
			s.TargetBurstCapacity = ptr.To(-1.0)
			s.MinScale = ptr.To(int32(2))
		})
		r.offered = 1
		r.run(20 * time.Second)
		// 2 ready pods of 100, TBC -1: ceil((200 + 0) / 100) = 2 activators.
		r.expectPublic(v1alpha1.ModeProxy, 2)
	})

	t.Run("CC 1 puts one activator in the path", func(t *testing.T) {
		r := newRig(t, cl, "cc1", func(s *v1alpha1.PodAutoscalerSpec) {
			s.ContainerConcurrency = 1
			s.MinScale = ptr.To(int32(2))
		})
		r.offered = 1
		r.run(20 * time.Second)
		// TBC 211 wants ceil((2 x 0.7 + 211) / 100) = 3 of the 3 ready
		// activators; each pod has one slot, so one activator owns them all.
		r.expectPublic(v1alpha1.ModeProxy, 1)
	})

	t.Run("the private Service is headless", func(t *testing.T) {
		r := newRig(t, cl, "headless", func(s *v1alpha1.PodAutoscalerSpec) { s.MinScale = ptr.To(int32(1)) })
		r.run(4 * time.Second)
		var svc corev1.Service
		if err := cl.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: names.PrivateServiceName("headless")}, &svc); err != nil {
			t.Fatal(err)
		}
		// Nothing dials it; a cluster IP would cost an address and an IP
		// allocation in the API server per target.
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.Selector["app"] != "headless" || len(svc.Spec.Ports) == 0 {
			t.Errorf("private Service clusterIP %q selector %v ports %v: want headless, selecting the target's pods, with the public ports",
				svc.Spec.ClusterIP, svc.Spec.Selector, svc.Spec.Ports)
		}
	})

	t.Run("an agent that stops reporting does not read as idle", func(t *testing.T) {
		// target 10 x 70 % = 7 per pod; 28 in flight => 4 pods, 2 on each node.
		r := newRig(t, cl, "agent-down", func(s *v1alpha1.PodAutoscalerSpec) { s.Target = ptr.To(10.0); s.MinScale = ptr.To(int32(1)) })
		r.offered = 28
		r.run(90 * time.Second)
		if got := r.replicas(); got != 4 {
			t.Fatalf("at 28 in flight: %d pods, want 4", got)
		}
		// node-b's agent crashes; its 2 pods keep serving their half. 2 of
		// 4 heard is under Knative's sample size (4 of 4), so the windows
		// hold: read as idle, the target would drop to 2 pods.
		r.nodeBDown = true
		for end := r.clk.Now().Add(3 * time.Minute); r.clk.Now().Before(end); {
			r.tick()
			if got := r.replicas(); got != 4 {
				t.Fatalf("%s after node-b's agent stopped: %d pods, want 4", r.elapsed(), got)
			}
		}
		cond := assertCondition(t, cl.Client, "agent-down", names.ConditionReady, kpa.ReasonStatsMissing)
		if !strings.Contains(cond.Message, "2 of the 4 ready pods (node node-b)") {
			t.Errorf("message %q does not say which pods and node", cond.Message)
		}
		// The agent is back: the target is decided on its stats again.
		r.nodeBDown = false
		r.offered = 14
		r.run(90 * time.Second)
		if got := r.replicas(); got != 2 {
			t.Errorf("with node-b back at 14 in flight: %d pods, want 2", got)
		}
		assertCondition(t, cl.Client, "agent-down", names.ConditionReady, "Scaled")
	})

	t.Run("a target no traffic can reach is held by neither min-scale nor the delay", func(t *testing.T) {
		r := newRig(t, cl, "unreachable", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScale = ptr.To(int32(3))
			s.ScaleDownDelay = &metav1.Duration{Duration: 5 * time.Minute}
			s.Window = &metav1.Duration{Duration: 6 * time.Second}
		})
		r.run(20 * time.Second)
		if got := r.replicas(); got != 3 {
			t.Fatalf("idle with min-scale 3: %d pods, want 3", got)
		}
		assertCondition(t, cl.Client, "unreachable", kpa.ConditionReachable, kpa.ReasonReachable)
		public := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "unreachable"}}
		if err := cl.Client.Delete(context.Background(), public); err != nil {
			t.Fatal(err)
		}
		// Idle and unreachable: one pod at once (no rate limit, no 5 min
		// delay, no min-scale), none after the 30 s grace period.
		r.run(4 * time.Second)
		if got := r.replicas(); got != 1 {
			t.Fatalf("just after the public Service went: %d pods, want 1", got)
		}
		assertCondition(t, cl.Client, "unreachable", kpa.ConditionReachable, kpa.ReasonNoPublicService)
		r.run(30 * time.Second)
		if got := r.replicas(); got != 0 {
			t.Fatalf("30 s later: %d pods, want 0", got)
		}
		// The Service is back: min-scale holds again.
		public = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "unreachable"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
		if err := cl.Client.Create(context.Background(), public); err != nil {
			t.Fatal(err)
		}
		r.run(4 * time.Second)
		if got := r.replicas(); got != 3 {
			t.Errorf("with the Service back: %d pods, want min-scale 3", got)
		}
	})

	t.Run("up, down to zero through the activator, up again", func(t *testing.T) {
		r := newRig(t, cl, "zero", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Service.Port = 80
			s.Target = ptr.To(10.0)
			s.TargetBurstCapacity = ptr.To(0.0) // no burst capacity: Serve whenever pods are wanted
			s.Window = &metav1.Duration{Duration: 10 * time.Second}
		})
		r.offered = 14
		r.run(30 * time.Second)
		if got := r.replicas(); got != 2 {
			t.Fatalf("at 14 in flight: %d pods, want 2", got)
		}
		r.expectPublic(v1alpha1.ModeServe, 2)

		// Idle: the activator must answer a probe of the public Service
		// before the last pod goes.
		r.offered = 0
		r.run(60 * time.Second)
		if got := r.replicas(); got != 1 {
			t.Fatalf("idle while the probe fails: %d pods, want the last pod kept", got)
		}
		r.expectPublic(v1alpha1.ModeProxy, 2)
		assertCondition(t, cl.Client, "zero", kpa.ConditionActive, kpa.ReasonWaitingForActivator)
		r.prober.inPath = true
		r.run(4 * time.Second)
		if got := r.replicas(); got != 0 {
			t.Fatalf("idle with the activator in the path: %d pods, want 0", got)
		}
		if p := r.prober.ports; len(p) == 0 || p[len(p)-1] != 80 {
			t.Errorf("probed ports %v, want spec.service.port 80", p)
		}
		assertCondition(t, cl.Client, "zero", kpa.ConditionActive, kpa.ReasonNoTraffic)

		// A request arrives at the activator: it reports at once, the
		// target is poked and scales from zero, and the poke's duration
		// is observed once (later load finds the target no longer at zero).
		if n := r.pokes(); n != 0 {
			t.Fatalf("%d pokes observed before any load", n)
		}
		r.activatorLoad = 3
		r.run(2 * time.Second)
		if got := r.replicas(); got != 1 {
			t.Fatalf("after the activator's report: %d pods, want 1", got)
		}
		r.run(4 * time.Second)
		if n := r.pokes(); n != 1 {
			t.Errorf("%d poke durations observed, want 1 (the scale from zero)", n)
		}
	})
}

// rig is one target under test.
type rig struct {
	t      *testing.T
	cl     *testenv.Cluster
	name   string
	clk    *clocktesting.FakeClock
	start  time.Time
	col    *collector.Collector
	pa     func() *v1alpha1.PodAutoscaler
	paRec  *kpa.PodAutoscaler
	sksRec *sks.ServerlessService
	colRec *collect.Reconciler
	prober *fakeProber
	// offered is the concurrency the pods serve in all; activatorLoad what
	// the activator holds (reported by it, not by pods).
	offered, activatorLoad float64
	// nodeBDown: the agent of node-b (odd pods) does not report.
	nodeBDown bool
	// metrics has paRec's metrics.
	metrics *prometheus.Registry
}

// pokes is how many poke durations paRec has observed.
func (r *rig) pokes() uint64 {
	r.t.Helper()
	families, err := r.metrics.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "sockscale_controller_poke_duration_seconds" {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	r.t.Fatal("no sockscale_controller_poke_duration_seconds")
	return 0
}

type fakeProber struct {
	inPath bool
	ports  []int32 // the ports probed
}

func (p *fakeProber) ActivatorInPath(_ context.Context, _, _ string, port int32) (bool, error) {
	p.ports = append(p.ports, port)
	return p.inPath, nil
}

func newRig(t *testing.T, cl *testenv.Cluster, name string, spec func(*v1alpha1.PodAutoscalerSpec)) *rig {
	t.Helper()
	ctx, c := context.Background(), cl.Client
	cl.CreateDeployment(t, "default", name, 1, 1)
	public := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if err := c.Create(ctx, public); err != nil {
		t.Fatal(err)
	}
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
			Service:        v1alpha1.ServiceRef{Name: name},
		},
	}
	spec(&pa.Spec)
	if err := c.Create(ctx, pa); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	col := collector.New(clk)
	prober := &fakeProber{}
	reg := prometheus.NewRegistry()
	r := &rig{
		t: t, cl: cl, name: name, clk: clk, start: clk.Now(), col: col, prober: prober, metrics: reg,
		paRec: &kpa.PodAutoscaler{Client: c, Collector: col, Clock: clk, Config: config.Defaults, Prober: prober, Metrics: kpa.NewMetrics(reg)},
		sksRec: &sks.ServerlessService{Client: c, ActivatorNamespace: activatorNS,
			ActivatorSelector: labels.SelectorFromSet(labels.Set{"app.kubernetes.io/component": "activator"}), ActivatorPort: 8012},
		colRec: &collect.Reconciler{Client: c, Collector: col, Config: config.Defaults},
	}
	r.pa = func() *v1alpha1.PodAutoscaler {
		var got v1alpha1.PodAutoscaler
		if err := c.Get(ctx, client.ObjectKeyFromObject(pa), &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	r.reconcile() // the first tick creates the ServerlessService
	return r
}

func (r *rig) elapsed() time.Duration { return r.clk.Now().Sub(r.start) }

// run ticks for d.
func (r *rig) run(d time.Duration) {
	for end := r.clk.Now().Add(d); r.clk.Now().Before(end); {
		r.tick()
	}
}

// tick is one 2 s decider period: two seconds of stats, then both
// reconcilers, then what Kubernetes would do.
func (r *rig) tick() {
	r.t.Helper()
	for range 2 {
		r.record()
		r.clk.Step(time.Second)
	}
	r.reconcile()
}

// record reports one second: the ready pods share the offered load (one
// batch per node's agent), and the activator reports what it holds.
func (r *rig) record() {
	ready := r.readyPods()
	batches := map[string]*stats.Batch{}
	for i := range ready {
		node := nodeOf(i)
		b := batches[node]
		if b == nil {
			b = &stats.Batch{Node: node, Start: r.clk.Now(), Period: time.Second}
			batches[node] = b
		}
		b.Pods = append(b.Pods, stats.PodStat{IP: podIP(i), Namespace: "default", Pod: podName(r.name, i), Workload: r.name,
			Concurrency: r.offered / float64(ready), Requests: uint64(10 * r.offered / float64(ready))})
	}
	for node, b := range batches {
		if node == "node-b" && r.nodeBDown {
			continue
		}
		r.paRec.Poke(r.col.RecordPods(b))
	}
	if r.activatorLoad > 0 && r.col.RecordActivator(collector.Key{Namespace: "default", Name: r.name}, "activator-0", time.Time{}, time.Second, r.activatorLoad, 1) {
		r.paRec.Poke([]collector.Key{{Namespace: "default", Name: r.name}})
	}
}

func (r *rig) reconcile() {
	r.t.Helper()
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: r.name}}
	if _, err := r.colRec.Reconcile(ctx, req); err != nil {
		r.t.Fatalf("reconcile the collector's view: %v", err)
	}
	res, err := r.paRec.Reconcile(ctx, req)
	if err != nil {
		r.t.Fatalf("reconcile PodAutoscaler: %v", err)
	}
	// The next tick is queued at the tick priority, whatever brought this
	// one (a poke's priority, or LowPriority for a target listed at start,
	// would otherwise stick to the target's every tick).
	if res.RequeueAfter <= 0 || res.Priority == nil || *res.Priority != 0 {
		r.t.Fatalf("reconcile PodAutoscaler: requeue after %v at priority %v, want a tick at 0 (the tick priority)", res.RequeueAfter, res.Priority)
	}
	r.becomeReady()
	if _, err := r.sksRec.Reconcile(ctx, req); err != nil {
		r.t.Fatalf("reconcile ServerlessService: %v", err)
	}
}

// becomeReady plays the Deployment and EndpointSlice controllers: every
// wanted pod is ready, and the private Service's slice lists them.
func (r *rig) becomeReady() {
	ctx, c := context.Background(), r.cl.Client
	n := r.replicas()
	d := r.deployment()
	if d.Status.ReadyReplicas != n {
		d.Status.Replicas, d.Status.ReadyReplicas = n, n
		if err := c.Status().Update(ctx, d); err != nil {
			r.t.Fatal(err)
		}
	}
	private := names.PrivateServiceName(r.name)
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: private + "-abcde"}}
	err := c.Get(ctx, client.ObjectKeyFromObject(slice), slice)
	exists := err == nil
	slice.Labels = map[string]string{discoveryv1.LabelServiceName: private, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
	slice.AddressType = discoveryv1.AddressTypeIPv4
	slice.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}}
	slice.Endpoints = nil
	for i := range n {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{podIP(i).String()}, NodeName: ptr.To(nodeOf(i)),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: podName(r.name, i)}})
	}
	if exists {
		err = c.Update(ctx, slice)
	} else {
		err = c.Create(ctx, slice)
	}
	if err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) deployment() *appsv1.Deployment {
	var d appsv1.Deployment
	if err := r.cl.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: r.name}, &d); err != nil {
		r.t.Fatal(err)
	}
	return &d
}

func (r *rig) replicas() int32 { return *r.deployment().Spec.Replicas }

func (r *rig) readyPods() int32 { return r.deployment().Status.ReadyReplicas }

// expectPublic checks the ServerlessService's mode and the public
// Service's endpoints: the pods in Serve mode, n activators in Proxy.
// expectModeReason checks why the PodAutoscaler's status says its
// target is in its mode.
func (r *rig) expectModeReason(want string) {
	r.t.Helper()
	var pa v1alpha1.PodAutoscaler
	if err := r.cl.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: r.name}, &pa); err != nil {
		r.t.Fatal(err)
	}
	if pa.Status.ModeReason != want {
		r.t.Errorf("PodAutoscaler status: mode %s because %q, want because %q", pa.Status.Mode, pa.Status.ModeReason, want)
	}
}

func (r *rig) expectPublic(mode v1alpha1.Mode, n int) {
	r.t.Helper()
	ctx, c := context.Background(), r.cl.Client
	var sks v1alpha1.ServerlessService
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: r.name}, &sks); err != nil {
		r.t.Fatal(err)
	}
	var slices discoveryv1.EndpointSliceList
	if err := c.List(ctx, &slices, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: r.name}); err != nil {
		r.t.Fatal(err)
	}
	var ips []string
	port := int32(0)
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			ips = append(ips, e.Addresses...)
		}
		if len(s.Ports) > 0 {
			port = *s.Ports[0].Port
		}
	}
	sort.Strings(ips)
	want := []string{}
	wantPort := int32(8080)
	if mode == v1alpha1.ModeServe {
		for i := range n {
			want = append(want, podIP(int32(i)).String())
		}
	} else {
		wantPort = 8012
		if len(sks.Status.Activators) != n {
			r.t.Errorf("ServerlessService lists activators %v, want %d", sks.Status.Activators, n)
		}
	}
	if sks.Status.Mode != mode || len(ips) != n || port != wantPort || (mode == v1alpha1.ModeServe && fmt.Sprint(ips) != fmt.Sprint(want)) {
		r.t.Errorf("mode %s with public endpoints %v port %d; want %s with %d endpoints on port %d %v", sks.Status.Mode, ips, port, mode, n, wantPort, want)
	}
	if pa := r.pa(); pa.Status.Mode != mode {
		r.t.Errorf("PodAutoscaler status mode %s, want %s", pa.Status.Mode, mode)
	}
}

// nodeOf is pod i's node: even pods on node-a, odd ones on node-b.
func nodeOf(i int32) string { return []string{"node-a", "node-b"}[i%2] }

func podIP(i int32) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 10)}) }

func podName(target string, i int32) string { return fmt.Sprintf("%s-pod-%d", target, i) }

// createActivators makes n ready activator pods (status written by hand:
// no kubelet runs here).
func createActivators(t *testing.T, c client.Client, n int) {
	t.Helper()
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: activatorNS}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: activatorNS, Name: fmt.Sprintf("activator-%d", i), Labels: map[string]string{"app.kubernetes.io/component": "activator"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "activator", Image: "sockscale-activator"}}},
		}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.0.2.%d", i+10),
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}
