package sks_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationSlicesGoWithThePublicService: with the reconciler running
// in a manager against a real kube-apiserver, deleting the public Service,
// or giving it a selector, removes the EndpointSlices sockscale wrote for
// it (the Service watch enqueues the ServerlessService), so a Service
// created again under the name starts without stale endpoints and
// Kubernetes' slices of a selector have no second writer beside them.
func TestIntegrationSlicesGoWithThePublicService(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c := cl.Client
	ctx := context.Background()
	cl.StartManager(t, func(mgr ctrl.Manager) error {
		return (&sks.ServerlessService{Client: mgr.GetClient(), ActivatorNamespace: "default",
			ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}).SetupWithManager(mgr)
	})
	public := func() *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	}
	// The private Service's slice as Kubernetes' EndpointSlice controller
	// would write it (it does not run here): one ready pod.
	podSlice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-private-abc", Labels: map[string]string{
			discoveryv1.LabelServiceName: "hello-private", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	// A slice that only carries sockscale's label: not proof that
	// sockscale wrote it, so it is left.
	forged := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-forged", Labels: map[string]string{
			discoveryv1.LabelServiceName: "hello", discoveryv1.LabelManagedBy: sks.ManagedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, o := range []client.Object{
		&v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello", Selector: map[string]string{"app": "hello"}}},
		public(), podSlice,
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// ownSlices names the slices of Service hello that the reconciler
	// wrote (its name scheme).
	ownSlices := func() ([]string, string) {
		var list discoveryv1.EndpointSliceList
		if err := c.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: "hello"}); err != nil {
			return nil, err.Error()
		}
		var own []string
		for _, s := range list.Items {
			if strings.HasPrefix(s.Name, "hello-sockscale-") {
				own = append(own, s.Name)
			}
		}
		return own, fmt.Sprintf("sockscale's slices %v", own)
	}
	ready := func(wantReason, wantInMsg string) func() (bool, string) {
		return func() (bool, string) {
			var s v1alpha1.ServerlessService
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "hello"}, &s); err != nil {
				return false, err.Error()
			}
			cond := meta.FindStatusCondition(s.Status.Conditions, names.ConditionReady)
			own, state := ownSlices()
			if cond == nil {
				return false, "no Ready condition; " + state
			}
			return cond.Reason == wantReason && strings.Contains(cond.Message, wantInMsg) && len(own) == 0,
				fmt.Sprintf("Ready %s %q; %s", cond.Reason, cond.Message, state)
		}
	}
	written := func() (bool, string) {
		own, state := ownSlices()
		return len(own) == 1, state
	}

	testenv.Eventually(t, 30*time.Second, "sockscale writes the public Service's slice", written)
	if err := c.Delete(ctx, public()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the slice goes with the deleted Service",
		ready(sks.ReasonPublicServiceNotFound, "those it wrote are deleted"))

	if err := c.Create(ctx, public()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "sockscale writes the slice of the Service created again", written)
	// Created now: beside a Service without a selector the reconciler
	// refuses it as another writer's.
	if err := c.Create(ctx, forged); err != nil {
		t.Fatal(err)
	}
	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "hello"}, &svc); err != nil {
		t.Fatal(err)
	}
	svc.Spec.Selector = map[string]string{"app": "users-own"}
	if err := c.Update(ctx, &svc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the slice goes once the Service has a selector",
		ready(sks.ReasonPublicServiceHasSelector, "sockscale's EndpointSlices of it are deleted"))
	if err := c.Get(ctx, client.ObjectKeyFromObject(forged), forged); err != nil {
		t.Errorf("a slice only labelled as sockscale's: %v; want it left", err)
	}
}
