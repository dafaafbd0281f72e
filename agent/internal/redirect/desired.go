package redirect

import (
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/internal/svcaddr"
)

// conditionReady is the ServerlessService's Ready condition (the
// controller's names.ConditionReady, which the agent may not import).
const conditionReady = "Ready"

// Why a ServerlessService has no entry although it is in Proxy mode, or
// why some of its public Service's ports have none: the label values of
// the skipped metric. Serve mode is not a skip: it is the normal case.
const (
	// SkipNotReady: status.mode is Proxy but its Ready condition is not
	// True, so the public endpoints may not be the activators (e.g. the
	// public Service got a selector and Kubernetes writes them).
	SkipNotReady = "not_ready"
	// SkipNoActivator: none of status.activators is a ready activator pod
	// with an IPv4 address that this agent knows.
	SkipNoActivator = "no_ready_activator"
	// SkipNoService, SkipHeadless, SkipNoClusterIP, SkipNoIPv4 and
	// SkipNoTCPPort: the public Service has no address the kernel can
	// match (svcaddr says why).
	SkipNoService   = svcaddr.NoService
	SkipHeadless    = svcaddr.Headless
	SkipNoClusterIP = svcaddr.NoClusterIP
	SkipNoIPv4      = svcaddr.NoIPv4
	SkipNoTCPPort   = svcaddr.NoTCPPort
	// SkipDuplicate: another ServerlessService (first by namespace/name)
	// already names the same Service address.
	SkipDuplicate = "duplicate_address"
)

// SkipReasons are every skip reason, for metrics that report zeros too.
var SkipReasons = []string{SkipNotReady, SkipNoActivator, SkipNoService, SkipHeadless, SkipNoClusterIP, SkipNoIPv4, SkipNoTCPPort, SkipDuplicate}

// Inputs are what the redirect map depends on, as the caches hold them.
type Inputs struct {
	ServerlessServices []v1alpha1.ServerlessService
	// Services are the public Services by namespace/name (others may be
	// there too).
	Services map[types.NamespacedName]*corev1.Service
	// Activators are the ready activator pods' IPv4 addresses by pod name
	// (status.activators names pods).
	Activators map[string]netip.Addr
	// ActivatorPort is where activators take proxied requests (their
	// --proxy-bind-address, the controller's --activator-port).
	ActivatorPort uint16
}

// Entry is one Service address's redirect and whose it is.
type Entry struct {
	Target   types.NamespacedName // the ServerlessService
	Backends []bpfredirect.Backend
}

// Desired is the map the node should have, and what is known about the
// rest.
type Desired struct {
	// Entries are the Service addresses to redirect, with their backends
	// sorted by address so equal sets compare equal.
	Entries map[netip.AddrPort]Entry
	// Targets names the ServerlessService of every public Service address
	// (TCP port of an IPv4 cluster IP), whatever its mode: redirected
	// connects are counted per target, and an address in no
	// ServerlessService's Service has no counter worth keeping.
	Targets map[netip.AddrPort]types.NamespacedName
	// Skipped are the ServerlessServices in Proxy mode without an entry
	// (or with fewer ports than the controller proxies), and why.
	Skipped map[types.NamespacedName]string
}

// Compute decides the redirect map from what is in place, never from what
// is wanted: a ServerlessService gets entries only while its status says
// Proxy with a True Ready condition, which the controller writes after the
// public EndpointSlices hold the activators, and loses them as soon as its
// status says Serve, which the controller writes only once pods are ready.
// So the kernel redirects to activators exactly when kube-proxy would, only
// sooner, and never to a pod that cannot take the connection.
//
// Each of its public Service's IPv4 cluster IPs, on the ports that go to
// the activators (spec.port when the Service has it, else every port, as
// the controller's Proxy-mode EndpointSlice does; TCP ones only), gets the
// activators named in status.activators that are ready, at ActivatorPort,
// with equal weights. Example: status Proxy, activators [act-b, act-a]
// (10.0.0.7, 10.0.0.5), Service 10.96.0.10 ports 80/TCP and 53/UDP, spec.port
// unset => 10.96.0.10:80 -> [10.0.0.5:8012 w1, 10.0.0.7:8012 w1]; 53/UDP
// untouched.
func Compute(in Inputs) Desired {
	d := Desired{
		Entries: make(map[netip.AddrPort]Entry),
		Targets: make(map[netip.AddrPort]types.NamespacedName),
		Skipped: make(map[types.NamespacedName]string),
	}
	// Sorted, so a duplicate address is skipped in the same one every time.
	skses := slices.Clone(in.ServerlessServices)
	sort.Slice(skses, func(i, j int) bool {
		if skses[i].Namespace != skses[j].Namespace {
			return skses[i].Namespace < skses[j].Namespace
		}
		return skses[i].Name < skses[j].Name
	})
	for i := range skses {
		sks := &skses[i]
		key := types.NamespacedName{Namespace: sks.Namespace, Name: sks.Name}
		proxy := sks.Status.Mode == v1alpha1.ModeProxy
		svc := in.Services[types.NamespacedName{Namespace: sks.Namespace, Name: sks.Spec.PublicService}]
		addrs, reason := svcaddr.Redirected(svc, sks.Spec.Port)
		for _, a := range addrs {
			if _, taken := d.Targets[a]; !taken {
				d.Targets[a] = key
			}
		}
		if !proxy {
			continue // Serve (or no status yet): kube-proxy's path
		}
		if !meta.IsStatusConditionTrue(sks.Status.Conditions, conditionReady) {
			d.Skipped[key] = SkipNotReady
			continue
		}
		if reason != "" {
			d.Skipped[key] = reason
			continue
		}
		backends := activatorBackends(sks.Status.Activators, in.Activators, in.ActivatorPort)
		if len(backends) == 0 {
			d.Skipped[key] = SkipNoActivator
			continue
		}
		for _, a := range addrs {
			if d.Targets[a] != key {
				d.Skipped[key] = SkipDuplicate
				continue
			}
			d.Entries[a] = Entry{Target: key, Backends: backends}
		}
	}
	return d
}

// activatorBackends are the named activators that are ready, at port,
// with weight 1 each, sorted by address; at most bpfredirect.MaxBackends
// (the lowest addresses: every one is as good as another).
func activatorBackends(names []string, ready map[string]netip.Addr, port uint16) []bpfredirect.Backend {
	var out []bpfredirect.Backend
	seen := make(map[netip.Addr]bool, len(names))
	for _, n := range names {
		ip, ok := ready[n]
		if !ok || seen[ip] {
			continue
		}
		seen[ip] = true
		out = append(out, bpfredirect.Backend{Addr: netip.AddrPortFrom(ip, port), Weight: 1})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr.Compare(out[j].Addr) < 0 })
	if len(out) > bpfredirect.MaxBackends {
		out = out[:bpfredirect.MaxBackends]
	}
	return out
}

// isReadyActivator says whether an activator pod may take connects:
// running, Ready, not being deleted, with an IPv4 address.
func isReadyActivator(p *corev1.Pod) (netip.Addr, bool) {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil || !ip.Unmap().Is4() {
		return netip.Addr{}, false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return ip.Unmap(), c.Status == corev1.ConditionTrue
		}
	}
	return netip.Addr{}, false
}
