package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/vishvananda/netlink"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/namedns"
)

// podWorker runs one pod: its sandbox (netns, veth, IP, cgroup), volumes,
// containers with probes and restarts, its status, and its graceful end.
type podWorker struct {
	s    *sim
	node *simNode

	mu    sync.Mutex
	pod   *corev1.Pod
	ip    netip.Addr
	netns string // "" for hostNetwork
	// netUp: the pod's network is built, so its IP may be published (and
	// probed, and sent traffic to).
	netUp    bool
	dir      string // <state>/pods/<uid>
	cgroup   string
	sandbox  error // why the sandbox is not ready
	initDone bool
	ctrs     []*container
	started  time.Time

	changed  chan struct{} // a new pod object or state: status to write
	deleting chan struct{} // closed when the pod has a deletionTimestamp
	vanished chan struct{} // closed when the pod object is gone
	delOnce  sync.Once
	goneOnce sync.Once
}

func newPodWorker(s *sim, n *simNode, p *corev1.Pod) *podWorker {
	w := &podWorker{s: s, node: n, pod: p.DeepCopy(), changed: make(chan struct{}, 1),
		deleting: make(chan struct{}), vanished: make(chan struct{}), started: time.Now(),
		dir:    filepath.Join(s.opts.StateDir, "pods", string(p.UID)),
		cgroup: podCgroup(s.cgroupRoot, n.name, p)}
	if p.DeletionTimestamp != nil {
		w.delOnce.Do(func() { close(w.deleting) })
	}
	return w
}

func (w *podWorker) update(p *corev1.Pod) {
	w.mu.Lock()
	w.pod = p.DeepCopy()
	w.mu.Unlock()
	if p.DeletionTimestamp != nil {
		w.delOnce.Do(func() { close(w.deleting) })
	}
}

func (w *podWorker) gone() {
	w.goneOnce.Do(func() { close(w.vanished) })
	w.delOnce.Do(func() { close(w.deleting) })
}

func (w *podWorker) kick() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *podWorker) log() *slog.Logger {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.s.opts.Log.With("pod", w.pod.Namespace+"/"+w.pod.Name, "node", w.node.name)
}

func (w *podWorker) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	statusDone := make(chan struct{})
	go func() { w.statusLoop(ctx); close(statusDone) }()
	w.kick()

	// Like the kubelet, retry what may come right (a ConfigMap or Secret
	// created after the pod, the namespace's kube-root-ca.crt not yet
	// published) until it does or the pod goes.
	if w.setupSandboxRetrying(ctx) {
		w.runContainers(ctx)
	}
	select {
	case <-w.deleting:
	case <-ctx.Done():
	}
	w.stop(ctx)
	w.teardown()
	cancel()
	<-statusDone
	select {
	case <-w.vanished:
	default:
		// The kubelet's last word: the pod object goes once its processes did.
		pod := w.snapshot()
		err := w.s.client.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name,
			metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			w.log().Warn("delete pod", "err", err)
		}
	}
}

func (w *podWorker) snapshot() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod.DeepCopy()
}

