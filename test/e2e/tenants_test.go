package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// tenant is a namespace's user as platforms make them: a ServiceAccount
// bound by a RoleBinding to Kubernetes' default "edit" ClusterRole (into
// which the chart aggregates sockscale's resources) in its namespace
// only. Its Stack's client acts as that ServiceAccount (impersonated), so
// the API server applies the tenant's rights to everything it does.
type tenant struct {
	*stack.Stack
	ns string
}

func newTenant(t *testing.T, s *stack.Stack, ns string) *tenant {
	t.Helper()
	ctx := context.Background()
	const sa = "dev"
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa + "-edit"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
		},
	} {
		if err := s.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("tenant %s: %v", ns, err)
		}
	}
	t.Cleanup(func() {
		_ = s.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	cfg := rest.CopyConfig(shared.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	as, err := stack.New(cfg, s.Kubeconfig, s.Helm, s.ServiceCIDR)
	if err != nil {
		t.Fatal(err)
	}
	// The aggregation controller folds the chart's roles into "edit" a
	// moment after the install.
	e2etest.Eventually(t, time.Minute, "tenant "+ns+" may list PodAutoscalers", func() error {
		return as.Client.List(ctx, &v1alpha1.PodAutoscalerList{}, client.InNamespace(ns))
	})
	return &tenant{Stack: as, ns: ns}
}

// TestE2ETwoTenants: two tenants with only their namespaces' default
// rights act through the API server. Mallory tries the attacks of
// docs/security.md on the shared activators, agents and controller while
// Alice's shop serves a steady load, which must notice nothing: no failed
// request, no pod more or less, its concurrency as offered.
func TestE2ETwoTenants(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	alice, mallory := newTenant(t, s, "alice"), newTenant(t, s, "mallory")

	// Alice: 4 clients of 100 ms requests on a target of 10 x 70 % = 7 a
	// pod: one pod, served directly (TBC 0).
	const offered = 4
	url := e2etest.Deploy(t, alice.Stack, alice.ns, "shop", func(p *v1alpha1.PodAutoscalerSpec) {
		p.Target, p.MinScale, p.MaxScale = ptr.To(10.0), ptr.To(int32(1)), ptr.To(int32(5))
		p.TargetBurstCapacity = ptr.To(0.0)
	}, func(url string) error {
		if a := get(oneShotClient(5*time.Second), url); a.err != nil || a.code != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, a)
		}
		return nil
	})
	where := func() string {
		pa, err := s.PA(ctx, alice.ns, "shop")
		if err != nil {
			return err.Error()
		}
		addrs, ports, err := publicEndpointsIn(ctx, s, alice.ns, "shop")
		return fmt.Sprintf("mode %s, public endpoints %v ports %v (%v)", pa.Status.Mode, addrs, ports, err)
	}
	t.Logf("alice's shop before the load: %s", where())
	load := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=100"}, Concurrency: offered, KeepAlive: true})
	stopLoad := sync.OnceValue(load.Stop)
	t.Cleanup(func() { stopLoad() })
	scales := watchScales(t, alice.Stack, alice.ns, "shop")

	t.Run("namespaced rights only", func(t *testing.T) {
		// Mallory may not write EndpointSlices (the default roles never
		// grant it) nor touch Alice's namespace.
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: mallory.ns, Name: "shop-private-x", Labels: map[string]string{discoveryv1.LabelServiceName: "shop-private"}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		if err := mallory.Client.Create(ctx, slice); !apierrors.IsForbidden(err) {
			t.Errorf("mallory creates an EndpointSlice: %v, want forbidden", err)
		}
		if _, err := mallory.Deployment(ctx, alice.ns, "shop"); !apierrors.IsForbidden(err) {
			t.Errorf("mallory reads alice's Deployment: %v, want forbidden", err)
		}
	})

	t.Run("an impostor is no activator", func(t *testing.T) {
		// A pod of Mallory's with a real activator's name and labels.
		real := readyActivators(t, s, 2, time.Minute)
		var act corev1.Pod
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: real[0].Name}, &act); err != nil {
			t.Fatal(err)
		}
		impostor := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: mallory.ns, Name: act.Name, Labels: act.Labels},
			Spec: corev1.PodSpec{
				NodeName:                      act.Spec.NodeName,
				TerminationGracePeriodSeconds: ptr.To(int64(1)),
				Containers:                    []corev1.Container{{Name: "app", Image: stack.AppImage, Args: []string{"--port=8012", "--shutdown-delay=0s"}}},
			},
		}
		if err := mallory.Client.Create(ctx, impostor); err != nil {
			t.Fatal(err)
		}
		e2etest.Eventually(t, time.Minute, "the impostor runs", func() error {
			if err := mallory.Client.Get(ctx, client.ObjectKeyFromObject(impostor), impostor); err != nil {
				return err
			}
			if impostor.Status.PodIP == "" {
				return fmt.Errorf("phase %s", impostor.Status.Phase)
			}
			return nil
		})
		// The agents have had 3 s to see it (they watch pods).
		time.Sleep(3 * time.Second)
		for i := range 2 {
			node := cluster.NodeName(i)
			if n := scrapeSum(t, s, agentAddr(t, s, node), "sockscale_agent_activators", nil); n != float64(len(real)) {
				t.Errorf("agent of %s: %v activators with the impostor %s/%s running, want %d", node, n, mallory.ns, impostor.Name, len(real))
			}
		}
	})

	t.Run("no loop through a namesake private Service", func(t *testing.T) {
		// Mallory names a public Service like another target's private one,
		// its activators always in the path, so sockscale writes slices of
		// activators under that name: "loopx" must not take them as its
		// pods (before, one request went from activator to activator
		// thousands of times). loopx has no pods (its private Service's
		// name is taken), so its request waits out its 3 s timeout: 504.
		const name, namesake = "loopx", "loopx-private"
		if err := mallory.Deploy(ctx, stack.App{Namespace: mallory.ns, Name: namesake, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
			p.MinScale, p.MaxScale, p.TargetBurstCapacity = ptr.To(int32(1)), ptr.To(int32(1)), ptr.To(-1.0)
		}}); err != nil {
			t.Fatal(err)
		}
		if err := mallory.Deploy(ctx, stack.App{Namespace: mallory.ns, Name: name, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
			p.MinScale, p.TimeoutSeconds = ptr.To(int32(1)), ptr.To(int32(3))
		}}); err != nil {
			t.Fatal(err)
		}
		e2etest.Eventually(t, 2*time.Minute, namesake+" has the activators in its path", func() error {
			return expectActivatorEndpointsIn(ctx, s, mallory.ns, namesake)
		})
		_, loopsBefore, err := activatorSum(ctx, s, "sockscale_activator_error_responses_total", map[string]string{"reason": "loop"})
		if err != nil {
			t.Fatal(err)
		}
		act := readyActivators(t, s, 2, time.Minute)[0]
		localRoute(t, act.IP)
		var a answer
		e2etest.Eventually(t, time.Minute, "a request for "+name+" waits out its timeout", func() error {
			a = raw(netip.AddrPortFrom(act.IP, stack.ActivatorProxyPort), "GET", "GET / HTTP/1.1\r\nHost: "+name+"."+mallory.ns+"\r\n")
			if a.err != nil || a.code != http.StatusGatewayTimeout {
				return fmt.Errorf("%s, want 504 after its 3 s timeout (no pods: its private Service's name is taken)", a)
			}
			return nil
		})
		if _, loops, err := activatorSum(ctx, s, "sockscale_activator_error_responses_total", map[string]string{"reason": "loop"}); err != nil || loops != loopsBefore {
			t.Errorf("requests an activator forwarded reached an activator: %v more (%v)", loops-loopsBefore, err)
		}
	})

	t.Run("a host name stays with its first owner", func(t *testing.T) {
		// Alice's Ingress claims shop.alice.test first; Mallory's claim of
		// the same host, later, is ignored by the activators.
		const host = "shop.alice.test"
		act := readyActivators(t, s, 2, time.Minute)[0]
		localRoute(t, act.IP)
		atHost := func() answer {
			return raw(netip.AddrPortFrom(act.IP, stack.ActivatorProxyPort), "GET", "GET / HTTP/1.1\r\nHost: "+host+"\r\n")
		}
		if err := alice.Client.Create(ctx, ingress(alice.ns, "shop", host, "shop")); err != nil {
			t.Fatal(err)
		}
		e2etest.Eventually(t, time.Minute, host+" leads to alice's shop", func() error {
			if a := atHost(); a.code != http.StatusOK || !strings.HasPrefix(podOf(a.body), "shop-") {
				return fmt.Errorf("%s", a)
			}
			return nil
		})
		time.Sleep(1100 * time.Millisecond) // creation times are whole seconds
		if err := mallory.Client.Create(ctx, ingress(mallory.ns, "squat", host, "loopx-private")); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			time.Sleep(300 * time.Millisecond)
			if a := atHost(); a.code != http.StatusOK || !strings.HasPrefix(podOf(a.body), "shop-") {
				t.Fatalf("with mallory's claim of %s: %s, want alice's shop", host, a)
			}
		}
	})

	t.Run("the activator keeps alice's NetworkPolicies", func(t *testing.T) {
		// Alice admits to shop's pods only her own namespace's pods, the
		// activators (which carry her callers' requests in Proxy mode) and
		// the node (her traffic from outside; her steady load's kept-alive
		// connections may have been opened through an activator while shop
		// was still at Proxy). Mallory's pod asks an activator for shop by
		// name: the activator applies Alice's policy to Mallory's pod and
		// refuses; the same request from Alice's pod is served.
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: alice.ns, Name: "shop-callers"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "shop"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: alice.ns}}},
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: stack.Namespace}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(cluster.HostIP, 32).String()}},
				}}},
			},
		}
		if err := alice.Client.Create(ctx, np); err != nil {
			t.Fatal(err)
		}
		act := readyActivators(t, s, 2, time.Minute)[0]
		localRoute(t, act.IP)
		at := netip.AddrPortFrom(act.IP, stack.ActivatorProxyPort)
		host := "shop." + alice.ns
		intruder := newClientSandboxIn(t, mallory.Stack, mallory.ns, "intruder", cluster.NodeName(0))
		caller := newClientSandboxIn(t, alice.Stack, alice.ns, "caller", cluster.NodeName(1))
		e2etest.Eventually(t, time.Minute, "the activators apply alice's policy to mallory's pod", func() error {
			if r := intruder.onceAs(t, host, 10*time.Second, at)[0]; r.Code != http.StatusForbidden {
				return fmt.Errorf("mallory's pod asks for %s: %d %s, want 403", host, r.Code, r.Err)
			}
			return nil
		})
		if r := caller.onceAs(t, host, 10*time.Second, at)[0]; r.Code != http.StatusOK || !strings.HasPrefix(r.Pod, "shop-") {
			t.Errorf("alice's pod asks for %s: %d %q %s, want 200 from a pod of shop", host, r.Code, r.Pod, r.Err)
		}
	})

	t.Run("a Revision cannot mount the node", func(t *testing.T) {
		// Privileged containers are refused by the API server; a hostPath
		// volume is deployed only where the platform enabled it (not by
		// default): the Revision says why and no Deployment is made.
		priv := servingService("rootme", "x", nil)
		priv.Namespace = mallory.ns
		priv.Spec.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		if err := mallory.Client.Create(ctx, priv); err == nil || !strings.Contains(err.Error(), "privileged") {
			t.Errorf("a privileged serving Service: %v, want refused naming privileged", err)
		}
		node := servingService("nodefs", "x", nil)
		node.Namespace = mallory.ns
		node.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		node.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "root", MountPath: "/host"}}
		if err := mallory.Client.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		e2etest.Eventually(t, time.Minute, "the Revision of nodefs says why it is not deployed", func() error {
			var revs servingv1alpha1.RevisionList
			if err := mallory.Client.List(ctx, &revs, client.InNamespace(mallory.ns), client.MatchingLabels{servingv1alpha1.ServiceLabelKey: "nodefs"}); err != nil {
				return err
			}
			if len(revs.Items) != 1 {
				return fmt.Errorf("%d Revisions", len(revs.Items))
			}
			c := meta.FindStatusCondition(revs.Items[0].Status.Conditions, "Ready")
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "FieldNotAllowed" || !strings.Contains(c.Message, "hostPath") {
				return fmt.Errorf("Ready %+v", c)
			}
			return nil
		})
		var deploys appsv1.DeploymentList
		if err := s.Client.List(ctx, &deploys, client.InNamespace(mallory.ns)); err != nil {
			t.Fatal(err)
		}
		for _, d := range deploys.Items {
			if strings.HasPrefix(d.Name, "nodefs") {
				t.Errorf("Deployment %s made for a Revision with a hostPath volume", d.Name)
			}
		}
	})

	res := stopLoad()
	t.Logf("alice's shop after the load: %s", where())
	if res.Failed > 0 || res.Completed == 0 {
		t.Errorf("alice's load: %d completed, %d failed (e.g. %v), want 0 failed", res.Completed, res.Failed, res.FirstError)
	}
	if got := scales(); !slices.Equal(got, []int32{1}) {
		t.Errorf("alice's shop wanted %v pods over the test, want [1]", got)
	}
	pa, err := alice.PA(ctx, alice.ns, "shop")
	if err != nil {
		t.Fatal(err)
	}
	var stable float64
	if _, err := fmt.Sscan(pa.Status.StableValue, &stable); err != nil || stable < offered*0.75 || stable > offered*1.25 {
		t.Errorf("alice's shop: stable concurrency %q under %d offered, want within 25 %% (%v)", pa.Status.StableValue, offered, err)
	}
}

