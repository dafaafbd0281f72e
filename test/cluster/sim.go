package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/namedns"
)

// The node simulator is one long-running process (`sockscale-cluster
// simulate`, started by `up`) that plays the kubelet of every node: it
// registers the Nodes and renews their leases and status, and runs the pods
// bound to them as processes (pod.go), each container through the
// `sockscale-cluster pod-init` helper (podinit.go). Pods are its children;
// if it dies they stay in their cgroups until `down` kills the subtree.

// SimOptions configures Simulate.
type SimOptions struct {
	StateDir string
	Nodes    int
	// Self is the sockscale-cluster binary (the pod-init helper).
	Self string
	// DualStack gives nodes and pods IPv6 addresses too (Options.DualStack).
	DualStack bool
	Log       *slog.Logger
}

type sim struct {
	opts       SimOptions
	client     kubernetes.Interface
	cgroupRoot string
	images     *imageStore
	nodes      map[string]*simNode
	caPEM      []byte

	mu      sync.Mutex
	workers map[types.UID]*podWorker
}

type simNode struct {
	name  string
	index int
	mu    sync.Mutex
	// ips in use on the node's bridge (podIP -> pod).
	ips map[netip.Addr]types.UID
}

// Simulate runs the nodes until ctx ends.
func Simulate(ctx context.Context, opts SimOptions) error {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(opts.StateDir, "pki", "admin.kubeconfig"))
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 100, 200
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	root, err := cgroup2.Root()
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(filepath.Join(opts.StateDir, "pki", "ca.crt"))
	if err != nil {
		return err
	}
	s := &sim{opts: opts, client: client, cgroupRoot: root, images: newImageStore(filepath.Join(opts.StateDir, "images")),
		nodes: map[string]*simNode{}, workers: map[types.UID]*podWorker{}, caPEM: caPEM}
	for i := 0; i < opts.Nodes; i++ {
		n := &simNode{name: NodeName(i), index: i, ips: map[netip.Addr]types.UID{}}
		s.nodes[n.name] = n
		// Pods a previous simulator left are started anew.
		if err := s.cleanNode(n); err != nil {
			return err
		}
		if err := s.register(ctx, n); err != nil {
			return fmt.Errorf("register %s: %w", n.name, err)
		}
		go s.heartbeat(ctx, n)
		if err := s.serveKubelet(ctx, n); err != nil {
			return fmt.Errorf("kubelet API of %s: %w", n.name, err)
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName!=" }))
	inf := factory.Core().V1().Pods().Informer()
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.podChanged(ctx, obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { s.podChanged(ctx, obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				s.podDeleted(p)
			}
		},
	})
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	s.mu.Lock()
	ws := make([]*podWorker, 0, len(s.workers))
	for _, w := range s.workers {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	for _, w := range ws {
		w.gone()
	}
	return nil
}

// cleanNode kills the pods a previous simulator left on n and removes their
// network namespaces.
func (s *sim) cleanNode(n *simNode) error {
	pods := filepath.Join(nodeCgroup(s.cgroupRoot, n.name), "pods")
	entries, _ := os.ReadDir(pods)
	for _, e := range entries {
		if err := killCgroupTree(filepath.Join(pods, e.Name())); err != nil {
			return err
		}
	}
	names, err := namedns.List()
	if err != nil {
		return err
	}
	for _, name := range names {
		if strings.HasPrefix(name, Prefix+"-"+n.name+"-") {
			_ = namedns.Delete(name)
		}
	}
	return nil
}

func (s *sim) podChanged(ctx context.Context, p *corev1.Pod) {
	n := s.nodes[p.Spec.NodeName]
	if n == nil {
		return
	}
	s.mu.Lock()
	w := s.workers[p.UID]
	if w == nil {
		if p.DeletionTimestamp != nil {
			// Deleted before it ever ran, or its worker already stopped
			// its processes and left (a late update of the terminating
			// object): nothing to start or stop, as a kubelet never starts
			// a terminating pod. The object just goes.
			s.mu.Unlock()
			_ = s.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &p.UID}})
			return
		}
		w = newPodWorker(s, n, p)
		s.workers[p.UID] = w
		s.mu.Unlock()
		go func() {
			w.run(ctx)
			s.mu.Lock()
			delete(s.workers, p.UID)
			s.mu.Unlock()
		}()
		return
	}
	s.mu.Unlock()
	w.update(p)
}

