package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// This file writes what the scale benchmark's cluster holds: what
// kube-controller-manager, the scheduler and the kubelets would write
// (there are none), and what users would.

const (
	// scaleSystem holds the agents' and activators' pods and the
	// autoscaler ConfigMap.
	scaleSystem = "sockscale-system"
	// podsPerTarget and podsPerNode keep the shape constant at every scale
	// point: nodes = targets * podsPerTarget / podsPerNode.
	podsPerTarget = 50
	podsPerNode   = 100
	// targetsPerNamespace spreads the targets as tenants would.
	targetsPerNamespace = 100
	// scaleActivators report the cold targets; the first also pokes.
	scaleActivators = 3
	// perPodConcurrency keeps desired = current: target 10 at 70 %
	// utilization is 7 per pod; 50 pods at 6.9 are 345, and ceil(345/7) = 50.
	perPodConcurrency = 6.9
	targetConcurrency = 10.0
	servingPort       = 8080
	coldNamespace     = "scale-cold"
	// setupWorkers: requests in flight while objects are created.
	setupWorkers = 64
	// The controller's names, internal to controller/: its stats tokens'
	// audience, the virtual resources its RBAC checks (statsauth), and
	// the suffix of a private Service (names.PrivateServiceName).
	statsAudience = "sockscale-controller"
	statsGroup    = "sockscale.dev"
	privateSuffix = "-private"
	// privateServiceLabel is on the private Services the controller makes
	// (sks.LabelServerlessService, internal to the controller).
	privateServiceLabel = "sockscale.dev/serverlessservice"
)

// scaleShape names a point's objects.
type scaleShape struct {
	targets, cold, nodes int
}

func newScaleShape(targets, cold int) scaleShape {
	return scaleShape{targets: targets, cold: cold, nodes: (targets*podsPerTarget + podsPerNode - 1) / podsPerNode}
}

func targetNamespace(i int) string { return fmt.Sprintf("scale-%d", i/targetsPerNamespace) }
func targetName(i int) string      { return fmt.Sprintf("t-%d", i) }
func coldName(k int) string        { return fmt.Sprintf("c-%d", k) }
func nodeName(n int) string        { return fmt.Sprintf("node-%d", n) }
func agentPodName(n int) string    { return fmt.Sprintf("agent-%d", n) }
func activatorPod(k int) string    { return fmt.Sprintf("activator-%d", k) }

// podIP is pod j of target i: 10.x.y.z, unique up to 16M pods.
func podIP(i, j int) netip.Addr {
	g := i*podsPerTarget + j + 1
	return netip.AddrFrom4([4]byte{10, byte(g >> 16), byte(g >> 8), byte(g)})
}

// podNode is the node of pod j of target i: consecutive pods go to
// consecutive nodes, so each node runs podsPerNode pods of as many targets.
func (s scaleShape) podNode(i, j int) int { return (i*podsPerTarget + j) % s.nodes }

// parallel runs fn(0..n-1) on setupWorkers goroutines; the first error
// stops it.
func parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(setupWorkers)
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error { return fn(ctx, i) })
	}
	return g.Wait()
}

// scaleCluster writes the objects of one scale point.
type scaleCluster struct {
	shape scaleShape
	cs    kubernetes.Interface
	c     client.Client
	// agentTokens[n] is node n's agent's token; activatorTokens[k]
	// activator k's.
	agentTokens, activatorTokens []string
}