// setupSandboxRetrying runs setupSandbox until it succeeds (true) or the
// pod goes (false), with a backoff of 1 s doubling to 10 s.
func (w *podWorker) setupSandboxRetrying(ctx context.Context) bool {
	backoff := time.Second
	for {
		err := w.setupSandbox(ctx, w.snapshot())
		w.mu.Lock()
		w.sandbox = err
		w.mu.Unlock()
		w.kick()
		if err == nil {
			return true
		}
		w.log().Warn("sandbox", "err", err)
		select {
		case <-w.deleting:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// setupSandbox makes the pod's directory, cgroup and network (once), and
// writes its volumes.
func (w *podWorker) setupSandbox(ctx context.Context, pod *corev1.Pod) error {
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(w.cgroup, 0o755); err != nil {
		return fmt.Errorf("pod cgroup: %w", err)
	}
	w.mu.Lock()
	hasIP := w.ip.IsValid()
	w.mu.Unlock()
	switch {
	case hasIP:
	case pod.Spec.HostNetwork:
		w.mu.Lock()
		w.ip, w.netUp = NodeIP(w.node.index), true
		w.mu.Unlock()
	default:
		ip, err := w.node.allocIP(pod.UID)
		if err != nil {
			return err
		}
		ns := podNetNS(w.node.name, pod)
		w.mu.Lock()
		w.ip, w.netns = ip, ns
		w.mu.Unlock()
		addrs := []netip.Prefix{netip.PrefixFrom(ip, NodeCIDR(w.node.index).Bits())}
		gws := []netip.Addr{NodeIP(w.node.index)}
		if w.s.opts.DualStack {
			addrs = append(addrs, netip.PrefixFrom(PodIP6(w.node.index, ip), NodeCIDR6(w.node.index).Bits()))
			gws = append(gws, NodeIP6(w.node.index))
		}
		if err := podNetwork(ns, "veth"+shortUID(pod), NodeBridge(w.node.name), addrs, gws); err != nil {
			// Undone, so the next try starts from nothing.
			_ = namedns.Delete(ns)
			w.node.freeIP(ip)
			w.mu.Lock()
			w.ip, w.netns = netip.Addr{}, ""
			w.mu.Unlock()
			return fmt.Errorf("pod network: %w", err)
		}
		// Published only now: a kubelet reports a pod's IP once its
		// sandbox's network is up, and clients (the activator's probes)
		// would otherwise dial an address that drops their SYNs.
		w.mu.Lock()
		w.netUp = true
		w.mu.Unlock()
	}
	w.kick()
	if err := w.writeVolumes(ctx, pod); err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	return nil
}

// PodSandbox names what a container runtime's exec enters for a pod the
// node simulator runs on its node: the pod's network namespace (a name for
// `ip netns exec`; "" for hostNetwork) and its cgroup, below the node's
// subtree, so a process started in it is one of the node's for the node's
// agent (its programs are attached at the node's cgroup root).
//
// For a pod on a real node it is the pod's first container's: its cgroup
// v2 and its network namespace, named here (ip netns attach; `down`
// removes the name) as the simulated nodes' are.
func PodSandbox(pod *corev1.Pod) (netns, cgroup string, err error) {
	if isRealNode(pod.Spec.NodeName) {
		return realPodSandbox(pod)
	}
	if NodeIndex(pod.Spec.NodeName) < 0 {
		return "", "", fmt.Errorf("pod %s/%s is on no node of the local cluster (nodeName %q)", pod.Namespace, pod.Name, pod.Spec.NodeName)
	}
	root, err := cgroup2.Root()
	if err != nil {
		return "", "", err
	}
	if !pod.Spec.HostNetwork {
		netns = podNetNS(pod.Spec.NodeName, pod)
	}
	return netns, podCgroup(root, pod.Spec.NodeName, pod), nil
}

func podNetNS(node string, p *corev1.Pod) string {
	return fmt.Sprintf("%s-%s-%s", Prefix, node, shortUID(p))
}

func podCgroup(root, node string, p *corev1.Pod) string {
	return filepath.Join(nodeCgroup(root, node), "pods", string(p.UID))
}

func shortUID(p *corev1.Pod) string {
	u := strings.ReplaceAll(string(p.UID), "-", "")
	if len(u) > 8 {
		u = u[:8]
	}
	return u
}

// podIPs are the pod's addresses, IPv4 first (w.mu held): w.ip and, in a
// dual-stack cluster, its IPv6 twin (PodIP6; the node's for hostNetwork).
func (w *podWorker) podIPs() []netip.Addr {
	if !w.ip.IsValid() {
		return nil
	}
	ips := []netip.Addr{w.ip}
	switch {
	case !w.s.opts.DualStack:
	case w.pod.Spec.HostNetwork:
		ips = append(ips, NodeIP6(w.node.index))
	default:
		ips = append(ips, PodIP6(w.node.index, w.ip))
	}
	return ips
}

// podNetwork makes netns ns with eth0 at addrs (the IPv4 one first, eth0's
// MAC comes from it), a veth whose host end is a port of bridge (hairpin
// on, so a pod reaches itself through its Service), and a default route
// via each of gws (one per family).
func podNetwork(ns, hostVeth, bridge string, addrs []netip.Prefix, gws []netip.Addr) error {
	// Host veth names carry the prefix so `down` finds strays.
	hostVeth = Prefix + strings.TrimPrefix(hostVeth, "veth")
	nsh, err := namedns.Add(ns)
	if err != nil {
		return err
	}
	defer func() { _ = nsh.Close() }()
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("find bridge %s: %w", bridge, err)
	}
	// eth0 is made in the pod's namespace as the veth's peer: the host has
	// an eth0 of its own.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostVeth}, PeerName: "eth0",
		PeerHardwareAddr: podMAC(addrs[0].Addr()), PeerNamespace: netlink.NsFd(nsh)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s (eth0 in %s): %w", hostVeth, ns, err)
	}
	if err := netlink.LinkSetMaster(veth, br); err != nil {
		return fmt.Errorf("set %s master %s: %w", hostVeth, bridge, err)
	}
	if err := netlink.LinkSetHairpin(veth, true); err != nil {
		return fmt.Errorf("set %s hairpin on: %w", hostVeth, err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set %s up: %w", hostVeth, err)
	}
	// The rest inside the namespace, through netlink sockets opened there:
	// no thread of this process changes namespace for it.
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", ns, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", ns, err)
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("find eth0 in %s: %w", ns, err)
	}
	for _, a := range addrs {
		if err := addAddr(h.AddrAdd, eth0, a); err != nil {
			return fmt.Errorf("add address %s to eth0 in %s: %w", a, ns, err)
		}
	}
	for _, l := range []netlink.Link{lo, eth0} {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up in %s: %w", l.Attrs().Name, ns, err)
		}
	}
	for _, gw := range gws {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: addrIP(gw)}); err != nil {
			return fmt.Errorf("add default route via %s in %s: %w", gw, ns, err)
		}
	}
	return nil
}

