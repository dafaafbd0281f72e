package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/owned"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
	"github.com/sockscale/sockscale/test/bench/harness"
)

// The activator parts run the real sockscale-activator binary against a
// real kube-apiserver: its packages are internal to activator/, so this
// command cannot assemble them in-process, and the binary is what users
// run (its watch, table, throttle, prober and proxy, wired by its main).
// Targets are API objects as the controller would leave them in Proxy
// mode (PodAutoscaler, public Service, ServerlessService naming this
// activator, the private Service's EndpointSlice); no controller runs, so
// nothing scales: the bench plays the pods and says when they answer.

const (
	// benchNamespace holds the targets.
	benchNamespace = "default"
	// activatorName is the activator's pod name; the ServerlessServices put
	// it in every target's path, so it takes all of a target's pods.
	activatorName = "bench-activator"
	// probeUserAgent starts the User-Agent of the activator's readiness
	// probes (readiness.UserAgent): the fake pods tell probes from
	// forwarded requests by it.
	probeUserAgent = "sockscale-probe/"
)

// activatorRig is a control plane with sockscale's CRDs and a build of the
// activator; start runs an activator process on it.
type activatorRig struct {
	cp     *harness.ControlPlane
	client client.Client
	bin    string
}

// activatorRig starts the rig the first time a part needs it; close stops it.
func (b *bench) activatorRig() (*activatorRig, error) {
	if b.rig != nil {
		return b.rig, nil
	}
	cp, err := harness.StartControlPlane("sockscale-activator", filepath.Join(harness.ModuleDir(), "charts", "sockscale", "files", "crds"))
	if err != nil {
		return nil, err
	}
	scheme := kruntime.NewScheme()
	for _, add := range []func(*kruntime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			cp.Stop()
			return nil, err
		}
	}
	c, err := client.New(cp.Cfg, client.Options{Scheme: scheme})
	if err != nil {
		cp.Stop()
		return nil, err
	}
	bin := b.activatorBin
	if bin == "" {
		if bin, err = harness.GoBuild(cp.Dir, "github.com/sockscale/sockscale/activator/cmd/sockscale-activator"); err != nil {
			cp.Stop()
			return nil, err
		}
	}
	b.rig = &activatorRig{cp: cp, client: c, bin: bin}
	return b.rig, nil
}

func (r *activatorRig) close() { r.cp.Stop() }

// targetHost is the name a client in the cluster would call target by,
// which the activator resolves from the Host header.
func targetHost(name string) string {
	return name + "." + benchNamespace + ".svc.cluster.local"
}

// createTarget makes target name with containerConcurrency cc, TBC = -1
// (the activator stays in the path) and one pod at addr, ready or not in
// its EndpointSlice (not ready: the activator probes it).
func (r *activatorRig) createTarget(name string, cc int32, addr netip.AddrPort, ready bool) error {
	ctx := context.Background()
	tbc := -1.0
	pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: name},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef:       v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
			Service:              v1alpha1.ServiceRef{Name: name, Port: 80},
			ContainerConcurrency: cc,
			TargetBurstCapacity:  &tbc,
		}}
	sks := &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: name},
		Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeProxy, PublicService: name, Selector: map[string]string{"app": name}}}
	private := privateService(name)
	// In the order the controller and Kubernetes make them, each owned by
	// the one before (the activator takes pods only along that chain); a
	// step is built when its turn comes, once its owner has a UID.
	steps := []func() client.Object{
		func() client.Object {
			return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: name},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
		},
		func() client.Object { return pa },
		func() client.Object { return owned.ServerlessService(sks, pa) },
		func() client.Object { return owned.PrivateService(private, sks) },
		func() client.Object { return owned.ComputedSlice(endpointSlice(name, addr, ready), private) },
	}
	for _, step := range steps {
		if err := r.client.Create(ctx, step()); err != nil {
			return fmt.Errorf("create target %s: %w", name, err)
		}
	}
	sks.Status = v1alpha1.ServerlessServiceStatus{Mode: v1alpha1.ModeProxy, Activators: []string{activatorName}}
	if err := r.client.Status().Update(ctx, sks); err != nil {
		return fmt.Errorf("create target %s: %w", name, err)
	}
	return nil
}

