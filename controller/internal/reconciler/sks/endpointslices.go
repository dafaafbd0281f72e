package sks

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
	"github.com/sockscale/sockscale/internal/podaddr"
)

// podSlices are the private Service's EndpointSlices of families (the
// public Service's, endpoints.Families) as the public Service should
// carry them, IPv4 ones first, each family in name order: every endpoint
// as it is, with its conditions (ready, serving, terminating) and
// topology hints, so kube-proxy treats the public Service as it would a
// selector Service (terminating endpoints still serving take over while
// none is ready; topology-aware routing keeps its zones). A family the
// public Service does not have is left out: it would carry no slice of
// it.
func (r *ServerlessService) podSlices(ctx context.Context, ns, service string, families []discoveryv1.AddressType) ([]discoveryv1.EndpointSlice, error) {
	var list discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s: %w", service, err)
	}
	var out []discoveryv1.EndpointSlice
	for _, s := range list.Items {
		if !slices.Contains(families, s.AddressType) || len(s.Endpoints) == 0 {
			continue // FQDN slices, or a family the public Service lacks
		}
		mirror := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: s.Name}, AddressType: s.AddressType, Ports: s.Ports}
		for i := range s.Endpoints {
			mirror.Endpoints = append(mirror.Endpoints, *s.Endpoints[i].DeepCopy())
		}
		out = append(out, mirror)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].AddressType != out[j].AddressType {
			return out[i].AddressType == discoveryv1.AddressTypeIPv4
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// readyEndpoints flattens slices' ready endpoints for the mode decision:
// one per pod, however many families list it (a dual-stack pod is in an
// IPv4 and an IPv6 slice), known by its IPv4 address if it has one
// (package podaddr). An endpoint that names no pod counts for each
// address.
func readyEndpoints(slices []discoveryv1.EndpointSlice) []endpoints.Endpoint {
	var out []endpoints.Endpoint
	byPod := make(map[string]int)
	for _, s := range slices {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			name := ""
			if e.TargetRef != nil {
				name = e.TargetRef.Name
			}
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				ip = ip.Unmap()
				i, seen := byPod[name]
				if name == "" || !seen {
					if name != "" {
						byPod[name] = len(out)
					}
					out = append(out, endpoints.Endpoint{Name: name, IP: ip, Addrs: []netip.Addr{ip}})
					continue
				}
				out[i].Addrs = append(out[i].Addrs, ip)
				out[i].IP = podaddr.Pick(out[i].Addrs)
			}
		}
	}
	return out
}

// activatorsForPodlessFamilies is the Serve mode's slices: podSlices,
// and for each of the public Service's families in which no pod is ready
// yet, the activators' slice of that family instead of none. Kubernetes'
// EndpointSlice controller writes a dual-stack Service's IPv4 and IPv6
// slices one after the other: a pod may be ready in one family a moment
// before the other, and a family without an endpoint is refused by
// kube-proxy (connection refused) where the activators would hold its
// requests (measured: 76 of 372 new IPv4 connections refused at the
// switch to Serve before this).
//
// The activators' slice comes first in its family, so it keeps the name
// it had in Proxy mode (<public>-sockscale-0): were the not-ready pods'
// slice written under that name, the family would have no ready endpoint
// until the activators' slice was created under the next one, and a
// kube-proxy sync in between refused that family's new connections for
// a whole sync period (57 of 357 in one run).
func (r *ServerlessService) activatorsForPodlessFamilies(public *corev1.Service, port int32, acts []endpoints.Endpoint, podSlices []discoveryv1.EndpointSlice) []discoveryv1.EndpointSlice {
	ready := map[discoveryv1.AddressType]bool{}
	for _, s := range podSlices {
		if hasReady(s) {
			ready[s.AddressType] = true
		}
	}
	waiting := map[discoveryv1.AddressType]discoveryv1.EndpointSlice{}
	for _, s := range r.proxySlices(public, port, acts, nil) {
		if !ready[s.AddressType] && len(s.Endpoints) > 0 {
			waiting[s.AddressType] = s
		}
	}
	var want []discoveryv1.EndpointSlice
	for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		if s, ok := waiting[family]; ok {
			want = append(want, s)
		}
		for _, s := range podSlices {
			if s.AddressType == family {
				want = append(want, s)
			}
		}
	}
	return want
}

// hasReady says whether s has an endpoint that kube-proxy sends new
// connections to: ready, or of unknown readiness (which it takes as
// ready).
func hasReady(s discoveryv1.EndpointSlice) bool {
	for _, e := range s.Endpoints {
		if e.Conditions.Ready == nil || *e.Conditions.Ready {
			return true
		}
	}
	return false
}

// activators are the ready activator pods.
func (r *ServerlessService) activators(ctx context.Context) ([]endpoints.Endpoint, error) {
	return endpoints.ReadyActivators(ctx, r.Client, r.ActivatorNamespace, r.ActivatorSelector)
}