// podMAC derives eth0's MAC from the pod's IP (0a:58 then the IPv4 bytes,
// locally administered, as CNI plugins do): a new pod that reuses an
// address gets the old pod's MAC, so the neighbour entries that the host
// and other pods still hold for the address stay right. With random MACs
// a stale entry cost ~8 s (5 s in DELAY, then three 1 s probes) before a
// reused address answered.
func podMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}

// runContainers runs the init containers in order, each to success, then
// starts the containers.
func (w *podWorker) runContainers(ctx context.Context) {
	pod := w.snapshot()
	for i := range pod.Spec.InitContainers {
		c := newContainer(w, &pod.Spec.InitContainers[i], true)
		w.mu.Lock()
		w.ctrs = append(w.ctrs, c)
		w.mu.Unlock()
		w.kick()
		c.loop(ctx)
		if !c.succeeded() {
			return
		}
	}
	w.mu.Lock()
	w.initDone = true
	var ctrs []*container
	for i := range pod.Spec.Containers {
		c := newContainer(w, &pod.Spec.Containers[i], false)
		w.ctrs = append(w.ctrs, c)
		ctrs = append(ctrs, c)
	}
	w.mu.Unlock()
	w.kick()
	for _, c := range ctrs {
		go c.loop(ctx)
	}
}

// stop ends every container: SIGTERM, the grace period, SIGKILL.
func (w *podWorker) stop(ctx context.Context) {
	pod := w.snapshot()
	grace := int64(30)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	if pod.DeletionGracePeriodSeconds != nil {
		grace = *pod.DeletionGracePeriodSeconds
	}
	select {
	case <-w.vanished:
		grace = 0
	default:
	}
	w.mu.Lock()
	ctrs := append([]*container(nil), w.ctrs...)
	w.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range ctrs {
		wg.Add(1)
		go func() { defer wg.Done(); c.terminate(time.Duration(grace) * time.Second) }()
	}
	wg.Wait()
	// Anything the containers left behind (their children) goes too.
	_ = killCgroupTree(w.cgroup)
}

