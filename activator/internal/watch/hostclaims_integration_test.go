package watch

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/sockscale/sockscale/activator/internal/readiness"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationRouteHostClaims runs the host-claim rules on a real
// kube-apiserver's watches, with HTTPRoute status written through its
// subresource as a Gateway's controller writes it: an HTTPRoute's host
// resolves only while a Gateway accepts the route's current generation;
// a newer route of another namespace claiming the host takes nothing
// (counted as a conflict) until the older route is deleted, when the
// host passes to it without any event of its own.
func TestIntegrationRouteHostClaims(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := cl.Client
	for _, ns := range []string{"team", "tenant-z"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	web := target.Key{Namespace: "tenant-z", Name: "web"}
	for _, k := range []target.Key{hello, web} {
		svc := service(k.Name, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
		svc.Namespace, svc.Spec.ClusterIP, svc.Spec.ClusterIPs = k.Namespace, "", nil
		if err := c.Create(ctx, svc); err != nil {
			t.Fatal(err)
		}
		p := pa(k.Name, k.Name, 0)
		p.Namespace, p.CreationTimestamp = k.Namespace, metav1.Time{}
		createTarget(ctx, t, c, p)
	}

	cl.InstallHTTPRouteCRD(t)
	mapper, err := apiutil.NewDynamicRESTMapper(cl.Config, must(rest.HTTPClientFor(cl.Config)))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cache.New(cl.Config, cache.Options{Scheme: scheme(t), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	table := resolve.NewTable("")
	w := &Watcher{Cache: ca, Table: table, Throttle: throttle.New(throttle.Options{Self: "activator-a"}),
		Pods: &lockedPods{pods: map[target.Key][]readiness.Pod{}}, Mapper: mapper, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	resolvesTo := func(host string, want target.Key) func() string {
		return func() string {
			got, err := table.Resolve("", host)
			if err != nil {
				return err.Error()
			}
			if got.Key != want {
				return host + " resolves to " + got.Key.String() + ", want " + want.String()
			}
			return ""
		}
	}
	resolvesNot := func(host string) func() string {
		return func() string {
			if got, err := table.Resolve("", host); err == nil {
				return host + " resolves to " + got.Key.String()
			}
			return ""
		}
	}

	// An HTTPRoute no Gateway took claims nothing. The Ingress, created
	// after it, resolving first says the watcher has seen both.
	if err := c.Create(ctx, httpRoute("team", "shop", 0, nil, []string{"shop.example.com"}, "hello")); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, ingress("www", "", rule("www.example.com", "hello"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Ingress's host resolves (an Ingress counts as written)", resolvesTo("www.example.com", hello))
	eventually(t, "the HTTPRoute's host does not resolve before a Gateway accepts it", resolvesNot("shop.example.com"))

	setParents(ctx, t, c, "team", "shop", "True", 0)
	eventually(t, "the HTTPRoute's host resolves once accepted", resolvesTo("shop.example.com", hello))
	setParents(ctx, t, c, "team", "shop", "False", 0)
	eventually(t, "the HTTPRoute's host stops resolving when refused", resolvesNot("shop.example.com"))
	setParents(ctx, t, c, "team", "shop", "True", 0)
	eventually(t, "the HTTPRoute's host resolves once accepted again", resolvesTo("shop.example.com", hello))

	// A spec edit bumps the generation: the acceptance is of the old one.
	route := newHTTPRoute()
	if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "shop"}, route); err != nil {
		t.Fatal(err)
	}
	route.Object["spec"].(map[string]any)["hostnames"] = []any{"shop.example.com", "store.example.com"}
	if err := c.Update(ctx, route); err != nil {
		t.Fatal(err)
	}
	eventually(t, "an edited route's hosts wait for the Gateway to accept the new generation", resolvesNot("shop.example.com"))
	setParents(ctx, t, c, "team", "shop", "True", 0)
	eventually(t, "the new generation accepted", resolvesTo("store.example.com", hello))

	// tenant-z's route is newer: it takes nothing, and is counted.
	if err := c.Create(ctx, httpRoute("tenant-z", "shop", 0, nil, []string{"shop.example.com"}, "web")); err != nil {
		t.Fatal(err)
	}
	setParents(ctx, t, c, "tenant-z", "shop", "True", 0)
	eventually(t, "the newer route's claim is counted as a conflict", func() string {
		if n := testutil.ToFloat64(w.claims().gauge); n != 1 {
			return "sockscale_activator_route_host_conflicts is not 1"
		}
		return ""
	})
	eventually(t, "the host stays the older route's", resolvesTo("shop.example.com", hello))

	// The older route goes: the host passes to tenant-z's target, though
	// nothing of tenant-z changed; store.example.com goes with it.
	if err := c.Delete(ctx, route); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the host passes to the remaining route", resolvesTo("shop.example.com", web))
	eventually(t, "the deleted route's other host goes", resolvesNot("store.example.com"))
	eventually(t, "no conflict left", func() string {
		if n := testutil.ToFloat64(w.claims().gauge); n != 0 {
			return "sockscale_activator_route_host_conflicts is not 0"
		}
		return ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
