package revision

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// TestReachability: a Revision is Reachable while a Route gives it a share
// or a tag, unknown while it is its Service's newest, and Unreachable
// once nothing routes to it.
func TestReachability(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, servingv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	yes := true
	svc := &servingv1alpha1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "svc-uid"},
		Status: servingv1alpha1.ServiceStatus{LatestCreatedRevisionName: "hello-00004", LatestReadyRevisionName: "hello-00003"}}
	owned := func(name string) *servingv1alpha1.Revision {
		return &servingv1alpha1.Revision{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: servingv1alpha1.GroupVersion.String(), Kind: "Service", Name: "hello", UID: "svc-uid", Controller: &yes}}}}
	}
	pct := func(v int64) *int64 { return &v }
	route := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Status: servingv1alpha1.RouteStatus{RouteStatusFields: servingv1alpha1.RouteStatusFields{Traffic: []servingv1alpha1.TrafficTargetStatus{
			{RevisionName: "hello-00003", Percent: pct(90)},
			{RevisionName: "hello-00001", Percent: pct(10)},
			{RevisionName: "hello-00002", Percent: pct(0), Tag: "old"},
			{RevisionName: "hello-00005", Percent: pct(0)},
		}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(svc, route).Build()
	tests := []struct {
		rev  *servingv1alpha1.Revision
		want v1alpha1.Reachability
	}{
		{owned("hello-00001"), v1alpha1.ReachabilityReachable},                                              // a share
		{owned("hello-00002"), v1alpha1.ReachabilityReachable},                                              // a tag at 0 %
		{owned("hello-00003"), v1alpha1.ReachabilityReachable},                                              // the latest ready, routed
		{owned("hello-00004"), ""},                                                                          // latest created, not ready yet
		{owned("hello-00005"), v1alpha1.ReachabilityUnreachable},                                            // 0 %, no tag
		{owned("hello-00006"), v1alpha1.ReachabilityUnreachable},                                            // old, in no split
		{&servingv1alpha1.Revision{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "alone"}}, ""}, // no Service
	}
	r := &Reconciler{Client: c}
	for _, tt := range tests {
		got, err := r.reachability(context.Background(), tt.rev)
		if err != nil || got != tt.want {
			t.Errorf("%s: %q, %v; want %q", tt.rev.Name, got, err, tt.want)
		}
	}
	reqs := routedRevisions(context.Background(), route)
	if len(reqs) != 4 || reqs[1].NamespacedName != (client.ObjectKey{Namespace: "default", Name: "hello-00001"}) {
		t.Errorf("a Route maps to %v", reqs)
	}
}
