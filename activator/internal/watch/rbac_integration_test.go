package watch

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// Under exactly the rules its markers generate (list and watch, no get),
// the watcher syncs every watch it has, HTTPRoutes and serving Routes
// included, and serves a target and a Route's host: the markers grant
// all that the code uses.
func TestIntegrationWatcherUnderItsGeneratedRole(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := cl.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}); err != nil {
		t.Fatal(err)
	}
	rev := service("hello-00001", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	rev.Spec.ClusterIP, rev.Spec.ClusterIPs = "", nil
	p := pa("hello-00001", "hello-00001", 0)
	p.CreationTimestamp = metav1.Time{}
	addr := service("hello", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	addr.Spec.ClusterIP, addr.Spec.ClusterIPs = "", nil
	addr.Labels = map[string]string{servingv1alpha1.RouteLabelKey: "hello"}
	percent := int64(100)
	route := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "hello"},
		Spec: servingv1alpha1.RouteSpec{Traffic: []servingv1alpha1.TrafficTarget{{RevisionName: "hello-00001", Percent: &percent}}}}
	createTarget(ctx, t, c, p, slice("hello-00001-private-abcde", "hello-00001-private", map[string]int32{"http": 8080}, ep{ip: "10.244.1.7", ready: true}))
	for _, o := range []client.Object{rev, addr, route} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	route.Status.Traffic = []servingv1alpha1.TrafficTargetStatus{{RevisionName: "hello-00001", Percent: &percent}}
	if err := c.Status().Update(ctx, route); err != nil {
		t.Fatal(err)
	}
	cl.InstallHTTPRouteCRD(t)

	cfg := cl.ConfigAs(t, "activator", testenv.GeneratedRules(t, "activator/role.yaml"))
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, must(rest.HTTPClientFor(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cache.New(cfg, cache.Options{Scheme: scheme(t), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	direct, err := client.New(cfg, client.Options{Scheme: scheme(t), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	table := resolve.NewTable("")
	logs := &lockedBuffer{}
	w := &Watcher{Cache: ca, Table: table, Throttle: throttle.New(throttle.Options{Self: "activator-a"}),
		Pods: &lockedPods{pods: map[target.Key][]readiness.Pod{}}, Mapper: mapper, APIReader: direct,
		Log: slog.New(slog.NewTextHandler(logs, nil))}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	eventually(t, "synced, the revision and the Route's host served", func() string {
		if !w.Synced() {
			return "not synced"
		}
		got, err := table.Resolve("", "hello.team:80")
		if err != nil {
			return err.Error()
		}
		return cmp.Diff(target.Key{Namespace: "team", Name: "hello-00001"}, got.Key)
	})
	for _, bad := range []string{"forbidden", "not watched"} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("the watcher logged %q under its generated role:\n%s", bad, logs.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