// privateService is target name's private Service (without its owner).
func privateService(name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: name + "-private"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}, Selector: map[string]string{"app": name}}}
}

// setPod makes addr the target's only pod, ready or not.
func (r *activatorRig) setPod(name string, addr netip.AddrPort, ready bool) error {
	s := endpointSlice(name, addr, ready)
	var old discoveryv1.EndpointSlice
	if err := r.client.Get(context.Background(), client.ObjectKeyFromObject(s), &old); err != nil {
		return err
	}
	s.ResourceVersion, s.Labels, s.OwnerReferences = old.ResourceVersion, old.Labels, old.OwnerReferences
	return r.client.Update(context.Background(), s)
}

// deleteTarget removes what createTarget made.
func (r *activatorRig) deleteTarget(name string) error {
	meta := metav1.ObjectMeta{Namespace: benchNamespace, Name: name}
	var errs []error
	for _, o := range []client.Object{&v1alpha1.PodAutoscaler{ObjectMeta: meta}, &corev1.Service{ObjectMeta: meta},
		&v1alpha1.ServerlessService{ObjectMeta: meta}, privateService(name), endpointSlice(name, netip.AddrPort{}, false)} {
		if err := r.client.Delete(context.Background(), o); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// endpointSlice is the private Service's slice with one pod.
func endpointSlice(name string, addr netip.AddrPort, ready bool) *discoveryv1.EndpointSlice {
	port, portName, tcp := int32(addr.Port()), "http", corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: name + "-private-bench",
			Labels: map[string]string{discoveryv1.LabelServiceName: name + "-private"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &tcp}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
}

// activatorProc is a running sockscale-activator.
type activatorProc struct {
	cmd                    *exec.Cmd
	proxyAddr, metricsAddr string
}

// start runs the activator with its defaults but for flags, and waits
// until it is ready (every target synced).
func (r *activatorRig) start(flags ...string) (*activatorProc, error) {
	addrs, err := harness.FreeAddrs(3)
	if err != nil {
		return nil, err
	}
	a := &activatorProc{proxyAddr: addrs[0], metricsAddr: addrs[1]}
	args := append([]string{"--pod-name=" + activatorName, "--kubeconfig=" + r.cp.Kubeconfig,
		"--proxy-bind-address=" + addrs[0], "--metrics-bind-address=" + addrs[1], "--metrics-secure=false", "--health-probe-bind-address=" + addrs[2],
		"--drain-delay=0s", "--shutdown-grace-period=1s", "--log-level=error"}, flags...)
	a.cmd = exec.Command(r.bin, args...)
	a.cmd.Stdout, a.cmd.Stderr = os.Stderr, os.Stderr
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start activator: %w", err)
	}
	if err := harness.WaitHTTP("http://"+addrs[2]+"/readyz", 30*time.Second); err != nil {
		a.stop()
		return nil, fmt.Errorf("activator not ready: %w", err)
	}
	return a, nil
}

func (a *activatorProc) stop() {
	_ = a.cmd.Process.Kill()
	_ = a.cmd.Wait()
}

// client returns an HTTP client for closed loops of concurrency c whose
// requests all go to the activator, whatever their URL's host: a client
// calls a target by its name (targetURL), as it would call the public
// Service, and the activator resolves the name from the Host header.
func (a *activatorProc) client(c int, dialers int) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	var gate chan struct{}
	if dialers > 0 {
		gate = make(chan struct{}, dialers)
	}
	tr := &http.Transport{
		MaxIdleConnsPerHost: c, MaxConnsPerHost: c,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			if gate != nil {
				// Bounded dials: thousands at once would overflow the
				// activator's accept queue and wait out SYN retries.
				gate <- struct{}{}
				defer func() { <-gate }()
			}
			return d.DialContext(ctx, network, a.proxyAddr)
		},
	}
	return &http.Client{Transport: tr, Timeout: 2 * time.Minute}
}

// targetURL is the URL a client calls target by (see client).
func targetURL(name string) string { return "http://" + targetHost(name) + "/" }

