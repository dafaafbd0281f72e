package redirect

import (
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/svcaddr"
)

// conditionReady is the ServerlessService's Ready condition (the
// controller's names.ConditionReady, which the agent may not import).
const conditionReady = "Ready"

// Kinds of entry, the kind label of the metrics.
const (
	// KindServerlessService: a ServerlessService in Proxy mode, its public
	// Service's address -> its activators.
	KindServerlessService = "serverlessservice"
	// KindRoute: a Route's own address (its Kubernetes Service without a
	// tag label) -> the public Services of its revisions with traffic,
	// weighted by percent.
	KindRoute = "route"
	// KindTag: a tag's address (the Route's Service with the tag label)
	// -> the tagged revision's public Service.
	KindTag = "tag"
)

// Kinds are every kind of entry.
var Kinds = []string{KindServerlessService, KindRoute, KindTag}

// Why a ServerlessService has no entry although it is in Proxy mode, or
// why some of its public Service's ports have none: the label values of
// the skipped metric (kind serverlessservice). Serve mode is not a skip:
// it is the normal case.
const (
	// SkipNotReady: status.mode is Proxy but its Ready condition is not
	// True, so the public endpoints may not be the activators (e.g. the
	// public Service got a selector and Kubernetes writes them).
	SkipNotReady = "not_ready"
	// SkipNoActivator: none of status.activators is a ready activator pod
	// with an address that this agent knows.
	SkipNoActivator = "no_ready_activator"
	// SkipNoActivatorOfFamily: some of the public Service's addresses have
	// no entry because no ready activator named in status.activators has
	// an address of their family (an IPv6 cluster IP of a dual-stack
	// Service, activators with IPv4 addresses only): a connect keeps its
	// family, so those take kube-proxy's path, whose EndpointSlices send
	// them to the activators too. The other family's addresses have their
	// entries.
	SkipNoActivatorOfFamily = "no_activator_of_family"
	// SkipNoService, SkipHeadless, SkipNoClusterIP and SkipNoTCPPort: the
	// public Service has no address the kernel can match (svcaddr says
	// why).
	SkipNoService   = svcaddr.NoService
	SkipHeadless    = svcaddr.Headless
	SkipNoClusterIP = svcaddr.NoClusterIP
	SkipNoTCPPort   = svcaddr.NoTCPPort
	// SkipDuplicate: another entry already has the same Service address:
	// ServerlessServices come first, then Routes, each by namespace/name.
	SkipDuplicate = "duplicate_address"
)

// SkipReasons are every skip reason of a ServerlessService, for metrics
// that report zeros too.
var SkipReasons = []string{SkipNotReady, SkipNoActivator, SkipNoActivatorOfFamily, SkipNoService, SkipHeadless, SkipNoClusterIP, SkipNoTCPPort, SkipDuplicate}

// Why a Route's address (its own or a tag's Kubernetes Service) has no
// entry: the label values of the skipped metric (kinds route and tag).
// A split is written whole or not at all: an entry without one of its
// revisions would give the others its share. Without an entry, connects
// take kube-proxy's path to the Route Service's EndpointSlices, which the
// controller points at the activators while a split cannot be one set of
// endpoints.
const (
	// SkipRoutesUnavailable: the agent cannot watch Routes (the serving
	// CRDs are not installed, or its RBAC forbids them); it retries.
	SkipRoutesUnavailable = "routes_unavailable"
	// SkipRouteNotFound: the Service names a Route (its route label) that
	// does not exist (yet, or any more).
	SkipRouteNotFound = "route_not_found"
	// SkipNoTraffic: the Route's status.traffic has no target with
	// percent > 0 (not resolved yet).
	SkipNoTraffic = "no_traffic"
	// SkipTagNotInTraffic: the tag's Service names a tag that the
	// Route's status.traffic does not have.
	SkipTagNotInTraffic = "tag_not_in_traffic"
	// SkipRevisionNoService: a revision the address sends traffic to has
	// no public Service (or a target names no revision).
	SkipRevisionNoService = "revision_service_not_found"
	// SkipRevisionNoAddress: a revision's public Service has no cluster
	// IP of the address's family with a TCP port (headless, ExternalName,
	// or only of the other family: a connect keeps its family).
	SkipRevisionNoAddress = "revision_no_address_of_family"
	// SkipTooManyRevisions: more revisions with percent > 0 than an entry
	// has backends (bpfredirect.MaxBackends).
	SkipTooManyRevisions = "too_many_revisions"
)

