//go:build linux

package redirect

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

const activatorNS = "sockscale-system"

var activatorLabels = map[string]string{"app.kubernetes.io/component": "activator"}

// itEnv is a real kube-apiserver and a real redirect attached at a cgroup
// subtree of its own, pinned in a bpffs directory of its own.
type itEnv struct {
	cl     *testenv.Cluster
	kernel *bpfredirect.Redirect
	root   string // the cgroup the programs attach at
	pinDir string
	// as is the Reconciler's API config; nil: the cluster admin's.
	as *rest.Config
}

func newITEnv(t testing.TB, opts ...testenv.Option) *itEnv {
	t.Helper()
	testenv.RequireRoot(t)
	cl := testenv.ControlPlane(t, opts...)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	e := &itEnv{
		cl:     cl,
		root:   filepath.Join(cg2, fmt.Sprintf("sockscale-agent-redirect-it-%d", os.Getpid())),
		pinDir: fmt.Sprintf("/sys/fs/bpf/sockscale-agent-redirect-it-%d", os.Getpid()),
	}
	if err := os.MkdirAll(e.root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(e.root) })
	t.Cleanup(func() { _ = bpfredirect.Uninstall(e.pinDir) })
	e.kernel, err = bpfredirect.New(bpfredirect.Options{CgroupRoot: e.root, PinDir: e.pinDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.kernel.Close() })
	ctx := context.Background()
	if err := cl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: activatorNS}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// run starts a Reconciler on the kernel map until t ends; opts change its
// Options.
func (e *itEnv) run(t testing.TB, reg prometheus.Registerer, resync time.Duration, opts ...func(*Options)) *Reconciler {
	t.Helper()
	o := Options{
		Map: e.kernel, ActivatorNamespace: activatorNS, ActivatorSelector: labels.SelectorFromSet(activatorLabels),
		ActivatorPort: 8012, ResyncPeriod: resync, Registerer: reg,
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
	for _, f := range opts {
		f(&o)
	}
	cfg := e.cl.Config
	if e.as != nil {
		cfg = e.as
	}
	r, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// activatorPod makes a running activator pod at ip, ready or not.
func (e *itEnv) activatorPod(t testing.TB, name, ip string, ready bool) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: activatorNS, Name: name, Labels: activatorLabels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "activator", Image: "sockscale-activator"}}},
	}
	if err := e.cl.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	e.setPodReady(t, name, ip, ready)
}

