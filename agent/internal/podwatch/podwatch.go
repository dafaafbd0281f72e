package podwatch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/internal/podaddr"
)

// Accounting is the kernel pod map, as the bpf package's Accounting has it.
type Accounting interface {
	AddPod(ip netip.Addr, id uint64) error
	RemovePod(ip netip.Addr) error
	Pods() (map[netip.Addr]uint64, error)
}

// Pod is what the agent knows about an accounted address.
type Pod struct {
	Namespace, Name string
	UID             types.UID
	// Workload is the pod's owner as users name it: the Deployment (or
	// Argo Rollout) of a ReplicaSet's pod, a StatefulSet, DaemonSet, Job
	// or custom workload that owns its pods, else the pod itself.
	Workload, WorkloadKind string
	// IP is the address the pod's stats go by, whichever of its addresses
	// its connections came to: its IPv4 address if it has one, else its
	// first IPv6 one (as the controller names pods, see
	// podaddr.Pick).
	IP netip.Addr
}

// SkipHostNetwork is why a pod on the node's network is not accounted
// (the label value of the skipped-pods metric): it shares the node's
// addresses.
const SkipHostNetwork = "host_network"

// Watcher mirrors the node's pods into the accounting map. It is level
// triggered: every event updates its view of the pods and then makes the
// kernel entry of each address it touched equal to that view, so the
// order of events does not matter (a late update of a terminating pod
// cannot take the address from the live pod that reuses it), and an entry
// that failed to update is retried (Resync) until it holds.
type Watcher struct {
	acct Accounting
	log  *slog.Logger

	mu sync.RWMutex
	// pods are the accountable pods with an address, by UID.
	pods map[types.UID]podState
	// byIP is each address's owner: the pod whose id the kernel holds
	// for it (or should, while dirty).
	byIP map[netip.Addr]Pod
	// inKernel is what this watcher last wrote for each address.
	inKernel map[netip.Addr]uint64
	// dirty addresses failed to update; Resync retries them.
	dirty   map[netip.Addr]bool
	skipped map[types.UID]string // pods not accounted, and why
	synced  bool
	errs    int
	// onAdded is told each address given to a pod in the kernel (see
	// OnAdded); called with mu held, so it must not block.
	onAdded func(netip.Addr)
}

// podState is what decides which pod owns an address.
type podState struct {
	ips         []netip.Addr // every address of the pod, each with a slot of its own in the kernel
	terminating bool
	// leavingSince is when the pod's deletion was asked for (its deletion
	// timestamp less its grace period); zero while it is not terminating.
	leavingSince time.Time
	created      metav1.Time
	desc         Pod
}

// New returns a watcher that keeps acct in step with the pods it is given.
func New(acct Accounting, log *slog.Logger) *Watcher {
	return &Watcher{
		acct:     acct,
		log:      log,
		pods:     make(map[types.UID]podState),
		byIP:     make(map[netip.Addr]Pod),
		inKernel: make(map[netip.Addr]uint64),
		dirty:    make(map[netip.Addr]bool),
		skipped:  make(map[types.UID]string),
	}
}

// ResyncPeriod is how often Run retries failed updates and compares the
// whole kernel map with the pods (something else may have changed it).
const ResyncPeriod = 10 * time.Second

// The node's pods through an informer (list and watch, no get).
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch

// Run watches the pods scheduled to node until ctx ends. Once the first
// list is in, it removes kernel entries of pods that are gone (an agent
// restart keeps the live ones, with their counters); then it resyncs every
// period of clk's ticker (nil: the real clock, ResyncPeriod).
func (w *Watcher) Run(ctx context.Context, client kubernetes.Interface, node string, clk clock.WithTicker) error {
	if clk == nil {
		clk = clock.RealClock{}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.Update(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { w.Update(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				w.Delete(pod)
			}
		},
	}); err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("watch pods: cache never synced")
	}
	// The first full sync must succeed: until it has, entries of pods
	// that went while the agent was down still count somewhere.
	for {
		err := w.Resync()
		if err == nil {
			break
		}
		w.log.Error("sync the pod map; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-clk.After(time.Second):
		}
	}
	tick := clk.NewTicker(ResyncPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
			if err := w.Resync(); err != nil {
				w.log.Warn("resync the pod map", "err", err)
			}
		}
	}
}