// servedPort is the name of the public Service's port that goes through
// the activators in Proxy mode: the one numbered port (spec.port), or
// every port (all false) when port is 0 or not among the Service's.
func servedPort(public *corev1.Service, port int32) (name string, all bool) {
	if port != 0 {
		for _, p := range public.Spec.Ports {
			if p.Port == port {
				return p.Name, false
			}
		}
	}
	return "", true
}

// proxySlices are the public endpoints in Proxy mode: for each of the
// public Service's families, the served port (or every port) to the
// activators' port at their addresses of that family (none when no
// activator has one: the family's clients fail rather than bypass the
// activators), and the public Service's other ports still to the pods,
// which the activator would not forward them to.
func (r *ServerlessService) proxySlices(public *corev1.Service, port int32, acts []endpoints.Endpoint, pods []discoveryv1.EndpointSlice) []discoveryv1.EndpointSlice {
	served, all := servedPort(public, port)
	var ports []discoveryv1.EndpointPort
	for _, p := range public.Spec.Ports {
		if all || p.Name == served {
			ports = append(ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(r.ActivatorPort)})
		}
	}
	var out []discoveryv1.EndpointSlice
	for _, family := range endpoints.Families(public) {
		s := discoveryv1.EndpointSlice{AddressType: family, Ports: ports}
		for _, a := range acts {
			ip, ok := a.AddrOf(family)
			if !ok {
				continue
			}
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: r.ActivatorNamespace, Name: a.Name},
			})
		}
		out = append(out, s)
	}
	if all {
		return out
	}
	for _, ps := range pods {
		other := ps
		other.Ports = nil
		for _, p := range ps.Ports {
			if ptr.Deref(p.Name, "") != served {
				other.Ports = append(other.Ports, p)
			}
		}
		if len(other.Ports) > 0 && len(other.Endpoints) > 0 {
			out = append(out, other)
		}
	}
	return out
}

// Managers of EndpointSlices other than sockscale that a public Service
// may have slices of.
const (
	// managerKubernetes is Kubernetes' EndpointSlice controller: its slices
	// of a public Service are left from when the Service had a selector.
	// It manages no slices of a Service without one, so nobody else
	// writes them any more.
	managerKubernetes = "endpointslice-controller.k8s.io"
	// managerMirroring mirrors an Endpoints object of the Service's name
	// into slices (and recreates a deleted slice while the object exists).
	managerMirroring = "endpointslicemirroring-controller.k8s.io"
	// labelEndpointsManagedBy and endpointsController mark an Endpoints
	// object written by Kubernetes' Endpoints controller (for a Service
	// with a selector); the mirroring controller copies the label onto its
	// slices.
	labelEndpointsManagedBy = "endpoints.kubernetes.io/managed-by"
	endpointsController     = "endpoint-controller"
)