func (e *itEnv) setPodReady(t testing.TB, name, ip string, ready bool) {
	t.Helper()
	ctx := context.Background()
	var p corev1.Pod
	if err := e.cl.Client.Get(ctx, client.ObjectKey{Namespace: activatorNS, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	if err := e.cl.Client.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
}

// activatorPodIPs makes a ready activator pod with these addresses
// (status.podIPs, one per family; the first is status.podIP).
func (e *itEnv) activatorPodIPs(t testing.TB, name string, ips ...string) {
	t.Helper()
	e.activatorPod(t, name, ips[0], true)
	ctx := context.Background()
	var p corev1.Pod
	if err := e.cl.Client.Get(ctx, client.ObjectKey{Namespace: activatorNS, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	p.Status.PodIPs = nil
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if err := e.cl.Client.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
}

// publicService makes a Service without selector with these ports and
// returns its cluster IP, as the API server allocated it.
func (e *itEnv) publicService(t testing.TB, name string, ports ...corev1.ServicePort) netip.Addr {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       corev1.ServiceSpec{Ports: ports},
	}
	if err := e.cl.Client.Create(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	return netip.MustParseAddr(svc.Spec.ClusterIP)
}

// serverlessService makes one with spec.port and puts status in place:
// mode and activators, with Ready True.
func (e *itEnv) serverlessService(t testing.TB, name string, port int32) {
	t.Helper()
	s := &v1alpha1.ServerlessService{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: name, Port: port, Selector: map[string]string{"app": name}},
	}
	if err := e.cl.Client.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// setStatus writes the ServerlessService's status as the controller would.
func (e *itEnv) setStatus(t testing.TB, name string, mode v1alpha1.Mode, activators ...string) {
	t.Helper()
	ctx := context.Background()
	var s v1alpha1.ServerlessService
	if err := e.cl.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	s.Status.Mode, s.Status.Activators = mode, activators
	reason := "Serving"
	if mode == v1alpha1.ModeProxy {
		reason = "ScaledToZero"
	}
	meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: reason, Message: reason})
	if err := e.cl.Client.Status().Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
}

// waitEntries waits until the kernel map holds want.
func (e *itEnv) waitEntries(t testing.TB, what string, want map[netip.AddrPort][]bpfredirect.Backend) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := e.kernel.Entries()
		if err != nil {
			t.Fatal(err)
		}
		diff := cmp.Diff(want, got, cmpAddrs)
		if diff == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the kernel map after 10 s (-want +got):\n%s", what, diff)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIntegrationActivatorFamilies: activator pods with addresses of both
// families (status.podIPs, from a real API server) give an IPv4 Service
// their IPv4 addresses only; an IPv6-only activator is no backend of it,
// and with no other named, the Service is skipped as having no activator
// of its family. (The test API server allocates IPv4 cluster IPs only:
// IPv6 Services are Compute's unit tests'.)
func TestIntegrationActivatorFamilies(t *testing.T) {
	e := newITEnv(t)
	e.activatorPodIPs(t, "act-d", "10.244.0.7", "fd5c:a1e:0:1::7")
	e.activatorPodIPs(t, "act-6", "fd5c:a1e:0:1::8")
	dual := e.publicService(t, "dual", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	only6 := e.publicService(t, "only6", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	e.serverlessService(t, "dual", 80)
	e.serverlessService(t, "only6", 80)
	e.setStatus(t, "dual", v1alpha1.ModeProxy, "act-6", "act-d")
	e.setStatus(t, "only6", v1alpha1.ModeProxy, "act-6")
	r := e.run(t, prometheus.NewRegistry(), time.Second)
	e.waitEntries(t, "the IPv4 Service: the dual-stack activator's IPv4 address", map[netip.AddrPort][]bpfredirect.Backend{
		netip.AddrPortFrom(dual, 80): backends("10.244.0.7:8012"),
	})
	// only6's address has no entry, and the skip is counted as such.
	if got, err := e.kernel.Entries(); err != nil || len(got) != 1 {
		t.Errorf("entries %v, %v; want dual's only (not %s)", got, err, only6)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := testutil.ToFloat64(r.metrics.skipped.WithLabelValues(KindServerlessService, SkipNoActivatorOfFamily))
		if got == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("skipped{kind=%s,reason=%s} = %v after 10 s, want 1", KindServerlessService, SkipNoActivatorOfFamily, got)
		}
	}
}

// TestIntegrationMapFollowsServerlessServices runs the Reconciler against a
// real kube-apiserver and the real kernel map: an entry left by an earlier
// agent is removed at start; the entry appears when status says Proxy with
// ready activators and goes when it says Serve; spec.port limits it to the
// served port (UDP untouched); an activator that stops being ready leaves
// it; a resync puts back an entry changed behind the agent's back and
// removes one it does not want; a deleted ServerlessService's entry goes.
func TestIntegrationMapFollowsServerlessServices(t *testing.T) {
	e := newITEnv(t)
	// Left by an earlier agent (the map is pinned): nobody's Service.
	stale := netip.MustParseAddrPort("10.255.255.1:80")
	if err := e.kernel.Set(stale, backends("10.254.0.1:8012")); err != nil {
		t.Fatal(err)
	}
	e.activatorPod(t, "act-a", "10.244.0.5", true)
	e.activatorPod(t, "act-b", "10.244.0.6", true)
	hello := e.publicService(t, "hello",
		corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
		corev1.ServicePort{Name: "admin", Port: 9090, Protocol: corev1.ProtocolTCP})
	world := e.publicService(t, "world",
		corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	e.serverlessService(t, "hello", 80)
	e.serverlessService(t, "world", 0)
	e.setStatus(t, "hello", v1alpha1.ModeServe)
	e.setStatus(t, "world", v1alpha1.ModeServe)

	reg := prometheus.NewRegistry()
	r := e.run(t, reg, time.Second)
	for deadline := time.Now().Add(10 * time.Second); !r.Synced(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not Synced after 10 s")
		}
	}
	none := map[netip.AddrPort][]bpfredirect.Backend{}
	e.waitEntries(t, "start: both Serve, the stale entry removed", none)

	helloHTTP := netip.AddrPortFrom(hello, 80)
	both := backends("10.244.0.5:8012", "10.244.0.6:8012")
	e.setStatus(t, "hello", v1alpha1.ModeProxy, "act-b", "act-a")
	e.waitEntries(t, "hello to Proxy: only its served port 80", map[netip.AddrPort][]bpfredirect.Backend{helloHTTP: both})

	e.setStatus(t, "world", v1alpha1.ModeProxy, "act-a")
	worldHTTP := netip.AddrPortFrom(world, 80)
	e.waitEntries(t, "world to Proxy: every TCP port, not 53/UDP", map[netip.AddrPort][]bpfredirect.Backend{
		helloHTTP: both, worldHTTP: backends("10.244.0.5:8012"),
	})

	e.setPodReady(t, "act-b", "10.244.0.6", false)
	e.waitEntries(t, "act-b not ready", map[netip.AddrPort][]bpfredirect.Backend{
		helloHTTP: backends("10.244.0.5:8012"), worldHTTP: backends("10.244.0.5:8012"),
	})
	e.setPodReady(t, "act-b", "10.244.0.6", true)

	e.setStatus(t, "hello", v1alpha1.ModeServe)
	e.waitEntries(t, "hello back to Serve", map[netip.AddrPort][]bpfredirect.Backend{worldHTTP: backends("10.244.0.5:8012")})

	// Behind the agent's back (nothing in the cluster changes): the
	// periodic resync reads the map and repairs it.
	if err := e.kernel.Set(worldHTTP, backends("10.254.0.9:8012")); err != nil {
		t.Fatal(err)
	}
	if err := e.kernel.Set(stale, backends("10.254.0.1:8012")); err != nil {
		t.Fatal(err)
	}
	e.waitEntries(t, "resync after writes behind the agent's back", map[netip.AddrPort][]bpfredirect.Backend{worldHTTP: backends("10.244.0.5:8012")})

	if err := e.cl.Client.Delete(context.Background(), &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "world"}}); err != nil {
		t.Fatal(err)
	}
	e.waitEntries(t, "world's ServerlessService deleted", none)

	if got := testutil.ToFloat64(r.metrics.updates.WithLabelValues(opSet, resultOK)); got < 4 {
		t.Errorf("updates{op=set,result=ok} = %v, want at least the 4 sets above", got)
	}
	if got := testutil.ToFloat64(r.metrics.updates.WithLabelValues(opSet, resultError)) + testutil.ToFloat64(r.metrics.updates.WithLabelValues(opDelete, resultError)); got != 0 {
		t.Errorf("%v failed writes, want none", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sockscale_agent_redirect_update_latency_seconds" {
			h := mf.Metric[0].Histogram
			// Each status change above that changed the map is a sample:
			// hello and world to Proxy, hello to Serve.
			if h.GetSampleCount() != 3 || h.GetSampleSum()/float64(h.GetSampleCount()) > 1 {
				t.Errorf("update latency: %d samples, mean %.3f s; want 3, well under the 1 s resync", h.GetSampleCount(), h.GetSampleSum()/float64(h.GetSampleCount()))
			}
		}
	}
	for _, kind := range append(slices.Clone(Kinds), kindStale) {
		if got := testutil.ToFloat64(r.metrics.entries.WithLabelValues(kind)); got != 0 {
			t.Errorf("entries{kind=%s} = %v, want 0", kind, got)
		}
	}
}

// netns is a network namespace of the test's own with only lo (up), and
// a goroutine whose thread has entered it: sockets that run makes are in
// it. Traffic there cannot leave the machine: there is no other interface
// and no route but lo's.
type netns struct {
	name string
	do   chan func()
}

func newNetns(t *testing.T, addrs ...string) *netns {
	t.Helper()
	n := &netns{name: fmt.Sprintf("sockscale-redir-it-%d", os.Getpid()), do: make(chan func())}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("netns", "add", n.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.name).Run() })
	ip("-n", n.name, "link", "set", "lo", "up")
	for _, a := range addrs {
		ip("-n", n.name, "addr", "add", a+"/32", "dev", "lo")
	}
	entered := make(chan error)
	go func() {
		// Never unlocked: the thread leaves with the goroutine, so no
		// other goroutine ever runs in the namespace.
		runtime.LockOSThread()
		fd, err := unix.Open("/var/run/netns/"+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			_ = unix.Close(fd)
		}
		entered <- err
		if err != nil {
			return
		}
		for f := range n.do {
			f()
		}
	}()
	if err := <-entered; err != nil {
		t.Fatalf("enter netns %s: %v", n.name, err)
	}
	t.Cleanup(func() { close(n.do) })
	return n
}