// RouteSkipReasons are every skip reason of a Route's or a tag's address:
// the ones above, and those of its own Service's address (svcaddr's) and
// duplicates, as for ServerlessServices.
var RouteSkipReasons = []string{
	SkipRoutesUnavailable, SkipRouteNotFound, SkipNoTraffic, SkipTagNotInTraffic,
	SkipRevisionNoService, SkipRevisionNoAddress, SkipTooManyRevisions,
	SkipHeadless, SkipNoClusterIP, SkipNoTCPPort, SkipDuplicate,
}

// Inputs are what the redirect map depends on, as the caches hold them.
type Inputs struct {
	ServerlessServices []v1alpha1.ServerlessService
	// Services are the public Services by namespace/name (others may be
	// there too).
	Services map[types.NamespacedName]*corev1.Service
	// Activators are the ready activator pods' addresses by pod name
	// (status.activators names pods): one, or one of each family for a
	// dual-stack pod.
	Activators map[string][]netip.Addr
	// ActivatorPort is where activators take proxied requests (their
	// --proxy-bind-address, the controller's --activator-port).
	ActivatorPort uint16

	// RouteServices are the Kubernetes Services with the route label
	// (servingv1alpha1.RouteLabelKey): a Route's own address, or with the
	// tag label a tag's. The revisions' public Services are in Services.
	RouteServices []*corev1.Service
	// Routes are the serving Routes, when RoutesUnavailable is false.
	Routes []servingv1alpha1.Route
	// RoutesUnavailable: Routes cannot be watched, so no Route address
	// gets an entry (SkipRoutesUnavailable).
	RoutesUnavailable bool
}

// Target is what an entry is for: a ServerlessService, a Route's own
// address or one of its tags'.
type Target struct {
	Kind string // KindServerlessService, KindRoute or KindTag
	types.NamespacedName
	Tag string // KindTag only
}

// sksTarget is a ServerlessService's Target.
func sksTarget(key types.NamespacedName) Target {
	return Target{Kind: KindServerlessService, NamespacedName: key}
}

func (t Target) String() string {
	if t.Kind == KindTag {
		return t.Kind + " " + t.Tag + " of route " + t.NamespacedName.String()
	}
	return t.Kind + " " + t.NamespacedName.String()
}

// Entry is one Service address's redirect and whose it is.
type Entry struct {
	Target   Target
	Backends []bpfredirect.Backend
}

// Desired is the map the node should have, and what is known about the
// rest.
type Desired struct {
	// Entries are the Service addresses to redirect, with their backends
	// sorted by address so equal sets compare equal.
	Entries map[netip.AddrPort]Entry
	// Targets names the ServerlessService of every public Service address
	// (TCP port of a cluster IP), whatever its mode, and the Route
	// or tag of every Route Service's address, with an entry or not:
	// redirected connects are counted per target, and an address of no
	// target has no counter worth keeping.
	Targets map[netip.AddrPort]Target
	// Skipped are the ServerlessServices in Proxy mode without an entry
	// (or with fewer ports than the controller proxies), and the Routes'
	// and tags' addresses without one, and why.
	Skipped map[Target]string
}

