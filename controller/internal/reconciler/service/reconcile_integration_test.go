package service_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/revision"
	"github.com/sockscale/sockscale/controller/internal/reconciler/route"
	"github.com/sockscale/sockscale/controller/internal/reconciler/service"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// startManager runs the Revision, Service and Route reconcilers against
// cl until the test ends (no activator pods: the Route's addresses have
// empty EndpointSlices), with the settings cfg holds.
func startManager(t *testing.T, cl *testenv.Cluster, cfg *atomic.Pointer[config.Config]) {
	t.Helper()
	cl.StartManager(t,
		func(mgr ctrl.Manager) error {
			return (&route.Reconciler{Client: mgr.GetClient(), ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}),
				ActivatorRoutePort: 8013, ClusterDomain: "cluster.local"}).SetupWithManager(mgr)
		},
		func(mgr ctrl.Manager) error {
			return (&revision.Reconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)
		},
		func(mgr ctrl.Manager) error {
			return (&service.Reconciler{Client: mgr.GetClient(), Config: cfg.Load}).SetupWithManager(mgr)
		})
}

// eventually waits up to 60 s for cond (testenv.Eventually).
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, cond)
}

func key(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "default", Name: name}
}

// revisions lists the Revisions in default by name.
func revisions(t *testing.T, c client.Client) map[string]servingv1alpha1.Revision {
	t.Helper()
	var list servingv1alpha1.RevisionList
	if err := c.List(context.Background(), &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	out := map[string]servingv1alpha1.Revision{}
	for _, r := range list.Items {
		out[r.Name] = r
	}
	return out
}

func sortedNames(m map[string]servingv1alpha1.Revision) string {
	var n []string
	for k := range m {
		n = append(n, k)
	}
	sort.Strings(n)
	return strings.Join(n, ",")
}

func getService(t *testing.T, c client.Client, name string) *servingv1alpha1.Service {
	t.Helper()
	var s servingv1alpha1.Service
	if err := c.Get(context.Background(), key(name), &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// updateService changes Service hello with change, again on a conflict
// (the reconcilers write its status meanwhile).
func updateService(t *testing.T, c client.Client, change func(*servingv1alpha1.Service)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := getService(t, c, "hello")
		change(s)
		return c.Update(context.Background(), s)
	}); err != nil {
		t.Fatal(err)
	}
}

func conditions(s *servingv1alpha1.ServiceStatus) string {
	var b strings.Builder
	for _, c := range s.Conditions {
		fmt.Fprintf(&b, "%s=%s %s: %s; ", c.Type, c.Status, c.Reason, c.Message)
	}
	fmt.Fprintf(&b, "latestCreated=%s latestReady=%s traffic=%d", s.LatestCreatedRevisionName, s.LatestReadyRevisionName, len(s.Traffic))
	return b.String()
}

// markReady writes the PodAutoscaler and ServerlessService statuses their
// reconcilers would (they do not run here) so the Revision becomes Ready.
func markReady(t *testing.T, c client.Client, name string) {
	t.Helper()
	ctx := context.Background()
	var pa v1alpha1.PodAutoscaler
	eventually(t, "PodAutoscaler "+name, func() (bool, string) {
		err := c.Get(ctx, key(name), &pa)
		return err == nil, fmt.Sprint(err)
	})
	now := metav1.Now()
	// The revision reconciler may still be writing the new PodAutoscaler:
	// on a conflict, read it again and set the status again.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key(name), &pa); err != nil {
			return err
		}
		pa.Status.ActualScale, pa.Status.DesiredScale = ptr.To(int32(1)), ptr.To(int32(1))
		pa.Status.Conditions = []metav1.Condition{
			{Type: names.ConditionReady, Status: metav1.ConditionTrue, Reason: "Scaled", Message: "1 pod", LastTransitionTime: now},
			{Type: kpa.ConditionInitialized, Status: metav1.ConditionTrue, Reason: "Initialized", Message: "up", LastTransitionTime: now},
		}
		return c.Status().Update(ctx, &pa)
	}); err != nil {
		t.Fatal(err)
	}
	sks := &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: name, Selector: map[string]string{servingv1alpha1.RevisionLabelKey: name}}}
	if err := c.Create(ctx, sks); err != nil {
		t.Fatal(err)
	}
	sks.Status.Conditions = []metav1.Condition{{Type: names.ConditionReady, Status: metav1.ConditionTrue, Reason: "Serve", Message: "1 endpoint", LastTransitionTime: now}}
	if err := c.Status().Update(ctx, sks); err != nil {
		t.Fatal(err)
	}
}