// run runs f on the thread in the namespace.
func (n *netns) run(f func()) {
	done := make(chan struct{})
	n.do <- func() { defer close(done); f() }
	<-done
}

// enterCgroup moves this process into dir until t ends: the programs see
// the connects of processes below the cgroup they are attached at.
func enterCgroup(t *testing.T, dir string) {
	t.Helper()
	orig, err := cgroup2.Own()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	move := func(to string) error {
		return os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	}
	if err := move(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := move(orig); err != nil {
			t.Errorf("move this process back to %s: %v", orig, err)
		}
		_ = os.Remove(dir)
	})
}

// TestIntegrationRedirectsARealConnect: a client on the node dials the
// public Service's cluster IP while the ServerlessService is in Proxy
// mode and reaches the activator, with getpeername showing the cluster IP;
// after the switch to Serve a new connect is not redirected, while the
// connection made in Proxy mode keeps talking to its activator. The client
// and the "activator" are in a network namespace of the test's with only
// lo, so nothing can leave the machine: there, an unredirected connect to
// the cluster IP finds no route.
func TestIntegrationRedirectsARealConnect(t *testing.T) {
	e := newITEnv(t)
	const activatorIP = "10.244.0.7"
	ns := newNetns(t, activatorIP)
	var ln net.Listener
	ns.run(func() {
		var err error
		if ln, err = net.Listen("tcp4", activatorIP+":8012"); err != nil {
			t.Errorf("listen in the netns: %v", err)
		}
	})
	if ln == nil {
		t.FailNow()
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				// "activator", then echo every line.
				defer c.Close()
				_, _ = c.Write([]byte("activator\n"))
				s := bufio.NewScanner(c)
				for s.Scan() {
					_, _ = c.Write([]byte(s.Text() + "\n"))
				}
			}()
		}
	}()

	e.activatorPod(t, "act-a", activatorIP, true)
	hello := netip.AddrPortFrom(e.publicService(t, "hello", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}), 80)
	e.serverlessService(t, "hello", 80)
	e.setStatus(t, "hello", v1alpha1.ModeProxy, "act-a")
	reg := prometheus.NewRegistry()
	e.run(t, reg, time.Second)
	e.waitEntries(t, "Proxy", map[netip.AddrPort][]bpfredirect.Backend{hello: backends(activatorIP + ":8012")})

	enterCgroup(t, filepath.Join(e.root, "client"))
	dial := func() (c net.Conn, greeting string, err error) {
		ns.run(func() {
			c, err = net.DialTimeout("tcp4", hello.String(), 2*time.Second)
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			greeting, err = bufio.NewReader(c).ReadString('\n')
		})
		return c, greeting, err
	}
	kept, greeting, err := dial()
	if err != nil {
		t.Fatalf("dial %s in Proxy mode: %v", hello, err)
	}
	defer kept.Close()
	if greeting != "activator\n" {
		t.Errorf("answer %q, want the activator's", greeting)
	}
	if got := kept.RemoteAddr().String(); got != hello.String() {
		t.Errorf("the client sees its peer as %s, want the address it dialled, %s", got, hello)
	}
	want := fmt.Sprintf(`
# HELP sockscale_agent_redirect_connects_total Connects on this node that the kernel sent to an activator instead of the public Service's address, by ServerlessService and port of the Service.
# TYPE sockscale_agent_redirect_connects_total counter
sockscale_agent_redirect_connects_total{namespace="default",port="%d",serverlessservice="hello"} 1
`, hello.Port())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sockscale_agent_redirect_connects_total"); err != nil {
		t.Error(err)
	}

	e.setStatus(t, "hello", v1alpha1.ModeServe)
	e.waitEntries(t, "Serve", map[netip.AddrPort][]bpfredirect.Backend{})
	if c, _, err := dial(); err == nil {
		c.Close()
		t.Errorf("a connect in Serve mode reached %s: still redirected", c.RemoteAddr())
	} else if !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("a connect in Serve mode: %v, want ENETUNREACH (not redirected; this namespace has no route to the cluster IP)", err)
	}
	// The connection made in Proxy mode still talks to its activator.
	_ = kept.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := kept.Write([]byte("still there\n")); err != nil {
		t.Fatalf("write on the connection made in Proxy mode: %v", err)
	}
	if line, err := bufio.NewReader(kept).ReadString('\n'); err != nil || line != "still there\n" {
		t.Errorf("echo on the connection made in Proxy mode: %q, %v", line, err)
	}
}

