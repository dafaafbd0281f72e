package sks

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// ensurePrivate creates or updates the private Service: the public one's
// ports with the target's selector. It returns a message instead when a
// Service of that name belongs to someone else.
//
// A new private Service is headless (clusterIP None): nothing dials it,
// the activators and the controller read its EndpointSlices, which the
// EndpointSlice controller writes for a headless Service with a
// selector as for any other. Without a cluster IP a target takes one
// address of the Service range instead of two and kube-proxy programs
// one Service instead of two; and creating it costs the API server no
// IP allocation, which at 10,000 targets was 61 % of its CPU while the
// private Services were made (docs/scale-bench.md). A cluster IP cannot
// be removed from a Service, so private Services made before keep
// theirs (they work the same).
//
// It has the public Service's IP families and family policy, so that its
// EndpointSlices, which the public Service's are copied from in Serve
// mode, are of the public Service's families: a dual-stack public Service
// gets both, an IPv4 one IPv4 slices. A single-stack IPv6 public Service
// gets a private one that prefers dual-stack, IPv6 first: on a dual-stack
// cluster its pods are dual-stack too, and the agents report a pod by its
// IPv4 address (podaddr.Pick), which the controller finds in the private
// Service's IPv4 slices; only the IPv6 ones are copied to the public
// Service. On an IPv6-only cluster it is IPv6 alone.
func (r *ServerlessService) ensurePrivate(ctx context.Context, sks *v1alpha1.ServerlessService, public *corev1.Service) (string, error) {
	want := corev1.ServiceSpec{Selector: sks.Spec.Selector, ClusterIP: corev1.ClusterIPNone,
		IPFamilies: public.Spec.IPFamilies, IPFamilyPolicy: public.Spec.IPFamilyPolicy}
	if slices.Equal(public.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv6Protocol}) {
		want.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	}
	for _, p := range public.Spec.Ports {
		want.Ports = append(want.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, TargetPort: p.TargetPort, AppProtocol: p.AppProtocol})
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: sks.Namespace, Name: names.PrivateServiceName(public.Name)}}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc)
	switch {
	case apierrors.IsNotFound(err):
		svc.Labels = map[string]string{LabelServerlessService: sks.Name, "app.kubernetes.io/managed-by": "sockscale"}
		svc.Spec = want
		if err := controllerutil.SetControllerReference(sks, svc, r.Client.Scheme()); err != nil {
			return "", err
		}
		return "", r.Client.Create(ctx, svc)
	case err != nil:
		return "", err
	case !metav1.IsControlledBy(svc, sks):
		return fmt.Sprintf("Service %q exists and is not managed by this ServerlessService; rename or delete it so sockscale can select the target's pods through it", svc.Name), nil
	}
	if equality.Semantic.DeepEqual(svc.Spec.Selector, want.Selector) && samePorts(svc.Spec.Ports, want.Ports) && sameFamilies(svc, &want) {
		return "", nil
	}
	svc.Spec.Selector, svc.Spec.Ports = want.Selector, want.Ports
	if !sameFamilies(svc, &want) {
		// The API server refuses a change of the first family, as it does
		// on the public Service, whose first family cannot change either:
		// only a second family added or removed gets here.
		svc.Spec.IPFamilies, svc.Spec.IPFamilyPolicy = want.IPFamilies, want.IPFamilyPolicy
	}
	if err := r.Client.Update(ctx, svc); err != nil {
		return "", fmt.Errorf("update private Service %s: %w", svc.Name, err)
	}
	return "", nil
}

// sameFamilies says whether have has want's IP families and policy; a
// want that names none (a public Service the API server did not fill)
// asks for nothing. With PreferDualStack the API server adds the second
// family where the cluster has one: only the first is compared.
func sameFamilies(have *corev1.Service, want *corev1.ServiceSpec) bool {
	if len(want.IPFamilies) == 0 {
		return true
	}
	if want.IPFamilyPolicy != nil && *want.IPFamilyPolicy == corev1.IPFamilyPolicyPreferDualStack && len(want.IPFamilies) == 1 {
		return len(have.Spec.IPFamilies) > 0 && have.Spec.IPFamilies[0] == want.IPFamilies[0] &&
			ptr.Deref(have.Spec.IPFamilyPolicy, "") == *want.IPFamilyPolicy
	}
	return slices.Equal(have.Spec.IPFamilies, want.IPFamilies) &&
		(want.IPFamilyPolicy == nil || ptr.Deref(have.Spec.IPFamilyPolicy, "") == *want.IPFamilyPolicy)
}

// samePorts compares what ensurePrivate sets (the API server fills
// defaults such as the protocol and target port on the live object).
func samePorts(have, want []corev1.ServicePort) bool {
	if len(have) != len(want) {
		return false
	}
	for i := range want {
		h, w := have[i], want[i]
		if h.Name != w.Name || h.Port != w.Port || (w.Protocol != "" && h.Protocol != w.Protocol) ||
			(w.TargetPort.String() != "0" && h.TargetPort != w.TargetPort) {
			return false
		}
	}
	return true
}