// TestIntegrationServiceRevisions: a Service makes hello-00001 with its
// Deployment, public Service and PodAutoscaler; a new image makes
// hello-00002 and leaves hello-00001 as it was; a change that leaves the
// template alone makes nothing; the status follows the latest Revision
// and resolves the traffic; a template name that names a Revision with
// another spec is refused, naming it.
func TestIntegrationServiceRevisions(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	var cfg atomic.Pointer[config.Config]
	cfg.Store(config.Defaults())
	startManager(t, cl, &cfg)
	svc := &servingv1alpha1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: servingv1alpha1.ServiceSpec{Template: servingv1alpha1.RevisionTemplateSpec{
			Metadata: servingv1alpha1.RevisionTemplateMetadata{Annotations: map[string]string{"autoscaling.knative.dev/target": "10"}},
			Spec:     servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{Image: "hello:v1"}}},
		}},
	}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hello-00001 and its objects", func() (bool, string) {
		var d appsv1.Deployment
		var s corev1.Service
		var pa v1alpha1.PodAutoscaler
		err1, err2, err3 := c.Get(ctx, key("hello-00001-deployment"), &d), c.Get(ctx, key("hello-00001"), &s), c.Get(ctx, key("hello-00001"), &pa)
		return err1 == nil && err2 == nil && err3 == nil, fmt.Sprint(err1, err2, err3)
	})
	revs := revisions(t, c)
	first := revs["hello-00001"]
	if len(revs) != 1 || !metav1.IsControlledBy(&first, svc) || first.Labels[servingv1alpha1.ServiceLabelKey] != "hello" ||
		first.Annotations["autoscaling.knative.dev/target"] != "10" || first.Annotations[service.TemplateHashAnnotation] == "" {
		t.Fatalf("revisions %s; hello-00001 owners %v labels %v annotations %v", sortedNames(revs), first.OwnerReferences, first.Labels, first.Annotations)
	}
	eventually(t, "latestCreated hello-00001, not ready yet", func() (bool, string) {
		s := getService(t, c, "hello")
		cr := meta.FindStatusCondition(s.Status.Conditions, service.ConditionConfigurationsReady)
		rt := meta.FindStatusCondition(s.Status.Conditions, service.ConditionRoutesReady)
		return s.Status.LatestCreatedRevisionName == "hello-00001" && s.Status.LatestReadyRevisionName == "" && len(s.Status.Traffic) == 0 &&
			cr != nil && cr.Status == metav1.ConditionUnknown && rt != nil && rt.Status == metav1.ConditionUnknown &&
			rt.Reason == route.ReasonNoReadyRevision && s.Status.ObservedGeneration == s.Generation, conditions(&s.Status)
	})

	markReady(t, c, "hello-00001")
	eventually(t, "hello-00001 ready, 100 % to it", func() (bool, string) {
		s := getService(t, c, "hello")
		ready := meta.FindStatusCondition(s.Status.Conditions, names.ConditionReady)
		return s.Status.LatestReadyRevisionName == "hello-00001" && ready != nil && ready.Status == metav1.ConditionTrue &&
			len(s.Status.Traffic) == 1 && s.Status.Traffic[0].RevisionName == "hello-00001" && *s.Status.Traffic[0].Percent == 100 &&
			*s.Status.Traffic[0].LatestRevision && s.Status.URL == "http://hello.default.svc.cluster.local", conditions(&s.Status)
	})
	var rt servingv1alpha1.Route
	if err := c.Get(ctx, key("hello"), &rt); err != nil || !metav1.IsControlledBy(&rt, svc) || len(rt.Spec.Traffic) != 1 ||
		rt.Spec.Traffic[0].ConfigurationName != "hello" || *rt.Spec.Traffic[0].Percent != 100 {
		t.Fatalf("Route hello: %v, %+v", err, rt.Spec)
	}
	var address corev1.Service
	if err := c.Get(ctx, key("hello"), &address); err != nil || address.Labels[servingv1alpha1.RouteLabelKey] != "hello" || address.Spec.Selector != nil {
		t.Fatalf("the Route's address Service hello: %v, labels %v selector %v", err, address.Labels, address.Spec.Selector)
	}

	// A new image: hello-00002; hello-00001 is not touched, and stays
	// the latest ready (and gets the traffic) until hello-00002 is.
	updateService(t, c, func(s *servingv1alpha1.Service) {
		s.Spec.Template.Spec.Containers[0].Image = "hello:v2"
	})
	eventually(t, "hello-00002", func() (bool, string) {
		s := getService(t, c, "hello")
		return s.Status.LatestCreatedRevisionName == "hello-00002", conditions(&s.Status)
	})
	revs = revisions(t, c)
	second := revs["hello-00002"]
	if len(revs) != 2 || second.Spec.Containers[0].Image != "hello:v2" {
		t.Fatalf("revisions %s, hello-00002 image %v", sortedNames(revs), second.Spec.Containers)
	}
	if old := revs["hello-00001"]; old.Spec.Containers[0].Image != "hello:v1" || old.Generation != first.Generation ||
		old.Annotations[service.TemplateHashAnnotation] != first.Annotations[service.TemplateHashAnnotation] {
		t.Errorf("hello-00001 changed: image %s generation %d -> %d", old.Spec.Containers[0].Image, first.Generation, old.Generation)
	}
	var d appsv1.Deployment
	if err := c.Get(ctx, key("hello-00002-deployment"), &d); err != nil || d.Spec.Template.Spec.Containers[0].Image != "hello:v2" {
		t.Errorf("hello-00002's Deployment: %v %+v", err, d.Spec.Template.Spec.Containers)
	}
	s := getService(t, c, "hello")
	if s.Status.LatestReadyRevisionName != "hello-00001" || s.Status.Traffic[0].RevisionName != "hello-00001" {
		t.Errorf("before hello-00002 is ready: %s", conditions(&s.Status))
	}
	markReady(t, c, "hello-00002")
	eventually(t, "hello-00002 ready and latest", func() (bool, string) {
		s := getService(t, c, "hello")
		return s.Status.LatestReadyRevisionName == "hello-00002" && len(s.Status.Traffic) == 1 && s.Status.Traffic[0].RevisionName == "hello-00002", conditions(&s.Status)
	})

	// A traffic change leaves the template alone: no new Revision, and
	// the split resolves (latest -> hello-00002).
	updateService(t, c, func(s *servingv1alpha1.Service) {
		s.Spec.Traffic = []servingv1alpha1.TrafficTarget{{LatestRevision: ptr.To(true), Percent: ptr.To(int64(60))}, {RevisionName: "hello-00001", Percent: ptr.To(int64(40)), Tag: "old"}}
	})
	eventually(t, "split resolved", func() (bool, string) {
		s := getService(t, c, "hello")
		return s.Status.ObservedGeneration == s.Generation && len(s.Status.Traffic) == 2 && s.Status.Traffic[0].RevisionName == "hello-00002" &&
			s.Status.Traffic[1].RevisionName == "hello-00001" && s.Status.Traffic[1].Tag == "old" &&
			s.Status.Traffic[1].URL == "http://old-hello.default.svc.cluster.local", conditions(&s.Status)
	})
	eventually(t, "the tag's address Service old-hello", func() (bool, string) {
		var tagged corev1.Service
		err := c.Get(ctx, key("old-hello"), &tagged)
		return err == nil && tagged.Labels[servingv1alpha1.TagLabelKey] == "old" && tagged.Labels[servingv1alpha1.RouteLabelKey] == "hello", fmt.Sprint(err, tagged.Labels)
	})
	// Reconciled again directly, with the cache of the manager settled:
	// still two Revisions.
	r := &service.Reconciler{Client: c}
	for range 3 {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key("hello")}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if revs := revisions(t, c); len(revs) != 2 {
		t.Errorf("an unchanged template made Revisions: %s", sortedNames(revs))
	}

	// The template names hello-00001, which has another spec: refused.
	updateService(t, c, func(s *servingv1alpha1.Service) {
		s.Spec.Template.Metadata.Name = "hello-00001"
		s.Spec.Template.Spec.Containers[0].Image = "hello:v3"
	})
	eventually(t, "name refused", func() (bool, string) {
		s := getService(t, c, "hello")
		cr := meta.FindStatusCondition(s.Status.Conditions, service.ConditionConfigurationsReady)
		ready := meta.FindStatusCondition(s.Status.Conditions, names.ConditionReady)
		return cr != nil && cr.Status == metav1.ConditionFalse && cr.Reason == service.ReasonRevisionNameTaken &&
			strings.Contains(cr.Message, `Revision "hello-00001", which exists with a different spec`) &&
			ready != nil && ready.Status == metav1.ConditionFalse && s.Status.LatestCreatedRevisionName == "hello-00002", conditions(&s.Status)
	})
	if revs := revisions(t, c); len(revs) != 2 || revs["hello-00001"].Spec.Containers[0].Image != "hello:v1" {
		t.Errorf("after the refusal: %s, hello-00001 image %s", sortedNames(revs), revs["hello-00001"].Spec.Containers[0].Image)
	}
	// A new name is taken as given.
	updateService(t, c, func(s *servingv1alpha1.Service) {
		s.Spec.Template.Metadata.Name = "hello-v3"
	})
	eventually(t, "hello-v3", func() (bool, string) {
		s := getService(t, c, "hello")
		return s.Status.LatestCreatedRevisionName == "hello-v3", conditions(&s.Status)
	})
	if revs := revisions(t, c); len(revs) != 3 || revs["hello-v3"].Spec.Containers[0].Image != "hello:v3" {
		t.Errorf("revisions %s", sortedNames(revs))
	}

	// hello-v3 never becomes ready (its pods cannot start): it gets no
	// traffic, and the Service says why, naming it.
	var pa v1alpha1.PodAutoscaler
	eventually(t, "PodAutoscaler hello-v3", func() (bool, string) {
		err := c.Get(ctx, key("hello-v3"), &pa)
		return err == nil, fmt.Sprint(err)
	})
	// The revision reconciler may still be writing the new PodAutoscaler:
	// on a conflict, read it again and set the condition again.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key("hello-v3"), &pa); err != nil {
			return err
		}
		pa.Status.Conditions = []metav1.Condition{{Type: names.ConditionReady, Status: metav1.ConditionFalse, Reason: "ScaleTargetFailing",
			Message: "Deployment hello-v3-deployment has no ready pod: ImagePullBackOff", LastTransitionTime: metav1.Now()}}
		return c.Status().Update(ctx, &pa)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the failing hello-v3 reported, traffic kept on hello-00002", func() (bool, string) {
		s := getService(t, c, "hello")
		cr := meta.FindStatusCondition(s.Status.Conditions, service.ConditionConfigurationsReady)
		ready := meta.FindStatusCondition(s.Status.Conditions, names.ConditionReady)
		return cr != nil && cr.Status == metav1.ConditionFalse && cr.Reason == "ScaleTargetFailing" && strings.Contains(cr.Message, `"hello-v3"`) &&
			strings.Contains(cr.Message, "ImagePullBackOff") && ready != nil && ready.Status == metav1.ConditionFalse &&
			s.Status.LatestReadyRevisionName == "hello-00002" && s.Status.Traffic[0].RevisionName == "hello-00002", conditions(&s.Status)
	})

	// hello-00001 loses its share and tag: reserve, its PodAutoscaler
	// Unreachable (it scales to zero whatever min-scale says); hello-00002,
	// routed, stays active.
	updateService(t, c, func(s *servingv1alpha1.Service) {
		s.Spec.Traffic = nil
	})
	routing := func(name string) (servingv1alpha1.RoutingState, v1alpha1.Reachability) {
		var rev servingv1alpha1.Revision
		var pa v1alpha1.PodAutoscaler
		if err := c.Get(ctx, key(name), &rev); err != nil {
			return "", v1alpha1.Reachability(err.Error())
		}
		if err := c.Get(ctx, key(name), &pa); err != nil {
			return rev.Status.RoutingState, v1alpha1.Reachability(err.Error())
		}
		return rev.Status.RoutingState, pa.Spec.Reachability
	}
	eventually(t, "hello-00001 reserve and Unreachable", func() (bool, string) {
		st1, r1 := routing("hello-00001")
		st2, r2 := routing("hello-00002")
		return st1 == servingv1alpha1.RoutingStateReserve && r1 == v1alpha1.ReachabilityUnreachable &&
			st2 == servingv1alpha1.RoutingStateActive && r2 == v1alpha1.ReachabilityReachable, fmt.Sprint(st1, r1, st2, r2)
	})
	// Garbage collection with no Revision to keep: hello-00001 (reserve)
	// goes; hello-00002 (routed, latest ready) and hello-v3 (latest
	// created) stay.
	gc := config.Defaults()
	gc.GC = config.GC{MinNonActive: 0, MaxNonActive: config.Disabled}
	cfg.Store(gc)
	updateService(t, c, func(s *servingv1alpha1.Service) {
		s.Annotations = map[string]string{"nudge": "gc"} // any change reconciles the Service
	})
	eventually(t, "hello-00001 collected", func() (bool, string) {
		revs := revisions(t, c)
		_, kept := revs["hello-00001"]
		return !kept && len(revs) == 2, sortedNames(revs)
	})
}