// BenchmarkSwitchLatency measures, against a real kube-apiserver and the
// real kernel map, how long after the controller would start writing a
// ServerlessService's status the kernel has the new entry (Serve -> Proxy)
// or has lost it (Proxy -> Serve): the API server's write and watch, the
// agent's sync and the map write. Each iteration is one switch; it reports
// the median and the worst (p99 with 100 switches) in ms, and the agent's
// own part (status seen -> map written, from its latency histogram).
func BenchmarkSwitchLatency(b *testing.B) {
	e := newITEnv(b)
	e.activatorPod(b, "act-a", "10.244.0.5", true)
	hello := netip.AddrPortFrom(e.publicService(b, "hello", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}), 80)
	e.serverlessService(b, "hello", 80)
	e.setStatus(b, "hello", v1alpha1.ModeServe)
	r := e.run(b, prometheus.NewRegistry(), DefaultResyncPeriod)
	for deadline := time.Now().Add(10 * time.Second); !r.Synced(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("not Synced after 10 s")
		}
	}
	var lat []time.Duration
	proxy := false
	for b.Loop() {
		proxy = !proxy
		start := time.Now()
		if proxy {
			e.setStatus(b, "hello", v1alpha1.ModeProxy, "act-a")
		} else {
			e.setStatus(b, "hello", v1alpha1.ModeServe)
		}
		for {
			got, err := e.kernel.Entries()
			if err != nil {
				b.Fatal(err)
			}
			if _, ok := got[hello]; ok == proxy {
				break
			}
			if time.Since(start) > 10*time.Second {
				b.Fatalf("switch %d (to Proxy: %v) not in the map after 10 s", len(lat)+1, proxy)
			}
			time.Sleep(100 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[(len(lat)*99)/100]), "p99-ms")
	b.ReportMetric(float64(len(lat)), "switches")
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.metrics.latency)
	if mfs, err := reg.Gather(); err == nil && len(mfs) == 1 {
		h := mfs[0].Metric[0].Histogram
		if h.GetSampleCount() > 0 {
			b.ReportMetric(1000*h.GetSampleSum()/float64(h.GetSampleCount()), "agent-mean-ms")
		}
	}
	b.ReportMetric(0, "ns/op") // the per-switch time is p50-ms; ns/op includes the status write
}