// setupFleet writes the namespaces, RBAC, nodes, the agents' and
// activators' pods and their tokens, and the autoscaler ConfigMap:
// everything the controller needs before it starts.
func (sc *scaleCluster) setupFleet(ctx context.Context) error {
	s := sc.shape
	nss := []string{scaleSystem, coldNamespace}
	for i := 0; i < s.targets; i += targetsPerNamespace {
		nss = append(nss, targetNamespace(i))
	}
	if err := parallel(ctx, len(nss), func(ctx context.Context, i int) error {
		_, err := sc.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nss[i]}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create namespaces: %w", err)
	}
	for _, role := range []struct{ sa, resource string }{{"sockscale-agent", "nodestats"}, {"sockscale-activator", "targetstats"}} {
		name := "bench-" + role.sa
		if _, err := sc.cs.CoreV1().ServiceAccounts(scaleSystem).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: role.sa}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := sc.cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{statsGroup}, Resources: []string{role.resource}, Verbs: []string{"create"}}}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := sc.cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: scaleSystem, Name: role.sa}}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if _, err := sc.cs.CoreV1().ConfigMaps(scaleSystem).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "sockscale-autoscaler"},
		Data: map[string]string{"allow-zero-initial-scale": "true"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	sc.agentTokens = make([]string, s.nodes)
	if err := parallel(ctx, s.nodes, func(ctx context.Context, n int) error {
		if _, err := sc.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(n)}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		pod, err := sc.createPod(ctx, agentPodName(n), nodeName(n), "sockscale-agent", nil)
		if err != nil {
			return err
		}
		sc.agentTokens[n], err = sc.token(ctx, pod)
		return err
	}); err != nil {
		return fmt.Errorf("create nodes and agents: %w", err)
	}
	sc.activatorTokens = make([]string, scaleActivators)
	return parallel(ctx, scaleActivators, func(ctx context.Context, k int) error {
		pod, err := sc.createPod(ctx, activatorPod(k), nodeName(k%s.nodes), "sockscale-activator", map[string]string{"app.kubernetes.io/component": "activator"})
		if err != nil {
			return err
		}
		// The kubelet's part: the controller puts ready activators with an
		// address in Proxy-mode targets' paths.
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.255.0.%d", k+1),
			PodIPs:     []corev1.PodIP{{IP: fmt.Sprintf("10.255.0.%d", k+1)}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if pod, err = sc.cs.CoreV1().Pods(scaleSystem).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("activator %d status: %w", k, err)
		}
		sc.activatorTokens[k], err = sc.token(ctx, pod)
		return err
	})
}

// createPod makes a pod bound to node (no scheduler), as a DaemonSet's or
// the activator Deployment's would be.
func (sc *scaleCluster) createPod(ctx context.Context, name, node, sa string, labels map[string]string) (*corev1.Pod, error) {
	return sc.cs.CoreV1().Pods(scaleSystem).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "main", Image: "sockscale-bench"}}}}, metav1.CreateOptions{})
}

// token is a projected token of pod's ServiceAccount bound to the pod, as
// the kubelet would mount for the controller's audience.
func (sc *scaleCluster) token(ctx context.Context, pod *corev1.Pod) (string, error) {
	tr, err := sc.cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{statsAudience}, ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of %s: %w", pod.Name, err)
	}
	return tr.Status.Token, nil
}

// setupTargets writes every target's Deployment (with the status the
// Deployment controller would give it once its pods are ready), public
// Service and PodAutoscaler: the warm ones at podsPerTarget pods, the
// cold ones at zero, in Proxy mode from the start.
func (sc *scaleCluster) setupTargets(ctx context.Context) error {
	s := sc.shape
	return parallel(ctx, s.targets+s.cold, func(ctx context.Context, i int) error {
		if i < s.targets {
			return sc.createTarget(ctx, targetNamespace(i), targetName(i), podsPerTarget)
		}
		return sc.createTarget(ctx, coldNamespace, coldName(i-s.targets), 0)
	})
}

func (sc *scaleCluster) createTarget(ctx context.Context, ns, name string, replicas int32) error {
	labels := map[string]string{"app": name}
	d, err := sc.cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "sockscale-bench",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: servingPort}}}}}}}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("deployment %s/%s: %w", ns, name, err)
	}
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, UpdatedReplicas: replicas,
		ReadyReplicas: replicas, AvailableReplicas: replicas}
	if _, err := sc.cs.AppsV1().Deployments(ns).UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("deployment %s/%s status: %w", ns, name, err)
	}
	if _, err := sc.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(servingPort)}}}},
		metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("service %s/%s: %w", ns, name, err)
	}
	pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
			Service:        v1alpha1.ServiceRef{Name: name, Port: 80},
			Target:         ptr.To(targetConcurrency),
		}}
	if replicas == 0 {
		pa.Spec.MinScale, pa.Spec.InitialScale = ptr.To[int32](0), ptr.To[int32](0)
	} else {
		// Never through the activator: the warm targets stay in Serve mode.
		// Bounds at their pods: the load keeps desired = current only
		// inside a band 1 pod (2 %) wide, and a bias of the windows (one
		// was seen: docs/scale-bench.md) would otherwise make steady state
		// a scaling storm. The decider still decides every tick; the bench
		// reports the stable values apart.
		pa.Spec.MinScale, pa.Spec.MaxScale = ptr.To(replicas), ptr.To(replicas)
		pa.Spec.TargetBurstCapacity = ptr.To(0.0)
	}
	if err := sc.c.Create(ctx, pa); err != nil {
		return fmt.Errorf("podautoscaler %s/%s: %w", ns, name, err)
	}
	return nil
}