func (w *podWorker) teardown() {
	if w.netns != "" {
		if err := namedns.Delete(w.netns); err != nil {
			w.log().Warn("teardown", "err", err)
		}
	}
	if w.ip.IsValid() && w.netns != "" {
		w.node.freeIP(w.ip)
	}
	_ = os.RemoveAll(w.dir)
}

// statusLoop writes the pod's status whenever something changed, and at
// least every 10 s (probes change readiness without a kick too).
func (w *podWorker) statusLoop(ctx context.Context) {
	var last string
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.changed:
		case <-t.C:
		}
		st := w.status()
		b, _ := json.Marshal(st)
		if string(b) == last {
			continue
		}
		pod := w.snapshot()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := w.s.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.UID != pod.UID {
				return nil
			}
			cur.Status = mergeStatus(cur.Status, st)
			_, err = w.s.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			if !apierrors.IsNotFound(err) && ctx.Err() == nil {
				w.log().Warn("update status", "err", err)
				time.AfterFunc(time.Second, w.kick)
			}
			continue
		}
		last = string(b)
	}
}

// mergeStatus keeps what others own (the scheduler's PodScheduled, QoS,
// conditions of others) and sets what the kubelet owns.
func mergeStatus(cur, st corev1.PodStatus) corev1.PodStatus {
	ours := map[corev1.PodConditionType]bool{}
	for _, c := range st.Conditions {
		ours[c.Type] = true
	}
	conds := st.Conditions
	for _, c := range cur.Conditions {
		if !ours[c.Type] {
			conds = append(conds, c)
		}
	}
	for i := range conds {
		for _, o := range cur.Conditions {
			if o.Type == conds[i].Type && o.Status == conds[i].Status && !o.LastTransitionTime.IsZero() {
				conds[i].LastTransitionTime = o.LastTransitionTime
			}
		}
	}
	st.Conditions = conds
	st.QOSClass = cur.QOSClass
	if st.StartTime == nil {
		st.StartTime = cur.StartTime
	}
	return st
}

// status computes the pod's status from its containers.
func (w *podWorker) status() corev1.PodStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	pod := w.pod
	now := metav1.Now()
	start := metav1.NewTime(w.started)
	st := corev1.PodStatus{Phase: corev1.PodPending, StartTime: &start, HostIP: NodeIP(w.node.index).String()}
	for _, ip := range w.s.nodeIPs(w.node) {
		st.HostIPs = append(st.HostIPs, corev1.HostIP{IP: ip.String()})
	}
	if w.ip.IsValid() && w.netUp {
		st.PodIP = w.ip.String()
		for _, ip := range w.podIPs() {
			st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip.String()})
		}
	}
	byName := map[string]*container{}
	for _, c := range w.ctrs {
		byName[c.spec.Name] = c
	}
	statusOf := func(spec corev1.Container) corev1.ContainerStatus {
		if c := byName[spec.Name]; c != nil {
			return c.status()
		}
		reason, msg := "PodInitializing", ""
		if w.sandbox != nil {
			reason, msg = "ContainerCreating", w.sandbox.Error()
		}
		return corev1.ContainerStatus{Name: spec.Name, Image: spec.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
	}
	for _, spec := range pod.Spec.InitContainers {
		st.InitContainerStatuses = append(st.InitContainerStatuses, statusOf(spec))
	}
	allReady, running, succeeded, failed, restarted := true, 0, 0, 0, 0
	for _, spec := range pod.Spec.Containers {
		cs := statusOf(spec)
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		allReady = allReady && cs.Ready
		if cs.RestartCount > 0 {
			restarted++
		}
		switch {
		case cs.State.Running != nil:
			running++
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			succeeded++
		case cs.State.Terminated != nil:
			failed++
		}
	}
	n := len(pod.Spec.Containers)
	switch {
	case w.initDone && succeeded+failed == n && failed > 0:
		st.Phase = corev1.PodFailed
	case w.initDone && succeeded == n:
		st.Phase = corev1.PodSucceeded
	case w.initDone && running+succeeded+failed == n:
		st.Phase = corev1.PodRunning
	case w.initDone && running+restarted > 0:
		// Running while any container runs or is being restarted.
		st.Phase = corev1.PodRunning
	}
	b := func(v bool) corev1.ConditionStatus {
		if v {
			return corev1.ConditionTrue
		}
		return corev1.ConditionFalse
	}
	ready := w.initDone && allReady && st.Phase == corev1.PodRunning
	select {
	case <-w.deleting:
		ready = false
	default:
	}
	st.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: b(w.ip.IsValid() && w.sandbox == nil), LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: b(w.initDone), LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: b(ready), LastTransitionTime: now},
		{Type: corev1.PodReady, Status: b(ready), LastTransitionTime: now},
	}
	return st
}

