package route

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
)

// AddressPort is the port of a Route's addresses, as of a Revision's
// public Service: the agents' split maps it to the revisions' port 80.
const AddressPort = 80

// AddressName is the Kubernetes Service of a Route's address: the
// Route's own name, or <tag>-<route> for a tag (Knative's host name
// scheme).
func AddressName(route, tag string) string {
	if tag == "" {
		return route
	}
	return tag + "-" + route
}

// tags are the tags of a split, in order, each once.
func tags(traffic []servingv1alpha1.TrafficTargetStatus) []string {
	var out []string
	seen := map[string]bool{}
	for _, t := range traffic {
		if t.Tag != "" && !seen[t.Tag] {
			seen[t.Tag] = true
			out = append(out, t.Tag)
		}
	}
	return out
}

// tooLong is the first tag whose address would not be a valid Service
// name, with why.
func tooLong(route string, tags []string) *problem {
	for _, t := range tags {
		if errs := validation.IsDNS1035Label(AddressName(route, t)); len(errs) > 0 {
			return &problem{metav1.ConditionFalse, ReasonTagAddressTooLong,
				fmt.Sprintf("tag %q gets the address %q, which is not a valid Service name (%s): shorten the tag or the Route's name", t, AddressName(route, t), errs[0])}
		}
	}
	return nil
}

// makeAddress is the Kubernetes Service of one of rt's addresses: a
// ClusterIP with no selector. Where the node's agent splits in the
// kernel, a connect to it never reaches its endpoints; elsewhere (nodes
// without the agent, clients outside the cluster) its endpoints are the
// activators' route port, where they split per request by the same
// percents. Like a Revision's public Service it prefers dual-stack (set
// at creation only).
func makeAddress(rt *servingv1alpha1.Route, tag string, routePort int32) *corev1.Service {
	labels := map[string]string{servingv1alpha1.RouteLabelKey: rt.Name}
	if tag != "" {
		labels[servingv1alpha1.TagLabelKey] = tag
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: rt.Namespace, Name: AddressName(rt.Name, tag), Labels: labels},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{
			Name: "http", Protocol: corev1.ProtocolTCP, Port: AddressPort, TargetPort: intstr.FromInt32(routePort),
		}}, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack)},
	}
}

// ensureAddress creates or corrects one address Service and its
// EndpointSlice. It returns a problem when the name belongs to someone
// else.
func (r *Reconciler) ensureAddress(ctx context.Context, rt *servingv1alpha1.Route, tag string, acts []endpoints.Endpoint) (*problem, error) {
	want := makeAddress(rt, tag, r.ActivatorRoutePort)
	var have corev1.Service
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &have)
	// families are the Service's IP families as the API server made it
	// (the cluster's default for a Service that names none).
	families := endpoints.Families(&have)
	switch {
	case apierrors.IsNotFound(err):
		if err := controllerutil.SetControllerReference(rt, want, r.Client.Scheme()); err != nil {
			return nil, err
		}
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create Service %s: %w", want.Name, err)
		}
		families = endpoints.Families(want) // as created: the answer fills spec.ipFamilies
	case err != nil:
		return nil, fmt.Errorf("get Service %s: %w", want.Name, err)
	case !metav1.IsControlledBy(&have, rt):
		return &problem{metav1.ConditionFalse, ReasonNotOwned,
			fmt.Sprintf("Service %q exists and does not belong to this Route: delete or rename it so the Route can use its address", want.Name)}, nil
	case have.Spec.Selector != nil || !equality.Semantic.DeepEqual(have.Spec.Ports, want.Spec.Ports) || !labelsHold(have.Labels, want.Labels):
		if have.Labels == nil {
			have.Labels = map[string]string{}
		}
		maps.Copy(have.Labels, want.Labels)
		have.Spec.Selector, have.Spec.Ports = nil, want.Spec.Ports
		if err := r.Client.Update(ctx, &have); err != nil {
			return nil, fmt.Errorf("correct Service %s: %w", want.Name, err)
		}
	}
	for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		if !slices.Contains(families, family) {
			if err := r.deleteSlice(ctx, rt, endpoints.SliceName(want.Name, family, 0)); err != nil {
				return nil, err
			}
			continue
		}
		if err := r.writeSlice(ctx, rt, want.Name, family, acts); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// deleteSlice deletes the EndpointSlice name if rt controls it: one of a