func (s *sim) podDeleted(p *corev1.Pod) {
	s.mu.Lock()
	w := s.workers[p.UID]
	s.mu.Unlock()
	if w != nil {
		w.gone()
	}
}

// allocIP gives a pod an address of the node's CIDR (.2 to .254).
func (n *simNode) allocIP(uid types.UID) (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ip := NodeIP(n.index).Next(); NodeCIDR(n.index).Contains(ip) && ip.As4()[3] != 255; ip = ip.Next() {
		if _, used := n.ips[ip]; !used {
			n.ips[ip] = uid
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("node %s: pod CIDR %s is full", n.name, NodeCIDR(n.index))
}

func (n *simNode) freeIP(ip netip.Addr) {
	n.mu.Lock()
	delete(n.ips, ip)
	n.mu.Unlock()
}

// podCIDRs is n's spec.podCIDRs: IPv4 first, as the kubelet lists them.
func (s *sim) podCIDRs(n *simNode) []string {
	cidrs := []string{NodeCIDR(n.index).String()}
	if s.opts.DualStack {
		cidrs = append(cidrs, NodeCIDR6(n.index).String())
	}
	return cidrs
}

// nodeIPs are n's addresses, IPv4 first: its InternalIPs, and the hostIPs
// of its pods.
func (s *sim) nodeIPs(n *simNode) []netip.Addr {
	ips := []netip.Addr{NodeIP(n.index)}
	if s.opts.DualStack {
		ips = append(ips, NodeIP6(n.index))
	}
	return ips
}

// register creates or updates n's Node with its pod CIDRs and a Ready status.
func (s *sim) register(ctx context.Context, n *simNode) error {
	cidrs := s.podCIDRs(n)
	cidr := cidrs[0]
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
			"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"sockscale.dev/simulated": "true",
		}},
		Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: cidrs},
	}
	nodes := s.client.CoreV1().Nodes()
	old, err := nodes.Get(ctx, n.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return err
		}
	case err != nil:
		return err
	case !slices.Equal(old.Spec.PodCIDRs, cidrs):
		// Pod CIDRs are immutable: a Node of another cluster layout goes.
		if err := nodes.Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil {
			return err
		}
		return s.register(ctx, n)
	}
	return s.updateNodeStatus(ctx, n)
}

func (s *sim) updateNodeStatus(ctx context.Context, n *simNode) error {
	node, err := s.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, st corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		c := corev1.NodeCondition{Type: t, Status: st, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
		for _, o := range node.Status.Conditions {
			if o.Type == t && o.Status == st {
				c.LastTransitionTime = o.LastTransitionTime
			}
		}
		return c
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("8"),
		corev1.ResourceMemory:           resource.MustParse("16Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	node.Status = corev1.NodeStatus{
		Capacity: res, Allocatable: res, Phase: corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", ""),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", ""),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", ""),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "sockscale-cluster node simulator is posting ready status"),
		},
		Addresses:       s.nodeAddresses(n),
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID: n.name, SystemUUID: n.name, BootID: n.name,
			KernelVersion: kernelVersion(), OSImage: "sockscale-cluster simulated node",
			ContainerRuntimeVersion: "sockscale-cluster://processes", KubeletVersion: "v1.36.3",
			OperatingSystem: "linux", Architecture: "amd64",
		},
	}
	_, err = s.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

// nodeAddresses are n's InternalIPs (IPv4 first, the address the
// apiserver and kube-proxy take) and its hostname.
func (s *sim) nodeAddresses(n *simNode) []corev1.NodeAddress {
	var addrs []corev1.NodeAddress
	for _, ip := range s.nodeIPs(n) {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	return append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.name})
}

func kernelVersion() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// heartbeat renews n's lease every 10 s and its status every 30 s, as a
// kubelet does, so the node lifecycle controller keeps it Ready.
func (s *sim) heartbeat(ctx context.Context, n *simNode) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for i := 0; ; i++ {
		if err := s.renewLease(ctx, n); err != nil && ctx.Err() == nil {
			s.opts.Log.Warn("renew lease", "node", n.name, "err", err)
		}
		if i%3 == 2 {
			if err := s.updateNodeStatus(ctx, n); err != nil && ctx.Err() == nil {
				s.opts.Log.Warn("update node status", "node", n.name, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *sim) renewLease(ctx context.Context, n *simNode) error {
	leases := s.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, n.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := s.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Namespace: corev1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.name, UID: node.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}
