package podwatch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
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
	// Workload is the pod's owner as users name it: the Deployment of a
	// ReplicaSet's pod, a StatefulSet, DaemonSet or Job, else the pod itself.
	Workload, WorkloadKind string
}

// Skip reasons, the label values of the skipped-pods metric.
const (
	SkipHostNetwork = "host_network"
	SkipNoIPv4      = "no_ipv4"
)

// Watcher mirrors the node's pods into the accounting map.
type Watcher struct {
	acct Accounting
	log  *slog.Logger

	mu      sync.RWMutex
	byIP    map[netip.Addr]Pod
	ipOf    map[types.UID]netip.Addr
	skipped map[types.UID]string // pods not accounted, and why
	synced  bool
	errs    int
}

// New returns a watcher that keeps acct in step with the pods it is given.
func New(acct Accounting, log *slog.Logger) *Watcher {
	return &Watcher{
		acct:    acct,
		log:     log,
		byIP:    make(map[netip.Addr]Pod),
		ipOf:    make(map[types.UID]netip.Addr),
		skipped: make(map[types.UID]string),
	}
}

// Run watches the pods scheduled to node until ctx ends. Once the first
// list is in, it removes kernel entries of pods that are gone (an agent
// restart keeps the live ones, with their counters).
func (w *Watcher) Run(ctx context.Context, client kubernetes.Interface, node string) error {
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
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("watch pods: cache never synced")
	}
	if err := w.RemoveStale(); err != nil {
		return err
	}
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

// Update accounts a pod that was added or changed.
func (w *Watcher) Update(pod *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ip, reason := accountable(pod)
	if reason != "" {
		if w.skipped[pod.UID] != reason {
			w.log.Debug("pod not accounted", "pod", pod.Namespace+"/"+pod.Name, "reason", reason)
		}
		w.skipped[pod.UID] = reason
		w.forget(pod.UID)
		return
	}
	delete(w.skipped, pod.UID)
	if !ip.IsValid() { // no address yet, or finished
		w.forget(pod.UID)
		return
	}
	if old, ok := w.ipOf[pod.UID]; ok && old != ip {
		w.forget(pod.UID) // the pod's address changed
	}
	if err := w.acct.AddPod(ip, podID(pod.UID)); err != nil {
		w.errs++
		w.log.Error("add pod to accounting", "pod", pod.Namespace+"/"+pod.Name, "ip", ip, "err", err)
		return
	}
	if prev, ok := w.byIP[ip]; ok && prev.UID != pod.UID {
		// The address was reused: AddPod reset its counters for the new pod.
		delete(w.ipOf, prev.UID)
	}
	w.byIP[ip] = describe(pod)
	w.ipOf[pod.UID] = ip
}

// Delete stops accounting a deleted pod.
func (w *Watcher) Delete(pod *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.skipped, pod.UID)
	w.forget(pod.UID)
}

// forget removes the pod's address from the kernel, unless another pod
// holds it now. Call with w.mu held.
func (w *Watcher) forget(uid types.UID) {
	ip, ok := w.ipOf[uid]
	if !ok {
		return
	}
	delete(w.ipOf, uid)
	if cur, ok := w.byIP[ip]; ok && cur.UID != uid {
		return
	}
	delete(w.byIP, ip)
	if err := w.acct.RemovePod(ip); err != nil {
		w.errs++
		w.log.Error("remove pod from accounting", "ip", ip, "err", err)
	}
}

// RemoveStale deletes kernel entries that no known pod holds (pods that
// went while the agent was down), and marks the watcher synced.
func (w *Watcher) RemoveStale() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	inKernel, err := w.acct.Pods()
	if err != nil {
		return fmt.Errorf("list accounted pods: %w", err)
	}
	for ip := range inKernel {
		if _, ok := w.byIP[ip]; ok {
			continue
		}
		if err := w.acct.RemovePod(ip); err != nil {
			return fmt.Errorf("remove stale pod %s: %w", ip, err)
		}
		w.log.Info("removed stale pod address from accounting", "ip", ip)
	}
	w.synced = true
	return nil
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
	Errors  int
	Synced  bool
}

// Status reports what the watcher tracks.
func (w *Watcher) Status() Status {
	w.mu.RLock()
	defer w.mu.RUnlock()
	s := Status{Tracked: len(w.byIP), Skipped: map[string]int{}, Errors: w.errs, Synced: w.synced}
	for _, reason := range w.skipped {
		s.Skipped[reason]++
	}
	return s
}

// accountable returns the pod's IPv4 address, an invalid address if there
// is nothing to account (not started, finished), or why the pod is skipped.
func accountable(pod *corev1.Pod) (netip.Addr, string) {
	if pod.Spec.HostNetwork {
		return netip.Addr{}, SkipHostNetwork // shares the node's address
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return netip.Addr{}, ""
	}
	ips := pod.Status.PodIPs
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: pod.Status.PodIP}}
	}
	if len(ips) == 0 {
		return netip.Addr{}, "" // no address yet
	}
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s.IP); err == nil && ip.Unmap().Is4() {
			return ip.Unmap(), ""
		}
	}
	return netip.Addr{}, SkipNoIPv4
}

// describe names the pod and its workload.
func describe(pod *corev1.Pod) Pod {
	p := Pod{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Workload: pod.Name, WorkloadKind: "Pod"}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		p.Workload, p.WorkloadKind = ref.Name, ref.Kind
		if ref.Kind == "ReplicaSet" {
			// A Deployment's ReplicaSet is named <deployment>-<pod-template-hash>.
			if hash := pod.Labels["pod-template-hash"]; hash != "" {
				if name, ok := strings.CutSuffix(ref.Name, "-"+hash); ok {
					p.Workload, p.WorkloadKind = name, "Deployment"
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