// watchScales polls a target's desired scale every 200 ms until the test
// ends; the returned func gives the distinct values seen, in order.
func watchScales(t *testing.T, s *stack.Stack, ns, name string) func() []int32 {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var seen []int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if pa, err := s.PA(ctx, ns, name); err == nil && pa.Status.DesiredScale != nil {
				mu.Lock()
				if len(seen) == 0 || seen[len(seen)-1] != *pa.Status.DesiredScale {
					seen = append(seen, *pa.Status.DesiredScale)
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() []int32 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// ingress routes host to the Service backend (port 80) of namespace ns.
func ingress(ns, name, host, backend string) *networkingv1.Ingress {
	return &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{
			Host: host,
			IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{
				Path: "/", PathType: ptr.To(networkingv1.PathTypePrefix),
				Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: backend, Port: networkingv1.ServiceBackendPort{Number: 80}}},
			}}}},
		}}},
	}
}

// TestE2EHeldRequestsSharedAmongTenants: an activator holds a bounded
// number of requests for all namespaces together (installed small here)
// and shares them fairly. Eve fills one activator's whole bound with
// requests for a target that never gets a ready pod, and her further
// requests get 503 with Retry-After at once; Bob's first request for his
// target at zero, sent to the same activator, is still held (one of
// Eve's newest is shed for it) and answered 200 by the pod its cold start
// brings.
func TestE2EHeldRequestsSharedAmongTenants(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const maxHeld, extra = 20, 5
	sets := append(slices.Clone(chartSets), fmt.Sprintf("activator.maxHeld=%d", maxHeld))
	if err := s.Install(ctx, sets...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Install(ctx, chartSets...); err != nil {
			t.Errorf("reinstall the chart as the package had it: %v", err)
		}
		readyActivators(t, s, 2, 2*time.Minute)
	})
	bob, eve := newTenant(t, s, "bob"), newTenant(t, s, "eve")

	// Eve's sink: its image does not exist, so its requests are held
	// until their 12 s timeout. Bob's shop starts at zero (initial scale
	// 0): its first request is a real cold start.
	if err := eve.Deploy(ctx, stack.App{Namespace: eve.ns, Name: "sink", Image: unknownImage, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.TimeoutSeconds = ptr.To(int32(12))
	}}); err != nil {
		t.Fatal(err)
	}
	if err := bob.Deploy(ctx, stack.App{Namespace: bob.ns, Name: "shop", Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.InitialScale, p.MinScale = ptr.To(int32(0)), ptr.To(int32(0))
	}}); err != nil {
		t.Fatal(err)
	}
	for _, target := range []struct{ ns, name string }{{eve.ns, "sink"}, {bob.ns, "shop"}} {
		e2etest.Eventually(t, time.Minute, target.ns+"/"+target.name+" waits behind the activators", func() error {
			if err := expectActivatorEndpointsIn(ctx, s, target.ns, target.name); err != nil {
				return err
			}
			return activatorsKnowIn(ctx, s, target.ns, target.name)
		})
	}
	e2etest.Eventually(t, time.Minute, "bob's shop at zero before its first request", func() error {
		d, err := s.Deployment(ctx, bob.ns, "shop")
		if err != nil {
			return err
		}
		if *d.Spec.Replicas != 0 || d.Status.Replicas != 0 {
			return fmt.Errorf("%d pods wanted, %d left", *d.Spec.Replicas, d.Status.Replicas)
		}
		return nil
	})

	act := readyActivators(t, s, 2, time.Minute)[0]
	localRoute(t, act.IP)
	proxy := netip.AddrPortFrom(act.IP, stack.ActivatorProxyPort)
	heldNow := func() (float64, error) {
		m, err := s.Scrape(ctx, act.IP, stack.ActivatorMetricsPort)
		if err != nil {
			return 0, err
		}
		if got := stack.Sum(m, "sockscale_activator_max_held_requests", nil); got != maxHeld {
			return 0, fmt.Errorf("activator %s bounds held requests at %v, want the installed %d", act.Name, got, maxHeld)
		}
		return stack.Sum(m, "sockscale_activator_held_requests", nil), nil
	}
	sink := "GET / HTTP/1.1\r\nHost: sink." + eve.ns + "\r\n"
	flood := make([]answer, maxHeld)
	var wg sync.WaitGroup
	for i := range flood {
		wg.Go(func() { flood[i] = raw(proxy, "GET", sink) })
	}
	defer wg.Wait()
	e2etest.Eventually(t, 10*time.Second, fmt.Sprintf("eve holds all %d places of %s", maxHeld, act.Name), func() error {
		n, err := heldNow()
		if err == nil && n != maxHeld {
			err = fmt.Errorf("%v held", n)
		}
		return err
	})
	for i := range extra {
		a := raw(proxy, "GET", sink)
		if a.err != nil || a.code != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || a.took > time.Second {
			t.Errorf("eve's request %d past the bound: %s after %s (Retry-After %q), want 503 with Retry-After at once",
				maxHeld+i+1, a, a.took.Round(time.Millisecond), a.header.Get("Retry-After"))
		}
	}

	cold := raw(proxy, "GET", "GET /?sleep=10ms HTTP/1.1\r\nHost: shop."+bob.ns+"\r\n")
	t.Logf("bob's first request, with eve's flood held: %s after %s", cold, cold.took.Round(time.Millisecond))
	if cold.err != nil || cold.code != http.StatusOK || !strings.HasPrefix(podOf(cold.body), "shop-") {
		t.Errorf("bob's request at zero: %s, want 200 from the pod its cold start brings", cold)
	}
	if n, err := heldNow(); err != nil || n > maxHeld {
		t.Errorf("%v held after bob's request (%v), want at most %d", n, err, maxHeld)
	}

	wg.Wait()
	codes := map[int]int{}
	for i, a := range flood {
		switch {
		case a.err != nil:
			t.Errorf("eve's held request %d: %v", i, a.err)
		case a.code == http.StatusServiceUnavailable && a.header.Get("Retry-After") == "":
			t.Errorf("eve's request %d shed without Retry-After: %s", i, a)
		}
		codes[a.code]++
	}
	t.Logf("eve's %d held requests ended: %v (by status)", maxHeld, codes)
	if want := map[int]int{http.StatusServiceUnavailable: 1, http.StatusGatewayTimeout: maxHeld - 1}; !maps.Equal(codes, want) {
		t.Errorf("eve's held requests ended %v by status, want %v: one shed for bob's, the rest at their timeout", codes, want)
	}
}