// container runs one container with restarts and probes.
type container struct {
	w    *podWorker
	spec *corev1.Container
	init bool

	mu        sync.Mutex
	state     corev1.ContainerState
	lastState corev1.ContainerState
	restarts  int32
	ready     bool
	started   bool
	proc      *os.Process
	exited    chan struct{}
	imageID   string // repository@digest of the image pulled
}

func newContainer(w *podWorker, spec *corev1.Container, init bool) *container {
	return &container{w: w, spec: spec, init: init,
		state: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
}

func (c *container) status() corev1.ContainerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	cs := corev1.ContainerStatus{Name: c.spec.Name, Image: c.spec.Image, ImageID: c.imageID,
		State: c.state, LastTerminationState: c.lastState, RestartCount: c.restarts, Ready: c.ready,
		Started: ptr.To(c.started)}
	if c.proc != nil && c.state.Running != nil {
		cs.ContainerID = fmt.Sprintf("sockscale-cluster://%d", c.proc.Pid)
	}
	return cs
}

func (c *container) set(f func()) {
	c.mu.Lock()
	f()
	c.mu.Unlock()
	c.w.kick()
}

func (c *container) succeeded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.Terminated != nil && c.state.Terminated.ExitCode == 0
}

// Restart backoff: 1 s doubling to 30 s, reset after 60 s of running
// (shorter than the kubelet's 10 s..5 min, so tests do not wait minutes).
const (
	backoffMin   = time.Second
	backoffMax   = 30 * time.Second
	backoffReset = 60 * time.Second
)

func (c *container) loop(ctx context.Context) {
	backoff := backoffMin
	for {
		select {
		case <-c.w.deleting:
			return
		case <-ctx.Done():
			return
		default:
		}
		img, ok := c.pull(ctx)
		if !ok {
			return
		}
		began := time.Now()
		code, err := c.runOnce(ctx, img)
		select {
		case <-c.w.deleting:
			return
		default:
		}
		policy := c.w.snapshot().Spec.RestartPolicy
		if c.init && policy == corev1.RestartPolicyAlways {
			policy = corev1.RestartPolicyOnFailure
		}
		if policy == corev1.RestartPolicyNever || (policy == corev1.RestartPolicyOnFailure && code == 0 && err == nil) {
			return
		}
		if time.Since(began) > backoffReset {
			backoff = backoffMin
		}
		c.set(func() {
			c.restarts++
			msg := fmt.Sprintf("back-off %s restarting failed container %s", backoff, c.spec.Name)
			if err != nil {
				msg = err.Error()
			}
			c.lastState = c.state
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: msg}}
		})
		select {
		case <-c.w.deleting:
			return
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, backoffMax)
	}
}

// Image pull backoff: ErrImagePull shows for pullErrShown after a failed
// pull, then ImagePullBackOff until the next try, 2 s doubling to 20 s
// (the kubelet's is 10 s doubling to 5 min: tests would wait minutes).
const (
	pullErrShown   = time.Second
	pullBackoffMin = 2 * time.Second
	pullBackoffMax = 20 * time.Second
)

