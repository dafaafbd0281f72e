package endpointwatch

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Every EndpointSlice of the cluster through an informer, as kube-proxy
// watches them on every node; only this node's endpoints are kept.
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=list;watch

// labelHeadless marks the slices of a headless Service (no ClusterIP):
// no proxy sends connections by them, DNS names the pods directly.
const labelHeadless = "service.kubernetes.io/headless"

// Watcher follows the EndpointSlices that name the node's pods.
type Watcher struct {
	clock clock.PassiveClock

	mu sync.Mutex
	// routes: each address of a namespace and the slices (namespace/name)
	// of that namespace that list it as ready.
	routes map[nsAddr]map[string]bool
	// bySlice: the addresses each slice lists as ready, to undo them
	// when the slice changes or goes.
	bySlice map[string][]nsAddr
	// unrouted: when the last slice that listed an address as ready
	// stopped doing so.
	unrouted map[nsAddr]time.Time
	synced   bool
}

// nsAddr is an address as the slices of one namespace list it. Only a
// pod's own namespace's slices hold it: a tenant that may write
// EndpointSlices in its namespace cannot hold another's pods by listing
// their addresses.
type nsAddr struct {
	namespace string
	addr      netip.Addr
}

// New returns a Watcher; Run feeds it, or Update and Delete in tests.
func New(clk clock.PassiveClock) *Watcher {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Watcher{clock: clk, routes: map[nsAddr]map[string]bool{}, bySlice: map[string][]nsAddr{}, unrouted: map[nsAddr]time.Time{}}
}

// State is what the Watcher knows of one address.
type State struct {
	// Known: the first list of slices is in; without it nothing below
	// holds.
	Known bool
	// Routed: some slice lists the address as ready; Slices names them
	// (namespace/name).
	Routed bool
	Slices []string
	// Since: when the last slice that listed it as ready stopped doing
	// so; zero if none did since the Watcher started.
	Since time.Time
}

// Of says whether some Service of namespace still sends new connections
// to addr, the address of a pod of that namespace.
func (w *Watcher) Of(namespace string, addr netip.Addr) State {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := nsAddr{namespace, addr}
	st := State{Known: w.synced, Since: w.unrouted[k]}
	for s := range w.routes[k] {
		st.Routed = true
		st.Slices = append(st.Slices, s)
	}
	return st
}

// readyAddrs are the addresses a slice sends new connections to. An
// endpoint is ready unless it says it is not (a nil Ready is unknown,
// which kube-proxy takes as ready). Left out: another node's endpoints
// (nodeName set and not node); the slices of a headless Service; and an
// endpoint that is ready though terminating, which only a Service that
// publishes not-ready addresses writes (its clients want every pod,
// whatever its state, and would hold a leaving pod until its end).
// Terminating endpoints that are still serving get connections from
// kube-proxy only while their Service has no ready endpoint at all;
// waiting for those would wait for the pod's own end.
func readyAddrs(s *discoveryv1.EndpointSlice, node string) []netip.Addr {
	if _, ok := s.Labels[labelHeadless]; ok {
		return nil
	}
	var out []netip.Addr
	for _, e := range s.Endpoints {
		c := e.Conditions
		if c.Ready != nil && !*c.Ready {
			continue
		}
		if c.Terminating != nil && *c.Terminating {
			continue
		}
		if e.NodeName != nil && *e.NodeName != node {
			continue
		}
		for _, a := range e.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// Update takes a slice that was added or changed; node is this node's
// name.
func (w *Watcher) Update(s *discoveryv1.EndpointSlice, node string) {
	var addrs []nsAddr
	for _, a := range readyAddrs(s, node) {
		addrs = append(addrs, nsAddr{s.Namespace, a})
	}
	w.set(s.Namespace+"/"+s.Name, addrs)
}

// Delete takes a slice that was deleted.
func (w *Watcher) Delete(namespace, name string) {
	w.set(namespace+"/"+name, nil)
}

// set makes slice key list exactly addrs as ready.
func (w *Watcher) set(key string, addrs []nsAddr) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.clock.Now()
	keep := make(map[nsAddr]bool, len(addrs))
	for _, a := range addrs {
		keep[a] = true
		if w.routes[a] == nil {
			w.routes[a] = map[string]bool{}
		}
		w.routes[a][key] = true
	}
	for _, a := range w.bySlice[key] {
		if keep[a] {
			continue
		}
		delete(w.routes[a], key)
		if len(w.routes[a]) == 0 {
			delete(w.routes, a)
			w.unrouted[a] = now
		}
	}
	if len(addrs) == 0 {
		delete(w.bySlice, key)
	} else {
		w.bySlice[key] = addrs
	}
}

// Run watches every EndpointSlice until ctx ends; the informer keeps only
// node's endpoints of each.
func (w *Watcher) Run(ctx context.Context, client kubernetes.Interface, node string) error {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTransform(func(obj any) (any, error) { return trim(obj, node), nil }))
	inf := factory.Discovery().V1().EndpointSlices().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.Update(obj.(*discoveryv1.EndpointSlice), node) },
		UpdateFunc: func(_, obj any) { w.Update(obj.(*discoveryv1.EndpointSlice), node) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
				w.Delete(s.Namespace, s.Name)
			}
		},
	}); err != nil {
		return fmt.Errorf("watch EndpointSlices: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("watch EndpointSlices: cache never synced")
	}
	w.mu.Lock()
	w.synced = true
	w.mu.Unlock()
	<-ctx.Done()
	return nil
}

// trim keeps what the Watcher reads of a slice: its name, its labels
// that matter and node's endpoints, so an agent holds its node's share
// of the cluster's slices, not all of them.
func trim(obj any, node string) any {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj // a tombstone: its object was trimmed when stored
	}
	out := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, UID: s.UID, ResourceVersion: s.ResourceVersion},
		AddressType: s.AddressType,
	}
	if _, ok := s.Labels[labelHeadless]; ok {
		out.Labels = map[string]string{labelHeadless: ""}
	}
	for _, e := range s.Endpoints {
		if e.NodeName == nil || *e.NodeName == node {
			out.Endpoints = append(out.Endpoints, e)
		}
	}
	return out
}