// TestIntegrationSwitchingUnderLoadLosesNothing: 16 clients send HTTP
// requests to the public Service's cluster IP without pause while its
// status flips between Serve and Proxy 100 times; no request fails. In the
// test's network namespace the cluster IP is on lo with a "pod" listening
// on it (what kube-proxy would reach in Serve mode) and the activator has
// an address of its own, so every request is answered by one of the two:
// by the activator only if the kernel redirected its connect. Without
// keep-alive both must answer (each request connects anew); with it a
// connection keeps its backend across switches, and only the connections
// the client's pool opens later follow the mode (here they did: the log
// shows both), so only the pod is required.
func TestIntegrationSwitchingUnderLoadLosesNothing(t *testing.T) {
	for _, keepAlive := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepAlive=%v", keepAlive), func(t *testing.T) {
			e := newITEnv(t)
			const activatorIP = "10.244.0.7"
			clusterIP := e.publicService(t, "hello", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
			hello := netip.AddrPortFrom(clusterIP, 80)
			ns := newNetns(t, activatorIP, clusterIP.String())
			for addr, name := range map[string]string{hello.String(): "pod", activatorIP + ":8012": "activator"} {
				var ln net.Listener
				var err error
				ns.run(func() { ln, err = net.Listen("tcp4", addr) })
				if err != nil {
					t.Fatalf("listen on %s in the netns: %v", addr, err)
				}
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(name)) }), ReadHeaderTimeout: 5 * time.Second}
				go func() { _ = srv.Serve(ln) }()
				t.Cleanup(func() { _ = srv.Close() })
			}
			e.activatorPod(t, "act-a", activatorIP, true)
			e.serverlessService(t, "hello", 80)
			e.setStatus(t, "hello", v1alpha1.ModeServe)
			r := e.run(t, prometheus.NewRegistry(), DefaultResyncPeriod)
			for deadline := time.Now().Add(10 * time.Second); !r.Synced(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("not Synced after 10 s")
				}
			}
			enterCgroup(t, filepath.Join(e.root, "client"))

			// Sockets are made on the namespace's thread; the requests run
			// anywhere.
			var dialer net.Dialer
			transport := &http.Transport{
				DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
					ns.run(func() { c, err = dialer.DialContext(ctx, network, addr) })
					return c, err
				},
				DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 16,
			}
			defer transport.CloseIdleConnections()
			client := &http.Client{Transport: transport, Timeout: 5 * time.Second}
			var mu sync.Mutex
			answered := map[string]int{}
			var failed []string
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						resp, err := client.Get("http://" + hello.String() + "/")
						var body []byte
						if err == nil {
							body, err = io.ReadAll(resp.Body)
							resp.Body.Close()
						}
						mu.Lock()
						if err != nil {
							failed = append(failed, err.Error())
						} else {
							answered[string(body)]++
						}
						mu.Unlock()
					}
				}()
			}
			want := map[bool]map[netip.AddrPort][]bpfredirect.Backend{
				true:  {hello: backends(activatorIP + ":8012")},
				false: {},
			}
			for i := range 100 {
				proxy := i%2 == 0
				if proxy {
					e.setStatus(t, "hello", v1alpha1.ModeProxy, "act-a")
				} else {
					e.setStatus(t, "hello", v1alpha1.ModeServe)
				}
				e.waitEntries(t, fmt.Sprintf("switch %d", i+1), want[proxy])
				time.Sleep(10 * time.Millisecond) // some requests in each mode
			}
			close(stop)
			wg.Wait()
			if len(failed) > 0 {
				t.Errorf("%d requests failed across 100 switches, first: %s", len(failed), failed[0])
			}
			t.Logf("answered: %v", answered)
			if answered["pod"] == 0 || (!keepAlive && answered["activator"] == 0) {
				t.Errorf("answered by %v: want both the pod and the activator", answered)
			}
		})
	}
}