// pull gets the container's image as its imagePullPolicy says, retrying
// with backoff while the pull fails (the container waits in ErrImagePull,
// then ImagePullBackOff, with the registry's error); false when the pod
// goes first.
func (c *container) pull(ctx context.Context) (*pulledImage, bool) {
	backoff := pullBackoffMin
	for {
		img, err := c.w.s.images.get(ctx, c.spec.Image, c.spec.ImagePullPolicy)
		if err == nil {
			c.set(func() { c.imageID = img.ID })
			return img, true
		}
		reason := "ErrImagePull"
		if errors.Is(err, errNeverPull) {
			reason = "ErrImageNeverPull"
		}
		msg := fmt.Sprintf("failed to pull image %q: %v", c.spec.Image, err)
		c.w.log().Warn("pull", "image", c.spec.Image, "err", err)
		c.set(func() {
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
		})
		for _, step := range []struct {
			wait   time.Duration
			reason string
		}{{pullErrShown, ""}, {backoff, "ImagePullBackOff"}} {
			if step.reason != "" && reason == "ErrImagePull" {
				m := fmt.Sprintf("Back-off pulling image %q: %v", c.spec.Image, err)
				c.set(func() {
					c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: step.reason, Message: m}}
				})
			}
			select {
			case <-c.w.deleting:
				return nil, false
			case <-ctx.Done():
				return nil, false
			case <-time.After(step.wait):
			}
		}
		backoff = min(2*backoff, pullBackoffMax)
	}
}

// runOnce starts the container's process from img and waits for it to
// end; it returns the exit code, or an error if it could not start.
func (c *container) runOnce(ctx context.Context, img *pulledImage) (int, error) {
	w := c.w
	pod := w.snapshot()
	spec, err := w.initSpec(ctx, pod, c.spec, img)
	if err != nil {
		c.set(func() {
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: err.Error()}}
		})
		return 1, err
	}
	specPath := filepath.Join(w.dir, c.spec.Name+".json")
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(specPath, b, 0o600); err != nil {
		return 1, err
	}
	logPath := PodLogPath(w.s.opts.StateDir, pod.Namespace, pod.Name, string(pod.UID), c.spec.Name)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return 1, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 1, err
	}
	defer logf.Close()
	cg, err := os.Open(w.cgroup)
	if err != nil {
		return 1, err
	}
	defer cg.Close()
	cmd := exec.Command(w.s.opts.Self, "pod-init", specPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// New mount and UTS namespaces from clone (unshare(CLONE_NEWNS) fails in
	// a multi-threaded Go process); the helper enters the pod's netns.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
		Setpgid: true, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if err := cmd.Start(); err != nil {
		c.set(func() {
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "RunContainerError", Message: err.Error()}}
		})
		return 1, err
	}
	exited := make(chan struct{})
	c.set(func() {
		c.proc, c.exited = cmd.Process, exited
		c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
		c.started = c.spec.StartupProbe == nil
		c.ready = c.spec.ReadinessProbe == nil && c.started
	})
	pctx, cancel := context.WithCancel(ctx)
	if !c.init {
		go c.probe(pctx)
	}
	_ = cmd.Wait() // the exit status is in ProcessState
	cancel()
	close(exited)
	code := cmd.ProcessState.ExitCode()
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	c.set(func() {
		started := c.state.Running
		t := &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, FinishedAt: metav1.Now(),
			ContainerID: fmt.Sprintf("sockscale-cluster://%d", cmd.Process.Pid)}
		if started != nil {
			t.StartedAt = started.StartedAt
		}
		c.state = corev1.ContainerState{Terminated: t}
		c.ready, c.started, c.proc = false, false, nil
	})
	return code, nil
}

// terminate sends SIGTERM to the container's process group, then SIGKILL
// after grace.
func (c *container) terminate(grace time.Duration) {
	c.mu.Lock()
	p, exited := c.proc, c.exited
	c.mu.Unlock()
	if p == nil {
		return
	}
	_ = syscall.Kill(-p.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		<-exited
	}
}

// kill ends the process for a restart (failed liveness or startup probe).
func (c *container) kill() {
	grace := int64(30)
	if g := c.w.snapshot().Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	c.terminate(time.Duration(grace) * time.Second)
}

// PodLogPath is where a container's stdout and stderr go (appended across
// restarts): <state-dir>/logs/pods/<namespace>_<name>_<uid>/<container>.log.
func PodLogPath(stateDir, namespace, name, uid, container string) string {
	return filepath.Join(stateDir, "logs", "pods", fmt.Sprintf("%s_%s_%s", namespace, name, uid), container+".log")
}
