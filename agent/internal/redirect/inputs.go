// This file: Compute's inputs, read from the caches.

package redirect

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// inputs reads Compute's inputs from the caches.
func (r *Reconciler) inputs(ctx context.Context) (Inputs, error) {
	in := Inputs{
		Services:      make(map[types.NamespacedName]*corev1.Service),
		Activators:    make(map[string][]netip.Addr),
		ActivatorPort: r.opts.ActivatorPort,
	}
	var skses v1alpha1.ServerlessServiceList
	if err := r.cache.List(ctx, &skses); err != nil {
		return in, fmt.Errorf("list ServerlessServices: %w", err)
	}
	in.ServerlessServices = skses.Items
	for i := range skses.Items {
		s := &skses.Items[i]
		key := types.NamespacedName{Namespace: s.Namespace, Name: s.Spec.PublicService}
		var svc corev1.Service
		if err := r.cache.Get(ctx, key, &svc); err == nil {
			in.Services[key] = &svc
		}
	}
	if err := r.routeInputs(ctx, &in); err != nil {
		return in, err
	}
	var pods corev1.PodList
	if err := r.cache.List(ctx, &pods); err != nil {
		return in, fmt.Errorf("list activator pods: %w", err)
	}
	dup := make(map[string]bool)
	for i := range pods.Items {
		p := &pods.Items[i]
		ips, ok := isReadyActivator(p)
		if !ok {
			continue
		}
		// status.activators names pods without their namespace: with
		// activators in several namespaces, a name two of them share
		// cannot be told apart, and neither is used.
		if _, seen := in.Activators[p.Name]; seen || dup[p.Name] {
			dup[p.Name] = true
			delete(in.Activators, p.Name)
			continue
		}
		in.Activators[p.Name] = ips
	}
	return in, nil
}

// routeInputs reads the Routes' part of Compute's inputs: the Services
// with the route label, and, while the Routes' watch works, the Routes and
// the public Services of the revisions in their status.traffic.
func (r *Reconciler) routeInputs(ctx context.Context, in *Inputs) error {
	var svcs corev1.ServiceList
	if err := r.cache.List(ctx, &svcs, client.HasLabels{servingv1alpha1.RouteLabelKey}); err != nil {
		return fmt.Errorf("list Route Services: %w", err)
	}
	for i := range svcs.Items {
		in.RouteServices = append(in.RouteServices, &svcs.Items[i])
	}
	rc := r.routes.current()
	if rc == nil {
		in.RoutesUnavailable = true
		return nil
	}
	var routes servingv1alpha1.RouteList
	if err := rc.List(ctx, &routes); err != nil {
		// The Routes' cache is apart so that it never holds up the rest.
		r.opts.Log.Warn("redirect: list Routes; their addresses get no entry until the next sync", "err", err)
		in.RoutesUnavailable = true
		return nil
	}
	in.Routes = routes.Items
	for _, rt := range routes.Items {
		for _, tt := range rt.Status.Traffic {
			key := types.NamespacedName{Namespace: rt.Namespace, Name: tt.RevisionName}
			if _, done := in.Services[key]; done || tt.RevisionName == "" {
				continue
			}
			var svc corev1.Service
			if err := r.cache.Get(ctx, key, &svc); err == nil {
				in.Services[key] = &svc
			}
		}
	}
	return nil
}
