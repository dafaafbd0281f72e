package netpol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// ErrDenied means the NetworkPolicies of the target's namespace do not
// admit the request's client to the pod it would be forwarded to.
var ErrDenied = errors.New("the target's NetworkPolicies do not admit it")

// ErrUndecided means the activator cannot tell yet whether the policies
// admit the client (its caches are not synced, or the chosen pod is not
// in them yet). The request is not forwarded; it may be retried.
var ErrUndecided = errors.New("NetworkPolicies cannot be checked yet")

// PodIPField is the cache index of Pods by each of their addresses
// (status.podIPs), but for pods on the host network: those have their
// node's address, which is the node's and every such pod's, so an address
// of a node is never taken for a pod (it matches only ipBlocks).
const PodIPField = "sockscale.podIP"

// PodIPs is the PodIPField index function.
func PodIPs(o client.Object) []string {
	p, ok := o.(*corev1.Pod)
	if !ok || p.Spec.HostNetwork {
		return nil
	}
	raw := []string{p.Status.PodIP}
	for _, ip := range p.Status.PodIPs {
		raw = append(raw, ip.IP)
	}
	// In netip's spelling, which is how Admit looks addresses up.
	var ips []string
	for _, s := range raw {
		if a, err := netip.ParseAddr(s); err == nil && !slices.Contains(ips, a.Unmap().String()) {
			ips = append(ips, a.Unmap().String())
		}
	}
	return ips
}

// Run's informers: pods for who a client is and what a destination pod's
// labels and ports are, namespaces for their labels, the policies.
// +kubebuilder:rbac:groups="",resources=pods;namespaces,verbs=list;watch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=list;watch

// Admitter decides, for each request the activator is about to forward to
// a pod, whether the NetworkPolicies of the pod's namespace would admit the
// request's client to that pod directly (the activator forwards from its
// own address, which the policies must admit, so without this any client
// the activator admits reaches every target).
type Admitter struct {
	reader   client.Reader
	m        *metrics
	log      *slog.Logger
	synced   atomic.Bool
	isSynced func() bool
}