// Compute decides the redirect map from what is in place, never from what
// is wanted: a ServerlessService gets entries only while its status says
// Proxy with a True Ready condition, which the controller writes after the
// public EndpointSlices hold the activators, and loses them as soon as its
// status says Serve, which the controller writes only once pods are ready.
// So the kernel redirects to activators exactly when kube-proxy would, only
// sooner, and never to a pod that cannot take the connection.
//
// Each of its public Service's cluster IPs, of either family, on the ports
// that go to the activators (spec.port when the Service has it, else every
// port, as the controller's Proxy-mode EndpointSlice does; TCP ones only),
// gets the addresses of its family of the activators named in
// status.activators that are ready, at ActivatorPort, with equal weights.
// Example: status Proxy, activators [act-b, act-a] (10.0.0.7 and
// fd00::7, 10.0.0.5), Service [10.96.0.10, fd00:96::a] ports 80/TCP and
// 53/UDP, spec.port unset => 10.96.0.10:80 -> [10.0.0.5:8012 w1,
// 10.0.0.7:8012 w1], [fd00:96::a]:80 -> [[fd00::7]:8012 w1]; 53/UDP
// untouched. An address whose family no ready activator has gets no entry
// (SkipNoActivatorOfFamily).
//
// Then the Routes' addresses get their splits (computeRoutes). An address
// has one entry: ServerlessServices have theirs first, then Routes, each
// by namespace/name, and a later one naming the same address is skipped.
func Compute(in Inputs) Desired {
	d := Desired{
		Entries: make(map[netip.AddrPort]Entry),
		Targets: make(map[netip.AddrPort]Target),
		Skipped: make(map[Target]string),
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
		key := sksTarget(types.NamespacedName{Namespace: sks.Namespace, Name: sks.Name})
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
		byFamily := map[bool][]bpfredirect.Backend{ // by Is4
			true:  activatorBackends(sks.Status.Activators, in.Activators, in.ActivatorPort, true),
			false: activatorBackends(sks.Status.Activators, in.Activators, in.ActivatorPort, false),
		}
		if len(byFamily[true]) == 0 && len(byFamily[false]) == 0 {
			d.Skipped[key] = SkipNoActivator
			continue
		}
		for _, a := range addrs {
			if d.Targets[a] != key {
				d.Skipped[key] = SkipDuplicate
				continue
			}
			backends := byFamily[a.Addr().Is4()]
			if len(backends) == 0 {
				d.Skipped[key] = SkipNoActivatorOfFamily
				continue
			}
			d.Entries[a] = Entry{Target: key, Backends: backends}
		}
	}
	d.computeRoutes(in)
	return d
}

// activatorBackends are the addresses of one family (IPv4 if v4, else
// IPv6) of the named activators that are ready, at port, with weight 1
// each, sorted by address; at most bpfredirect.MaxBackends (the lowest
// addresses: every one is as good as another).
func activatorBackends(names []string, ready map[string][]netip.Addr, port uint16, v4 bool) []bpfredirect.Backend {
	var out []bpfredirect.Backend
	seen := make(map[netip.Addr]bool, len(names))
	for _, n := range names {
		for _, ip := range ready[n] {
			if ip.Is4() != v4 || seen[ip] {
				continue
			}
			seen[ip] = true
			out = append(out, bpfredirect.Backend{Addr: netip.AddrPortFrom(ip, port), Weight: 1})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr.Compare(out[j].Addr) < 0 })
	if len(out) > bpfredirect.MaxBackends {
		out = out[:bpfredirect.MaxBackends]
	}
	return out
}

// isReadyActivator says whether an activator pod may take connects:
// running, Ready, not being deleted, with an address; and gives its
// addresses, status.podIPs (one per family; status.podIP when podIPs is
// empty), IPv4-mapped ones as IPv4, without the unusable (unparsable,
// zoned, unspecified) or repeated.
func isReadyActivator(p *corev1.Pod) ([]netip.Addr, bool) {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return nil, false
	}
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
			break
		}
	}
	if !ready {
		return nil, false
	}
	raw := make([]string, 0, len(p.Status.PodIPs)+1)
	for _, ip := range p.Status.PodIPs {
		raw = append(raw, ip.IP)
	}
	if len(raw) == 0 {
		raw = append(raw, p.Status.PodIP)
	}
	var out []netip.Addr
	for _, s := range raw {
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" || ip.Unmap().IsUnspecified() || slices.Contains(out, ip.Unmap()) {
			continue
		}
		out = append(out, ip.Unmap())
	}
	return out, len(out) > 0
}