// family its address Service no longer has.
func (r *Reconciler) deleteSlice(ctx context.Context, rt *servingv1alpha1.Route, name string) error {
	var have discoveryv1.EndpointSlice
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: rt.Namespace, Name: name}, &have); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get EndpointSlice %s: %w", name, err)
	case !metav1.IsControlledBy(&have, rt):
		return nil
	}
	if err := r.Client.Delete(ctx, &have); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete EndpointSlice %s of a family the Service no longer has: %w", name, err)
	}
	return nil
}

// writeSlice makes the address Service's one EndpointSlice of family:
// the ready activators' addresses of that family at their route port.
func (r *Reconciler) writeSlice(ctx context.Context, rt *servingv1alpha1.Route, service string, family discoveryv1.AddressType, acts []endpoints.Endpoint) error {
	ports := []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(r.ActivatorRoutePort)}}
	eps := make([]discoveryv1.Endpoint, 0, len(acts))
	for _, a := range acts {
		ip, ok := a.AddrOf(family)
		if !ok {
			continue
		}
		eps = append(eps, discoveryv1.Endpoint{
			Addresses:  []string{ip.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: r.ActivatorNamespace, Name: a.Name},
		})
	}
	name := endpoints.SliceName(service, family, 0)
	var have discoveryv1.EndpointSlice
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: rt.Namespace, Name: name}, &have)
	switch {
	case apierrors.IsNotFound(err):
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: rt.Namespace, Name: name, Labels: map[string]string{
				discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: sks.ManagedBy, servingv1alpha1.RouteLabelKey: rt.Name,
			}},
			AddressType: family, Endpoints: eps, Ports: ports,
		}
		if err := controllerutil.SetControllerReference(rt, s, r.Client.Scheme()); err != nil {
			return err
		}
		if err := r.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create EndpointSlice %s: %w", name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("get EndpointSlice %s: %w", name, err)
	case !metav1.IsControlledBy(&have, rt):
		return nil // the Service is ours and the slice is not: left alone, as the SKS does
	case equality.Semantic.DeepEqual(have.Endpoints, eps) && equality.Semantic.DeepEqual(have.Ports, ports):
		return nil
	}
	have.Endpoints, have.Ports = eps, ports
	if err := r.Client.Update(ctx, &have); err != nil {
		return fmt.Errorf("update EndpointSlice %s: %w", name, err)
	}
	return nil
}

// removeStale deletes the address Services (and their slices) of tags
// the split no longer has.
func (r *Reconciler) removeStale(ctx context.Context, rt *servingv1alpha1.Route, keep map[string]bool) error {
	var list corev1.ServiceList
	if err := r.Client.List(ctx, &list, client.InNamespace(rt.Namespace), client.MatchingLabels{servingv1alpha1.RouteLabelKey: rt.Name}); err != nil {
		return fmt.Errorf("list the Route's Services: %w", err)
	}
	for i := range list.Items {
		s := &list.Items[i]
		if keep[s.Name] || !metav1.IsControlledBy(s, rt) {
			continue
		}
		if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete Service %s of a removed tag: %w", s.Name, err)
		}
		for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
			slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: rt.Namespace, Name: endpoints.SliceName(s.Name, family, 0)}}
			if err := r.Client.Delete(ctx, slice); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("delete EndpointSlice %s of a removed tag: %w", slice.Name, err)
			}
		}
	}
	return nil
}

func labelsHold(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
