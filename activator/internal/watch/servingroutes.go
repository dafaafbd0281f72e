package watch

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// The serving API's Routes (serving.sockscale.dev). The controller gives
// a Route Kubernetes Services, labelled serving.sockscale.dev/route (and
// serving.sockscale.dev/tag for a tag's): the activator finds them among
// the Services it already watches, and the split in the Routes'
// status.traffic, which it watches only where it can. A cluster without
// the serving CRDs, or an RBAC that does not grant routes, keeps its
// public Services served as before: the activator logs once what is off
// and tries again every RouteRetryPeriod.

// DefaultRouteRetryPeriod is how often Routes are tried again while they
// cannot be watched.
const DefaultRouteRetryPeriod = 30 * time.Second

// routeListTimeout bounds the check that Routes can be listed, and the
// wait for their informer's first list.
const routeListTimeout = time.Minute

func (w *Watcher) retryPeriod() time.Duration {
	if w.RouteRetryPeriod > 0 {
		return w.RouteRetryPeriod
	}
	return DefaultRouteRetryPeriod
}

// The Routes' informer and routesUnreadable's one direct list.
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=routes,verbs=list;watch

// routesUnreadable says why Routes cannot be watched ("": they can): a
// list through APIReader, as the informer's first list would do, tells a
// missing CRD and an RBAC refusal apart from a passing error.
func (w *Watcher) routesUnreadable(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, routeListTimeout)
	defer cancel()
	err := w.APIReader.List(ctx, &servingv1alpha1.RouteList{}, client.Limit(1))
	switch {
	case err == nil:
		return ""
	case meta.IsNoMatchError(err), apierrors.IsNotFound(err):
		return fmt.Sprintf("the serving API is not installed (no routes.%s/%s): %v", servingv1alpha1.GroupVersion.Group, servingv1alpha1.GroupVersion.Version, err)
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("RBAC forbids listing routes.%s (the activator's ClusterRole needs get, list and watch on them): %v", servingv1alpha1.GroupVersion.Group, err)
	default:
		return fmt.Sprintf("list routes.%s: %v", servingv1alpha1.GroupVersion.Group, err)
	}
}

// watchRoutes adds the Routes' informer, whose events enqueue the Route.
func (w *Watcher) watchRoutes(ctx context.Context) error {
	route := &servingv1alpha1.Route{}
	inf, err := w.Cache.GetInformer(ctx, route)
	if err != nil {
		return fmt.Errorf("watch Routes: %w", err)
	}
	if _, err := inf.AddEventHandler(w.handler(func(o client.Object) []item {
		return []item{{key: target.Key{Namespace: o.GetNamespace(), Name: o.GetName()}, route: true}}
	})); err != nil {
		return fmt.Errorf("watch Routes: %w", err)
	}
	w.routes.Store(true)
	return nil
}

// retryRoutes tries to watch Routes every retry period until it can, or
// ctx ends. The first failure was logged by Run; later ones only at debug
// level, so a cluster without the serving API does not fill the log.
func (w *Watcher) retryRoutes(ctx context.Context) {
	tick := time.NewTicker(w.retryPeriod())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if why := w.routesUnreadable(ctx); why != "" {
			w.Log.Debug("serving Routes still not watched", "reason", why)
			continue
		}
		wait, cancel := context.WithTimeout(ctx, routeListTimeout)
		err := w.watchRoutes(wait)
		cancel()
		if err != nil {
			// An informer that never synced would retry for ever on its
			// own: stop it, and try again from the start.
			_ = w.Cache.RemoveInformer(ctx, &servingv1alpha1.Route{})
			w.Log.Debug("serving Routes still not watched", "reason", err)
			continue
		}
		// The informer's first list enqueued every Route; the Services
		// labelled with one were synced already.
		w.Log.Info("serving Routes are watched now")
		return
	}
}

// routeItems lists every Route and every Service labelled with a Route,
// for the first sync.
func (w *Watcher) routeItems(ctx context.Context) ([]item, error) {
	var routes servingv1alpha1.RouteList
	if err := w.Cache.List(ctx, &routes); err != nil {
		return nil, fmt.Errorf("list Routes: %w", err)
	}
	var svcs corev1.ServiceList
	if err := w.Cache.List(ctx, &svcs, client.HasLabels{servingv1alpha1.RouteLabelKey}); err != nil {
		return nil, fmt.Errorf("list Services of Routes: %w", err)
	}
	items := make([]item, 0, len(routes.Items)+len(svcs.Items))
	for i := range routes.Items {
		items = append(items, item{key: target.Key{Namespace: routes.Items[i].Namespace, Name: routes.Items[i].Name}, route: true})
	}
	for i := range svcs.Items {
		items = append(items, item{key: target.Key{Namespace: svcs.Items[i].Namespace, Name: svcs.Items[i].Name}})
	}
	return items, nil
}

// SyncRoute makes the table's Route k equal to what r holds.
func (w *Watcher) SyncRoute(ctx context.Context, r client.Reader, k target.Key) error {
	var route servingv1alpha1.Route
	if err := r.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: k.Name}, &route); apierrors.IsNotFound(err) {
		w.Table.DeleteRoute(k)
		return nil
	} else if err != nil {
		return fmt.Errorf("get Route %s: %w", k, err)
	}
	w.Table.UpsertRoute(routeOf(&route))
	return nil
}

// routeOf is the split of a Route's status.traffic (an unset percent is
// 0).
func routeOf(route *servingv1alpha1.Route) resolve.Route {
	r := resolve.Route{Key: target.Key{Namespace: route.Namespace, Name: route.Name}}
	for _, t := range route.Status.Traffic {
		var p int64
		if t.Percent != nil {
			p = *t.Percent
		}
		r.Traffic = append(r.Traffic, resolve.Traffic{Revision: t.RevisionName, Tag: t.Tag, Percent: p})
	}
	return r
}

// syncRouteService puts a Route's Service (no PodAutoscaler names it) in
// the table with its addresses, ports and Ingress/HTTPRoute hosts. A
// Service that was a target before stops being one.
func (w *Watcher) syncRouteService(ctx context.Context, r client.Reader, svc *corev1.Service) error {
	k := target.Key{Namespace: svc.Namespace, Name: svc.Name}
	hosts, conflicts, err := w.routeHosts(ctx, r, k)
	if err != nil {
		return err
	}
	s := resolve.RouteService{
		Key:        k,
		Route:      svc.Labels[servingv1alpha1.RouteLabelKey],
		Tag:        svc.Labels[servingv1alpha1.TagLabelKey],
		ClusterIPs: clusterIPs(svc),
		Hosts:      hosts,
	}
	for _, p := range svc.Spec.Ports {
		if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
			s.Ports = append(s.Ports, uint16(p.Port))
		}
	}
	if err := w.Table.UpsertRouteService(s); err != nil {
		// A label that is no Route name; logged, not retried.
		w.Log.Error("route Service refused", "service", k.String(), "error", err)
		w.remove(k)
		return nil
	}
	w.forgetTarget(k)
	w.setConflicts(k, conflicts)
	return nil
}