// Update accounts a pod that was added or changed.
func (w *Watcher) Update(pod *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old, had := w.pods[pod.UID]
	ips, reason := accountable(pod)
	if reason != "" {
		if w.skipped[pod.UID] != reason {
			w.log.Debug("pod not accounted", "pod", pod.Namespace+"/"+pod.Name, "reason", reason)
		}
		w.skipped[pod.UID] = reason
	} else {
		delete(w.skipped, pod.UID)
	}
	if reason != "" || len(ips) == 0 { // skipped, no address yet, or finished
		delete(w.pods, pod.UID)
	} else {
		st := podState{ips: ips, terminating: pod.DeletionTimestamp != nil, created: pod.CreationTimestamp, desc: describe(pod)}
		st.desc.IP = podaddr.Pick(ips)
		if st.terminating {
			st.leavingSince = pod.DeletionTimestamp.Time
			if g := pod.DeletionGracePeriodSeconds; g != nil {
				st.leavingSince = st.leavingSince.Add(-time.Duration(*g) * time.Second)
			}
		}
		w.pods[pod.UID] = st
	}
	if had {
		for _, ip := range old.ips {
			if !slices.Contains(ips, ip) {
				w.syncIP(ip) // the pod's address changed, or it has none now
			}
		}
	}
	for _, ip := range ips {
		w.syncIP(ip)
	}
}

// Delete stops accounting a deleted pod.
func (w *Watcher) Delete(pod *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.skipped, pod.UID)
	old, had := w.pods[pod.UID]
	delete(w.pods, pod.UID)
	if had {
		for _, ip := range old.ips {
			w.syncIP(ip)
		}
	}
}

// owner returns the pod that should own ip: of the pods that have it, a
// live one before a terminating one (its address is already the new
// pod's), then the newest, then by UID so the choice is stable. Call with
// w.mu held.
func (w *Watcher) owner(ip netip.Addr) (types.UID, podState, bool) {
	var best types.UID
	var bs podState
	found := false
	for uid, ps := range w.pods {
		if !slices.Contains(ps.ips, ip) {
			continue
		}
		if !found || better(uid, ps, best, bs) {
			best, bs, found = uid, ps, true
		}
	}
	return best, bs, found
}

func better(uid types.UID, a podState, bestUID types.UID, b podState) bool {
	if a.terminating != b.terminating {
		return !a.terminating
	}
	if !a.created.Equal(&b.created) {
		return b.created.Before(&a.created)
	}
	return uid > bestUID
}

// syncIP makes the kernel's entry for ip equal to its owner, or removes it
// when no pod has ip. A failure marks ip dirty for Resync. Call with w.mu
// held.
func (w *Watcher) syncIP(ip netip.Addr) {
	uid, ps, ok := w.owner(ip)
	if !ok {
		delete(w.byIP, ip)
		if _, in := w.inKernel[ip]; !in && !w.dirty[ip] {
			return
		}
		if err := w.acct.RemovePod(ip); err != nil {
			w.fail(ip, "remove pod from accounting", err)
			return
		}
		delete(w.inKernel, ip)
		delete(w.dirty, ip)
		return
	}
	w.byIP[ip] = ps.desc
	id := podID(uid)
	if cur, in := w.inKernel[ip]; in && cur == id && !w.dirty[ip] {
		return
	}
	// AddPod keeps the counters when the address already has this id (an
	// agent restart), and resets them for a new owner.
	if err := w.acct.AddPod(ip, id); err != nil {
		w.fail(ip, "add pod to accounting", err)
		return
	}
	w.inKernel[ip] = id
	delete(w.dirty, ip)
	if w.onAdded != nil {
		w.onAdded(ip)
	}
}

// OnAdded makes f hear of each address the watcher gives to a pod in the
// kernel (a new pod, a reused address, or every pod after an agent
// restart), as it happens; f must not block. Set before Run.
func (w *Watcher) OnAdded(f func(netip.Addr)) { w.onAdded = f }

// Accounted returns the addresses the kernel accounts for pods, as this
// watcher last wrote them.
func (w *Watcher) Accounted() []netip.Addr {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]netip.Addr, 0, len(w.inKernel))
	for ip := range w.inKernel {
		out = append(out, ip)
	}
	return out
}

func (w *Watcher) fail(ip netip.Addr, what string, err error) {
	w.errs++
	w.dirty[ip] = true
	w.log.Error(what+"; retrying at the next resync", "ip", ip, "err", err)
}

// Resync compares the whole kernel map with the pods: it retries the
// addresses that failed, adds what is missing, and removes entries no
// known pod holds (pods that went while the agent was down, or entries
// something else wrote). The first successful call marks the watcher
// synced.
func (w *Watcher) Resync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	inKernel, err := w.acct.Pods()
	if err != nil {
		return fmt.Errorf("list accounted pods: %w", err)
	}
	w.inKernel = inKernel
	want := make(map[netip.Addr]bool, len(w.pods))
	for _, ps := range w.pods {
		for _, ip := range ps.ips {
			want[ip] = true
		}
	}
	for ip := range inKernel {
		if !want[ip] {
			w.log.Info("removing a pod address no pod holds from accounting", "ip", ip)
			w.syncIP(ip)
		}
	}
	for ip := range want {
		w.syncIP(ip)
	}
	for ip := range w.dirty {
		w.syncIP(ip)
	}
	if len(w.dirty) > 0 {
		return fmt.Errorf("%d pod addresses still failed to update", len(w.dirty))
	}
	w.synced = true
	return nil
}