// setupEndpoints waits for the private Service of every warm target (the
// controller makes them) and writes its EndpointSlice, as Kubernetes'
// EndpointSlice controller would: the Service's labels, podsPerTarget
// ready pods each with its node. It follows the private Services through
// one watch (an informer on the controller's label) instead of listing
// every Service every second (20,000 a second at 10,000 targets).
func (sc *scaleCluster) setupEndpoints(ctx context.Context, timeout time.Duration) error {
	s := sc.shape
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type private struct {
		i      int
		labels map[string]string
		ports  []corev1.ServicePort
	}
	found := make(chan private, s.targets)
	var mu sync.Mutex
	seen := make([]bool, s.targets)
	factory := informers.NewSharedInformerFactoryWithOptions(sc.cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = privateServiceLabel }))
	onService := func(obj any) {
		svc, ok := obj.(*corev1.Service)
		if !ok {
			return
		}
		public, ok := strings.CutSuffix(svc.Name, privateSuffix)
		var i int
		if !ok {
			return
		}
		if _, err := fmt.Sscanf(public, "t-%d", &i); err != nil || i < 0 || i >= s.targets || svc.Namespace != targetNamespace(i) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !seen[i] {
			seen[i] = true
			found <- private{i, svc.Labels, svc.Spec.Ports}
		}
	}
	if _, err := factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onService,
		UpdateFunc: func(_, obj any) { onService(obj) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer func() {
		cancel() // Shutdown waits for the informer, which stops with ctx
		factory.Shutdown()
	}()

	created := make(chan struct{}, s.targets)
	workers, stop := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(workers)
	for range setupWorkers {
		g.Go(func() error {
			for {
				select {
				case <-gctx.Done():
					return nil
				case p := <-found:
					if err := sc.createSlice(gctx, p.i, p.labels, p.ports); err != nil {
						return err
					}
					created <- struct{}{}
				}
			}
		})
	}
	var missing error
	for n := range s.targets {
		select {
		case <-created:
			continue
		case <-gctx.Done(): // the timeout, or a worker failed (its error below)
			missing = fmt.Errorf("%d of %d private Services still missing after %v", s.targets-n, s.targets, timeout)
		}
		break
	}
	stop()
	if err := g.Wait(); err != nil {
		return err
	}
	return missing
}

func (sc *scaleCluster) createSlice(ctx context.Context, i int, svcLabels map[string]string, svcPorts []corev1.ServicePort) error {
	ns, private := targetNamespace(i), targetName(i)+privateSuffix
	labels := map[string]string{}
	for k, v := range svcLabels {
		labels[k] = v
	}
	labels[discoveryv1.LabelServiceName] = private
	labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	var ports []discoveryv1.EndpointPort
	for _, p := range svcPorts {
		ports = append(ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(p.TargetPort.IntVal)})
	}
	eps := make([]discoveryv1.Endpoint, podsPerTarget)
	for j := range eps {
		eps[j] = discoveryv1.Endpoint{Addresses: []string{podIP(i, j).String()}, NodeName: ptr.To(nodeName(sc.shape.podNode(i, j))),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("%s-%d", targetName(i), j)}}
	}
	_, err := sc.cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: private + "-bench", Labels: labels},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: ports, Endpoints: eps}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("endpointslice of %s/%s: %w", ns, private, err)
	}
	return nil
}