// Options configure an Admitter.
type Options struct {
	// Reader reads Pods (indexed by PodIPField), Namespaces and
	// NetworkPolicies: the cache Run fills.
	Reader client.Reader
	// Synced, if set, says whether Reader is complete, instead of Run (a
	// reader that is no informer cache, such as a test's fake, is
	// complete from the start).
	Synced     func() bool
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// New returns an Admitter that answers ErrUndecided until Run has synced
// its caches.
func New(o Options) *Admitter {
	a := &Admitter{reader: o.Reader, m: newMetrics(o.Registerer), log: o.Log, isSynced: o.Synced}
	if a.isSynced == nil {
		a.isSynced = a.synced.Load
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	return a
}

// Run adds the index and the informers of Pods, Namespaces and
// NetworkPolicies to c (the cache given as Options.Reader; the caller
// starts it), and returns once they are synced: from then on Admit
// decides.
func (a *Admitter) Run(ctx context.Context, c cache.Cache) error {
	if err := c.IndexField(ctx, &corev1.Pod{}, PodIPField, PodIPs); err != nil {
		return fmt.Errorf("index pods by address: %w", err)
	}
	for _, o := range []client.Object{&corev1.Pod{}, &corev1.Namespace{}, &networkingv1.NetworkPolicy{}} {
		if _, err := c.GetInformer(ctx, o); err != nil {
			return fmt.Errorf("watch %T: %w", o, err)
		}
	}
	// An informer the ClusterRole does not grant retries for ever without
	// an error: say so while waiting, since the activator is not ready
	// meanwhile.
	start, synced := time.Now(), make(chan bool, 1)
	go func() { synced <- c.WaitForCacheSync(ctx) }()
	for waiting := true; waiting; {
		select {
		case ok := <-synced:
			if !ok {
				return fmt.Errorf("wait for the pods, namespaces and NetworkPolicies to sync: %w", context.Cause(ctx))
			}
			waiting = false
		case <-time.After(syncWarnAfter):
			a.log.Warn("pods, namespaces or NetworkPolicies still not synced: the activator is not ready until they are; does its ClusterRole grant list and watch on them?",
				"waited", time.Since(start).Round(time.Second))
		}
	}
	a.synced.Store(true)
	a.log.Info("NetworkPolicies enforced for the requests the activator forwards")
	return nil
}

// syncWarnAfter is how long Run waits for its caches before it warns
// (then again every as long).
const syncWarnAfter = 30 * time.Second

// Synced says whether Admit decides (Run has synced the caches).
func (a *Admitter) Synced() bool { return a.isSynced() }

// Admit says whether the client at addr may reach pod dest of target key:
// nil when the NetworkPolicies of key's namespace admit it on dest's TCP
// port, an error wrapping ErrDenied when they do not, ErrUndecided when it
// cannot be told yet.
func (a *Admitter) Admit(ctx context.Context, addr netip.Addr, key target.Key, dest netip.AddrPort) error {
	if !a.Synced() {
		return fmt.Errorf("%w: the activator's pods, namespaces and NetworkPolicies are not synced", ErrUndecided)
	}
	// The cache's objects are read, never changed: no copies.
	var policies networkingv1.NetworkPolicyList
	if err := a.reader.List(ctx, &policies, client.InNamespace(key.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("%w: list the NetworkPolicies of %s: %w", ErrUndecided, key.Namespace, err)
	}
	if len(policies.Items) == 0 {
		return nil // nothing isolates: the common case costs one lookup
	}
	dests, err := a.podsAt(ctx, dest.Addr(), client.InNamespace(key.Namespace))
	if err != nil {
		return err
	}
	if len(dests) == 0 {
		return fmt.Errorf("%w: pod %s of %s is not in the activator's pod cache yet", ErrUndecided, dest.Addr(), key)
	}
	addr = addr.Unmap()
	clients, err := a.clients(ctx, addr)
	if err != nil {
		return err
	}
	// Deny-safe: with several pods sharing an address (client or
	// destination), the request is admitted only if it would be whichever
	// one it is; otherwise a client could borrow the identity of a pod
	// that shares its address and that the policies admit.
	for _, d := range dests {
		for _, c := range clients {
			if !Admits(policies.Items, d, int32(dest.Port()), corev1.ProtocolTCP, c) {
				a.m.denials.WithLabelValues(key.Namespace).Inc()
				a.log.Debug("request refused by NetworkPolicies", "target", key, "client", addr, "clientPod", clientName(c), "pod", d.Name, "port", dest.Port())
				return fmt.Errorf("client %s%s may not reach %s (pod %s, port %d): %w", addr, clientName(c), key, d.Name, dest.Port(), ErrDenied)
			}
		}
	}
	return nil
}

func clientName(c Client) string {
	if c.Pod == nil {
		return " (no pod)"
	}
	return " (pod " + c.Pod.Namespace + "/" + c.Pod.Name + ")"
}

// clients are who addr may be: each live pod with that address, or, when
// none has it, an address that is no pod.
func (a *Admitter) clients(ctx context.Context, addr netip.Addr) ([]Client, error) {
	pods, err := a.podsAt(ctx, addr)
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return []Client{{Addr: addr}}, nil
	}
	var out []Client
	labels := map[string]map[string]string{}
	for i := range pods {
		p := &pods[i]
		l, ok := labels[p.Namespace]
		if !ok {
			if l, err = a.namespaceLabels(ctx, p.Namespace); err != nil {
				return nil, err
			}
			labels[p.Namespace] = l
		}
		out = append(out, Client{Addr: addr, Pod: p, NamespaceLabels: l})
	}
	return out, nil
}

// podsAt are the pods with address addr that can be sending or
// receiving: those that ended (Succeeded, Failed) are not, though a pod
// that ended may keep its address in the API until it is deleted, and the
// address may already be another pod's. Running pods are preferred over
// Pending ones when both have it.
func (a *Admitter) podsAt(ctx context.Context, addr netip.Addr, opts ...client.ListOption) ([]Pod, error) {
	var list corev1.PodList
	opts = append(opts, client.MatchingFields{PodIPField: addr.String()}, client.UnsafeDisableDeepCopy)
	if err := a.reader.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("%w: list the pods at %s: %w", ErrUndecided, addr, err)
	}
	var running, pending []Pod
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.HostNetwork {
			continue // the index leaves them out; a reader without it may not
		}
		pod := podOf(p)
		switch p.Status.Phase {
		case corev1.PodSucceeded, corev1.PodFailed:
		case corev1.PodRunning:
			running = append(running, pod)
		default:
			pending = append(pending, pod)
		}
	}
	if len(running) > 0 {
		return running, nil
	}
	return pending, nil
}

func podOf(p *corev1.Pod) Pod {
	pod := Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels}
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			pod.Ports = append(pod.Ports, c.Ports...)
		}
	}
	return pod
}

// namespaceLabels are the labels of namespace ns. The API server gives
// every namespace kubernetes.io/metadata.name = its name; it is set here
// too, for a namespace not (yet) in the cache.
func (a *Admitter) namespaceLabels(ctx context.Context, ns string) (map[string]string, error) {
	var n corev1.Namespace
	err := a.reader.Get(ctx, client.ObjectKey{Name: ns}, &n)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: get namespace %s: %w", ErrUndecided, ns, err)
	}
	l := make(map[string]string, len(n.Labels)+1)
	for k, v := range n.Labels {
		l[k] = v
	}
	l[corev1.LabelMetadataName] = ns
	return l, nil
}

type metrics struct {
	denials *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_network_policy_denials_total",
			Help: "Requests the activator refused (403) because the NetworkPolicies of their target's namespace do not admit their client to the chosen pod, by namespace: the target's.",
		}, []string{"namespace"}),
	}
	if reg != nil {
		reg.MustRegister(m.denials)
	}
	return m
}