// RemoveStale is the first full sync (Resync), for callers that drive the
// watcher without Run.
func (w *Watcher) RemoveStale() error { return w.Resync() }

// Leaving is a pod of the node that is terminating and still holds an
// address.
type Leaving struct {
	Pod
	// IPs are the addresses it still holds (a dual-stack pod has two).
	IPs []netip.Addr
	// Since is when its deletion was asked for.
	Since time.Time
}

// Leaving lists the node's terminating pods that still own an address (a
// pod whose addresses newer pods took has nothing left to drain there).
func (w *Watcher) Leaving() []Leaving {
	w.mu.RLock()
	defer w.mu.RUnlock()
	var out []Leaving
	for uid, st := range w.pods {
		if !st.terminating {
			continue
		}
		var held []netip.Addr
		for _, ip := range st.ips {
			if owner, ok := w.byIP[ip]; ok && owner.UID == uid {
				held = append(held, ip)
			}
		}
		if len(held) > 0 {
			out = append(out, Leaving{Pod: st.desc, IPs: held, Since: st.leavingSince})
		}
	}
	return out
}

// Has says whether the watch has pod uid with an address: not yet
// finished or deleted.
func (w *Watcher) Has(uid types.UID) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	_, ok := w.pods[uid]
	return ok
}

// DeletingPods lists the pods on node of namespace's workload (as
// Pod.Workload names it) whose deletion the API server has: a read of
// its own, not the watch, which may be behind the kubelet that acts on
// the deletion.
func DeletingPods(ctx context.Context, client kubernetes.Interface, node, namespace, workload string) ([]types.UID, error) {
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, fmt.Errorf("list the pods of %s on %s: %w", namespace, node, err)
	}
	var out []types.UID
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp != nil && describe(p).Workload == workload {
			out = append(out, p.UID)
		}
	}
	return out, nil
}

// Lookup says who the pod at ip is.
func (w *Watcher) Lookup(ip netip.Addr) (Pod, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	p, ok := w.byIP[ip]
	return p, ok
}

// Status is the watcher's state for metrics and readiness.
type Status struct {
	Tracked int
	Skipped map[string]int // by reason
	// Errors counts failed kernel updates; Pending the addresses still
	// waiting for a retry.
	Errors, Pending int
	Synced          bool
}

// Status reports what the watcher tracks.
func (w *Watcher) Status() Status {
	w.mu.RLock()
	defer w.mu.RUnlock()
	pods := make(map[types.UID]bool, len(w.byIP)) // a dual-stack pod owns two addresses
	for _, p := range w.byIP {
		pods[p.UID] = true
	}
	s := Status{Tracked: len(pods), Skipped: map[string]int{}, Errors: w.errs, Pending: len(w.dirty), Synced: w.synced}
	for _, reason := range w.skipped {
		s.Skipped[reason]++
	}
	return s
}

// accountable returns the pod's addresses (IPv4 and IPv6, unmapped, in
// the pod's order), none if there is nothing to account (not started,
// finished), or why the pod is skipped.
func accountable(pod *corev1.Pod) ([]netip.Addr, string) {
	if pod.Spec.HostNetwork {
		return nil, SkipHostNetwork // shares the node's address
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil, ""
	}
	return podaddr.All(&pod.Status), ""
}

// replicaSetHashLabels are the pod labels holding the hash suffix of the
// name of a ReplicaSet that a workload made, with the workload's kind.
var replicaSetHashLabels = []struct{ key, kind string }{
	{"pod-template-hash", "Deployment"},
	{"rollouts-pod-template-hash", "Rollout"},
}

// describe names the pod and its workload.
func describe(pod *corev1.Pod) Pod {
	p := Pod{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Workload: pod.Name, WorkloadKind: "Pod"}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		p.Workload, p.WorkloadKind = ref.Name, ref.Kind
		if ref.Kind != "ReplicaSet" {
			continue
		}
		// A PodAutoscaler names the workload that owns the ReplicaSet,
		// and the controller keys (and buckets) a target's stats by that
		// name, so the ReplicaSet's own name, which changes with each
		// revision, would leave its pods' load unheard. The owner is not
		// on the pod, but its name is in the ReplicaSet's: a Deployment
		// names its ReplicaSets <deployment>-<pod-template-hash>, and an
		// Argo Rollout <rollout>-<rollouts-pod-template-hash>, each hash
		// also a label of the pods.
		for _, label := range replicaSetHashLabels {
			if hash := pod.Labels[label.key]; hash != "" {
				if name, ok := strings.CutSuffix(ref.Name, "-"+hash); ok && name != "" {
					p.Workload, p.WorkloadKind = name, label.kind
					break
				}
			}
		}
	}
	return p
}

// podID is the pod's identity in the kernel map: a hash of its UID, never
// 0 (which marks a free slot there).
func podID(uid types.UID) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(uid))
	return max(h.Sum64(), 1)
}