// metrics scrapes the activator's /metrics.
func (a *activatorProc) metrics() (harness.PromSamples, error) {
	resp, err := http.Get("http://" + a.metricsAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return harness.ParseMetrics(resp.Body)
}

// waitMetric polls the activator's metric until ok says yes about its
// value (see harness.PromSamples.value), for at most timeout.
func (a *activatorProc) waitMetric(what string, timeout time.Duration, ok func(harness.PromSamples) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		m, err := a.metrics()
		if err == nil && ok(m) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("activator: waited %v for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// targetLabels select a target's series of the activator's metrics.
func targetLabels(name string, more ...string) []string {
	return append([]string{"namespace", benchNamespace, "name", name}, more...)
}

// podServer is a pod's server that the bench starts at a known instant:
// it opens its listener in the pod's network namespace (listening is when
// the pod starts answering) and notes when the activator's first probe and
// its first forwarded request reach it.
type podServer struct {
	srv       *http.Server
	listening time.Time // listen() returned: connections are accepted from here

	mu                       sync.Mutex
	firstProbe, firstForward time.Time
	forwarded                atomic.Int64
}

// startPodServer listens on the pod's address and port, in its network
// namespace, and serves a trivial handler.
func startPodServer(pod *testpod.Pod, port int) (*podServer, error) {
	s := &podServer{}
	l, err := listenIn(pod.Name, pod.Addr(port))
	if err != nil {
		return nil, err
	}
	s.listening = time.Now()
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

func (s *podServer) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	probe := strings.HasPrefix(r.UserAgent(), probeUserAgent)
	if !probe {
		s.forwarded.Add(1)
	}
	s.mu.Lock()
	switch {
	case probe && s.firstProbe.IsZero():
		s.firstProbe = now
	case !probe && s.firstForward.IsZero():
		s.firstForward = now
	}
	s.mu.Unlock()
	_, _ = io.WriteString(w, "ok")
}

// times returns when the first probe and the first forwarded request
// arrived (zero: none yet).
func (s *podServer) times() (probe, forward time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstProbe, s.firstForward
}

func (s *podServer) close() { _ = s.srv.Close() }

// listenIn opens a TCP listener on addr inside network namespace netns
// (ip netns): the socket belongs to the namespace it was made in, so this
// process serves a pod's address from the host.
func listenIn(netns, addr string) (net.Listener, error) {
	type res struct {
		l   net.Listener
		err error
	}
	done := make(chan res, 1)
	go func() {
		// A goroutine of its own, locked to its thread: only this thread
		// changes namespace. If it cannot change back, it stays locked and
		// the runtime ends the thread with the goroutine.
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- res{err: err}
			return
		}
		defer self.Close()
		pod, err := os.Open(filepath.Join("/run/netns", netns))
		if err != nil {
			done <- res{err: err}
			return
		}
		defer pod.Close()
		if err := unix.Setns(int(pod.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- res{err: fmt.Errorf("enter netns %s: %w", netns, err)}
			return
		}
		l, err := net.Listen("tcp", addr)
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- res{l, err}
	}()
	r := <-done
	return r.l, r.err
}

// warmTarget makes target name (containerConcurrency cc) with its one
// pod at addr, starts an activator and waits until the activator has the
// pod: the start of the parts that measure a warm target. stop removes
// both.
func (b *bench) warmTarget(name string, cc int32, addr netip.AddrPort) (a *activatorProc, stop func(), err error) {
	rig, err := b.activatorRig()
	if err != nil {
		return nil, nil, err
	}
	if err := rig.createTarget(name, cc, addr, true); err != nil {
		return nil, nil, err
	}
	if a, err = rig.start(); err != nil {
		_ = rig.deleteTarget(name)
		return nil, nil, err
	}
	stop = func() {
		a.stop()
		_ = rig.deleteTarget(name)
	}
	if err := a.waitMetric("the pod ready", 10*time.Second, func(m harness.PromSamples) bool {
		return m.Value("sockscale_activator_pods", targetLabels(name, "state", "assigned")...) == 1
	}); err != nil {
		stop()
		return nil, nil, err
	}
	return a, stop, nil
}