// writeSlices makes the public Service's EndpointSlices equal to want
// (each split at Kubernetes' 1000 endpoints per slice), named
// <public>-sockscale-<i> for IPv4 and <public>-sockscale-v6-<i> for IPv6
// (endpoints.SliceName), i counted per family; slices of a family no
// longer wanted (the Service lost it) are deleted. Slices Kubernetes' EndpointSlice controller left
// from a removed selector, and its mirror of the Endpoints object its
// Endpoints controller left (with that object), are taken over: removed
// once sockscale's are written. For a slice of any other manager it writes nothing and returns
// a message naming the command that removes it: two writers would fight.
func (r *ServerlessService) writeSlices(ctx context.Context, sks *v1alpha1.ServerlessService, public *corev1.Service, want []discoveryv1.EndpointSlice) (string, error) {
	var have discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &have, client.InNamespace(public.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: public.Name}); err != nil {
		return "", fmt.Errorf("list EndpointSlices of %s: %w", public.Name, err)
	}
	existing := make(map[string]*discoveryv1.EndpointSlice)
	var leftovers []*discoveryv1.EndpointSlice
	var mirroredFrom []metav1.OwnerReference
	for i := range have.Items {
		s := &have.Items[i]
		switch manager := s.Labels[discoveryv1.LabelManagedBy]; {
		case metav1.IsControlledBy(s, sks):
			existing[s.Name] = s
		case manager == managerKubernetes:
			leftovers = append(leftovers, s)
		case manager == managerMirroring && s.Labels[labelEndpointsManagedBy] == endpointsController:
			// Mirrored from the Endpoints object that Kubernetes' Endpoints
			// controller wrote while the Service had a selector (a user's
			// removed one, or the one an uninstall handed back): a leftover
			// like the slices above, and its source must go too, or the
			// mirror comes back.
			leftovers = append(leftovers, s)
			mirroredFrom = append(mirroredFrom, s.OwnerReferences...)
		case manager == managerMirroring:
			return fmt.Sprintf("EndpointSlice %q of Service %q is mirrored by Kubernetes from the Endpoints object %q: delete that so the public endpoints have one writer (kubectl -n %s delete endpoints %s)",
				s.Name, public.Name, public.Name, public.Namespace, public.Name), nil
		default:
			return fmt.Sprintf("EndpointSlice %q of Service %q is managed by %q, not sockscale: delete it so the public endpoints have one writer (kubectl -n %s delete endpointslice %s)",
				s.Name, public.Name, manager, public.Namespace, s.Name), nil
		}
	}
	type chunk struct {
		name  string
		slice discoveryv1.EndpointSlice
	}
	var chunks []chunk
	perFamily := map[discoveryv1.AddressType]int{}
	for _, w := range want {
		for start := 0; start < len(w.Endpoints); start += maxSliceEndpoints {
			c := w
			c.Endpoints = w.Endpoints[start:min(start+maxSliceEndpoints, len(w.Endpoints))]
			chunks = append(chunks, chunk{endpoints.SliceName(public.Name, w.AddressType, perFamily[w.AddressType]), c})
			perFamily[w.AddressType]++
		}
	}
	// Slices with a ready endpoint are written first: a family whose
	// endpoints move from one slice to another (activators to pods) then
	// has a ready endpoint at every moment in between, so a kube-proxy
	// sync between two writes never finds none and refuses connections
	// until its next sync. Deletions come last for the same reason.
	sort.SliceStable(chunks, func(i, j int) bool { return hasReady(chunks[i].slice) && !hasReady(chunks[j].slice) })
	for _, ch := range chunks {
		name, c := ch.name, ch.slice
		s, ok := existing[name]
		delete(existing, name)
		if ok && s.AddressType != c.AddressType {
			// The address type cannot change: a slice of this name from
			// before (another family under the name) goes, and is made anew.
			if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
				return "", fmt.Errorf("delete EndpointSlice %s of address type %s to write it as %s: %w", name, s.AddressType, c.AddressType, err)
			}
			ok = false
		}
		if !ok {
			s = &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: public.Namespace, Name: name, Labels: map[string]string{
				discoveryv1.LabelServiceName: public.Name, discoveryv1.LabelManagedBy: ManagedBy, LabelServerlessService: sks.Name,
			}}}
			if err := controllerutil.SetControllerReference(sks, s, r.Client.Scheme()); err != nil {
				return "", err
			}
		} else if s.AddressType == c.AddressType && equality.Semantic.DeepEqual(s.Endpoints, c.Endpoints) && equality.Semantic.DeepEqual(s.Ports, c.Ports) {
			continue
		}
		s.AddressType, s.Endpoints, s.Ports = c.AddressType, c.Endpoints, c.Ports
		var err error
		if ok {
			err = r.Client.Update(ctx, s)
		} else {
			err = r.Client.Create(ctx, s)
		}
		if err != nil {
			return "", fmt.Errorf("write EndpointSlice %s: %w", name, err)
		}
	}
	for _, s := range existing {
		if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return "", fmt.Errorf("delete EndpointSlice %s: %w", s.Name, err)
		}
	}
	// The mirrored Endpoints first, so the mirror is not written again;
	// the uid precondition deletes only the object that was mirrored.
	for _, ref := range mirroredFrom {
		if ref.Kind != "Endpoints" {
			continue
		}
		ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Namespace: public.Namespace, Name: ref.Name}} //nolint:staticcheck // deprecated, yet Kubernetes' Endpoints controller still writes it; removing its leftover is the point
		if err := r.Client.Delete(ctx, ep, client.Preconditions{UID: &ref.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			return "", fmt.Errorf("delete Endpoints %s left by Kubernetes from a removed selector: %w", ref.Name, err)
		}
	}
	for _, s := range leftovers {
		if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return "", fmt.Errorf("delete EndpointSlice %s left by Kubernetes from a removed selector: %w", s.Name, err)
		}
		log.FromContext(ctx).Info("took over the public Service's endpoints: removed a slice Kubernetes left from its removed selector",
			"service", public.Name, "endpointSlice", s.Name)
	}
	return "", nil
}

// deleteOwnSlices deletes the EndpointSlices of Service service that this
// ServerlessService wrote: labelled as sockscale's and controlled by it.
// A label alone is not proof (anyone may set it), and a slice of another
// ServerlessService naming the same Service is that one's to remove.
func (r *ServerlessService) deleteOwnSlices(ctx context.Context, sks *v1alpha1.ServerlessService, service string) error {
	var have discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &have, client.InNamespace(sks.Namespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: ManagedBy,
	}); err != nil {
		return fmt.Errorf("list EndpointSlices of %s: %w", service, err)
	}
	for i := range have.Items {
		s := &have.Items[i]
		if !metav1.IsControlledBy(s, sks) {
			continue
		}
		if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete EndpointSlice %s of Service %s: %w", s.Name, service, err)
		}
		log.FromContext(ctx).Info("deleted an EndpointSlice sockscale wrote: the public Service is gone or has a selector",
			"service", service, "endpointSlice", s.Name)
	}
	return nil
}
