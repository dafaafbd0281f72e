package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/internal/activatorprobe"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2ESocketRedirectSwitching: a target is switched between Serve and
// Proxy (its PodAutoscaler's target-burst-capacity between 0 and -1) under
// steady load from a client inside a pod on node-a (in the pod's netns and
// cgroup, as `kubectl exec` would put it, so node-a's connect4 program
// sees its connects) and probed from the test process, which is on no
// node (kube-proxy's path only). Every request of both succeeds, keep-alive
// or not; in Proxy mode every new connect of the in-node client goes to an
// activator by the kernel's redirect (its socket's real destination is an
// activator while getpeername shows the Service), counted by the node's
// agent; and each switch logs how long after the ServerlessService's status
// changed each client's first new connect went the new way.
func TestE2ESocketRedirectSwitching(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name, switches = "flip", 50
	url := deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) {
		p.MinScale, p.MaxScale, p.TargetBurstCapacity = ptr(int32(1)), ptr(int32(1)), ptr(0.0)
	})
	removeAtEnd(t, s, name)
	svc := netip.MustParseAddrPort(strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/"))
	localRoute(t, svc.Addr())
	for _, a := range readyActivators(t, s, 2, time.Minute) {
		localRoute(t, a.IP)
	}
	sks := watchMode(t, s, name)
	sks.wait(t, v1alpha1.ModeServe, time.Time{}, 30*time.Second)

	node := cluster.NodeName(0)
	agent := agentAddr(t, s, node)
	redirected := map[string]string{"namespace": appNS, "serverlessservice": name}
	before := scrapeSum(t, agent, "sockscale_agent_redirect_connects_total", redirected)

	const probeEvery = 5 * time.Millisecond
	in := startInNodeClient(t, s, node, innodeConfig{Addr: svc, KeepAlive: 4, NewConn: 4, Recycle: 20, Query: "?sleep=20", ProbeEvery: probeEvery})
	out := startOutsideProbes(svc, probeEvery)
	defer out.stop()
	waitFor(t, 30*time.Second, "both clients' probes answered by the pod", func() error {
		for _, c := range []struct {
			who    string
			probes []probeResult
		}{{"in-node", in.probes.since(time.Time{})}, {"outside", out.since(time.Time{})}} {
			if len(c.probes) < 5 || c.probes[len(c.probes)-1].Landed != landedPod {
				return fmt.Errorf("%s: %d probes, the last %+v", c.who, len(c.probes), last(c.probes))
			}
		}
		return nil
	})

	start := time.Now()
	var sw []switchAt
	for i := range switches {
		to, tbc := v1alpha1.ModeProxy, -1.0
		if i%2 == 1 {
			to, tbc = v1alpha1.ModeServe, 0.0
		}
		pa, err := s.PA(ctx, appNS, name)
		if err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(pa.DeepCopy())
		pa.Spec.TargetBurstCapacity = ptr(tbc)
		patched := time.Now()
		if err := s.Client.Patch(ctx, pa, patch); err != nil {
			t.Fatal(err)
		}
		seen := sks.wait(t, to, patched, 30*time.Second)
		sw = append(sw, switchAt{to: to, patched: patched, seen: seen})
		// Both clients' new connects go the new way before the next switch.
		waitFor(t, 30*time.Second, fmt.Sprintf("switch %d to %s: both clients follow", i+1, to), func() error {
			for _, c := range []struct {
				who    string
				probes []probeResult
			}{{"in-node", in.probes.since(patched)}, {"outside", out.since(patched)}} {
				if firstNew(c.probes, to, c.who == "in-node") == nil {
					return fmt.Errorf("%s: no new connect the new way in %d probes since the patch (the last %+v)", c.who, len(c.probes), last(c.probes))
				}
			}
			return nil
		})
		time.Sleep(500 * time.Millisecond) // load in the settled mode
	}
	took := time.Since(start)
	loads := in.stop(t)
	out.stop()
	after := scrapeSum(t, agent, "sockscale_agent_redirect_connects_total", redirected)

	inProbes, outProbes := in.probes.since(time.Time{}), out.since(time.Time{})
	var kernelConnects int
	for _, p := range inProbes {
		if p.Kernel {
			kernelConnects++
		}
	}
	var kernelToProxy, outToProxy, kernelToServe, inToServe, outToServe []time.Duration
	for i, w := range sw {
		end := time.Now()
		if i+1 < len(sw) {
			end = sw[i+1].patched
		}
		inW, outW := window(inProbes, w.patched, end), window(outProbes, w.patched, end)
		checkSettled(t, i+1, w.to, svc, inW)
		inFirst, outFirst := firstNew(inW, w.to, true), firstNew(outW, w.to, false)
		if inFirst == nil || outFirst == nil {
			t.Errorf("switch %d to %s: the in-node client's first new connect the new way %v, the outside client's %v", i+1, w.to, inFirst, outFirst)
			continue
		}
		inLat, outLat := inFirst.At.Sub(w.seen), outFirst.At.Sub(w.seen)
		if w.to == v1alpha1.ModeProxy {
			kernelToProxy, outToProxy = append(kernelToProxy, inLat), append(outToProxy, outLat)
			t.Logf("switch %2d to Proxy: status seen %s after the patch; first new connect to an activator (the last one before it in brackets): in-node by the kernel %s, outside by kube-proxy %s after the status",
				i+1, w.seen.Sub(w.patched).Round(time.Millisecond), switched(inW, w.to, true, w.seen), switched(outW, w.to, false, w.seen))
			continue
		}
		unredirected := firstUnredirected(inW)
		kernelToServe = append(kernelToServe, unredirected.At.Sub(w.seen))
		inToServe, outToServe = append(inToServe, inLat), append(outToServe, outLat)
		t.Logf("switch %2d to Serve: status seen %s after the patch; in-node: kernel redirect gone %+.1f ms, first new connect to the pod %s; outside (kube-proxy): to the pod %s after the status",
			i+1, w.seen.Sub(w.patched).Round(time.Millisecond), ms(unredirected.At.Sub(w.seen)), switched(inW, w.to, true, w.seen), switched(outW, w.to, false, w.seen))
	}
	t.Logf("%d switches in %s; a new connect probed every %s by the in-node client, every %s outside (at most one each %s); times are from the ServerlessService's status change as this test's watch saw it, negative when a client switched first",
		switches, took.Round(100*time.Millisecond), meanGap(inProbes).Round(100*time.Microsecond), meanGap(outProbes).Round(100*time.Microsecond), probeEvery)
	t.Logf("to Proxy, first new connect to an activator: in-node via the kernel p50 %+.1f ms p99 %+.1f ms; outside via kube-proxy p50 %+.1f ms p99 %+.1f ms (n=%d each, p99 is the max below 100)",
		ms(pct(kernelToProxy, 0.5)), ms(pct(kernelToProxy, 0.99)), ms(pct(outToProxy, 0.5)), ms(pct(outToProxy, 0.99)), len(kernelToProxy))
	t.Logf("to Serve: in-node kernel redirect gone p50 %+.1f ms p99 %+.1f ms; first new connect to the pod (kube-proxy, both clients): in-node p50 %+.1f ms p99 %+.1f ms, outside p50 %+.1f ms p99 %+.1f ms (n=%d)",
		ms(pct(kernelToServe, 0.5)), ms(pct(kernelToServe, 0.99)), ms(pct(inToServe, 0.5)), ms(pct(inToServe, 0.99)), ms(pct(outToServe, 0.5)), ms(pct(outToServe, 0.99)), len(inToServe))

	// Nothing failed, on either path.
	for _, l := range loads {
		t.Logf("in-node %s load: %d requests on %d connections, %d failed", l.Kind, l.Completed, l.Conns, l.Failed)
		if l.Failed > 0 || l.Completed == 0 {
			t.Errorf("in-node %s load: %d of %d requests failed, e.g. %q", l.Kind, l.Failed, l.Completed+l.Failed, l.Failures)
		}
	}
	for _, c := range []struct {
		who    string
		probes []probeResult
	}{{"in-node", inProbes}, {"outside", outProbes}} {
		var failed []string
		for _, p := range c.probes {
			if p.Err != "" {
				failed = append(failed, p.At.Format("15:04:05.000")+" "+p.Err)
			}
		}
		t.Logf("%s probes: %d new connections, %d failed", c.who, len(c.probes), len(failed))
		if len(failed) > 0 {
			t.Errorf("%s probes: %d of %d failed, e.g. %q", c.who, len(failed), len(c.probes), failed[:min(5, len(failed))])
		}
	}
	// The kernel path was exercised, and the node's agent counted it.
	t.Logf("%d of the in-node client's probes were redirected by the kernel; node %s's agent counted %v redirected connects for %s/%s", kernelConnects, node, after-before, appNS, name)
	if kernelConnects == 0 || after-before < float64(kernelConnects) {
		t.Errorf("sockscale_agent_redirect_connects_total on %s grew by %v, want at least the %d probes the kernel redirected", node, after-before, kernelConnects)
	}
}

// switchAt is one switch: the patch of the PodAutoscaler and when this
// test saw the ServerlessService's status follow.
type switchAt struct {
	to            v1alpha1.Mode
	patched, seen time.Time
}

// Where a probe landed: the activator answers a probe itself
// (activatorprobe), a pod answers it as any request.
const (
	landedActivator = "activator"
	landedPod       = "pod"
)

// probeResult is one probe: a new connection to the Service and a
// request only an activator answers in kind.
type probeResult struct {
	At     time.Time // connect() called
	Landed string    `json:",omitempty"` // landedActivator or landedPod; "" if it failed
	// Kernel (in-node only): the socket's real destination (Dest, from
	// /proc/self/net/tcp, read when an activator answered) is not the
	// address dialled: connect4 rewrote it.
	Kernel bool           `json:",omitempty"`
	Dest   netip.AddrPort `json:",omitzero"`
	// Peer is what getpeername says (in-node only): the address dialled,
	// whatever the destination.
	Peer netip.AddrPort `json:",omitzero"`
	Err  string         `json:",omitempty"`
}

// firstNew is the first probe that went the way of mode to: an activator
// (by the kernel's redirect if kernel) or a pod (not redirected).
func firstNew(probes []probeResult, to v1alpha1.Mode, kernel bool) *probeResult {
	if i := firstNewIndex(probes, to, kernel); i >= 0 {
		return &probes[i]
	}
	return nil
}

func firstNewIndex(probes []probeResult, to v1alpha1.Mode, kernel bool) int {
	return slices.IndexFunc(probes, func(p probeResult) bool { return wentTo(p, to, kernel) })
}

// switched says when a client's connects went the new way, from the
// status change seen: at the first probe that did, after the last one
// that did not (the switch took effect in between), e.g. "+6.3 ms (+1.2)".
func switched(probes []probeResult, to v1alpha1.Mode, kernel bool, seen time.Time) string {
	i := firstNewIndex(probes, to, kernel)
	if i < 0 {
		return "never"
	}
	if i == 0 {
		return fmt.Sprintf("%+.1f ms (the first probe)", ms(probes[i].At.Sub(seen)))
	}
	return fmt.Sprintf("%+.1f ms (%+.1f)", ms(probes[i].At.Sub(seen)), ms(probes[i-1].At.Sub(seen)))
}

func wentTo(p probeResult, to v1alpha1.Mode, kernel bool) bool {
	if to == v1alpha1.ModeProxy {
		return p.Landed == landedActivator && (p.Kernel || !kernel)
	}
	return p.Landed == landedPod && !p.Kernel
}

func firstUnredirected(probes []probeResult) probeResult {
	for _, p := range probes {
		if !p.Kernel && p.Err == "" {
			return p
		}
	}
	return probeResult{}
}

// checkSettled: once the in-node client's new connects went the new way,
// all of them do until the next switch: in Proxy each is redirected to an
// activator by the kernel, in Serve none is and each reaches the pod; and
// getpeername always shows the Service's address.
func checkSettled(t *testing.T, n int, to v1alpha1.Mode, svc netip.AddrPort, probes []probeResult) {
	t.Helper()
	settled := false
	bad := 0
	for _, p := range probes {
		if p.Err != "" {
			continue // counted with the failures
		}
		if p.Peer != svc {
			t.Errorf("switch %d: getpeername said %s for a connect to %s (redirected to %s: %v)", n, p.Peer, svc, p.Dest, p.Kernel)
		}
		if p.Kernel && p.Dest.Port() != stack.ActivatorProxyPort {
			t.Errorf("switch %d: a connect redirected to %s, not to an activator's port %d", n, p.Dest, stack.ActivatorProxyPort)
		}
		if settled = settled || wentTo(p, to, true); settled && !wentTo(p, to, true) {
			if bad++; bad <= 3 {
				t.Errorf("switch %d to %s: after the in-node client's connects went the new way, one at %s went to %s (%s, redirected %v)", n, to, p.At.Format("15:04:05.000"), p.Landed, p.Dest, p.Kernel)
			}
		}
	}
}

func window(probes []probeResult, from, to time.Time) []probeResult {
	var out []probeResult
	for _, p := range probes {
		if !p.At.Before(from) && p.At.Before(to) {
			out = append(out, p)
		}
	}
	return out
}

func last(probes []probeResult) *probeResult {
	if len(probes) == 0 {
		return nil
	}
	return &probes[len(probes)-1]
}

// probe opens a new connection to svc and sends an activator probe on it.
// inNode also reads the socket's real destination.
func probe(svc netip.AddrPort, inNode bool) probeResult {
	r := probeResult{At: time.Now()}
	conn, err := net.DialTimeout("tcp4", svc.String(), 3*time.Second)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer conn.Close()
	if inNode {
		peer := conn.RemoteAddr().(*net.TCPAddr).AddrPort()
		r.Peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	req := "GET / HTTP/1.1\r\nHost: " + svc.String() + "\r\n" + activatorprobe.Header + ": " + activatorprobe.Value +
		"\r\nUser-Agent: " + activatorprobe.UserAgent + "\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		r.Err = err.Error()
		return r
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodGet})
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		r.Err = err.Error()
		return r
	}
	if resp.StatusCode != http.StatusOK {
		r.Err = resp.Status
		return r
	}
	r.Landed = landedPod
	if resp.Header.Get(activatorprobe.ResponseHeader) == "" {
		return r // a pod: kube-proxy's path, the kernel redirects to activators only
	}
	r.Landed = landedActivator
	if inNode {
		// Still listed (the socket is open): by the kernel or by kube-proxy?
		if r.Dest, err = socketDest(conn.(*net.TCPConn)); err != nil {
			r.Err = err.Error()
			return r
		}
		r.Kernel = r.Dest != svc
	}
	return r
}

// socketDest is the real remote address of conn, which getpeername does
// not show under the redirect: its line in /proc/self/net/tcp, found by the
// socket's inode (a local port may be shared by connections to different
// destinations).
func socketDest(conn *net.TCPConn) (netip.AddrPort, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var st unix.Stat_t
	var statErr error
	if err := raw.Control(func(fd uintptr) { statErr = unix.Fstat(int(fd), &st) }); err != nil {
		return netip.AddrPort{}, err
	}
	if statErr != nil {
		return netip.AddrPort{}, statErr
	}
	b, err := os.ReadFile("/proc/self/net/tcp")
	if err != nil {
		return netip.AddrPort{}, err
	}
	inode := strconv.FormatUint(st.Ino, 10)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(line)
		if len(f) < 10 || f[9] != inode {
			continue
		}
		return procAddr(f[2])
	}
	return netip.AddrPort{}, fmt.Errorf("socket inode %s not in /proc/self/net/tcp", inode)
}

// procAddr parses /proc/net/tcp's "0100007F:1F90": the IPv4 address as
// the kernel's __be32 printed in host order, the port in host order.
func procAddr(s string) (netip.AddrPort, error) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	ip, err1 := strconv.ParseUint(ipHex, 16, 32)
	port, err2 := strconv.ParseUint(portHex, 16, 16)
	if !ok || err1 != nil || err2 != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q in /proc/net/tcp", s)
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(ip))
	return netip.AddrPortFrom(netip.AddrFrom4(b), uint16(port)), nil
}

// probes is a growing list of probe results, read while it grows.
type probes struct {
	mu   sync.Mutex
	list []probeResult
}

func (p *probes) add(r probeResult) {
	p.mu.Lock()
	p.list = append(p.list, r)
	p.mu.Unlock()
}

// since returns the probes made at or after t.
func (p *probes) since(t time.Time) []probeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, _ := slices.BinarySearchFunc(p.list, t, func(r probeResult, t time.Time) int { return r.At.Compare(t) })
	return slices.Clone(p.list[i:])
}

// outsideProbes probes from the test process: on no node, so only
// kube-proxy switches its connects.
type outsideProbes struct {
	probes
	cancel context.CancelFunc
	done   chan struct{}
}

func startOutsideProbes(svc netip.AddrPort, every time.Duration) *outsideProbes {
	ctx, cancel := context.WithCancel(context.Background())
	o := &outsideProbes{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		paced(ctx, every, func() { o.add(probe(svc, false)) })
	}()
	return o
}

func (o *outsideProbes) stop() {
	o.cancel()
	<-o.done
}

// paced calls f every period (at once if it took longer) until ctx ends.
func paced(ctx context.Context, every time.Duration, f func()) {
	next := time.Now()
	for ctx.Err() == nil {
		f()
		next = next.Add(every)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		} else {
			next = time.Now()
		}
	}
}

// The in-node client is this test binary run again (TestHelperInNodeClient)
// through `ip netns exec` in a pod's netns and cloned into the pod's cgroup.
// It writes a line per probe, then its loads' results, to stdout, and
// stops when its stdin closes.
const (
	innodeEnv       = "SOCKSCALE_E2E_INNODE_CLIENT"
	innodeProbe     = "innode-probe "
	innodeLoad      = "innode-load "
	innodeRunning   = "innode-running"
	innodeClientPod = "flip-client"
)

type innodeConfig struct {
	Addr netip.AddrPort
	// KeepAlive and NewConn are the clients of the two loads; each
	// keep-alive client closes its connection every Recycle requests, so
	// connections made in one mode live on into the next.
	KeepAlive, NewConn, Recycle int
	// Query is the load's request ("?sleep=20": 20 ms at the pod).
	Query      string
	ProbeEvery time.Duration
}

// loadResult is one of the in-node client's loads.
type loadResult struct {
	Kind                     string
	Completed, Failed, Conns int64
	Failures                 []string // the first few
}

// TestHelperInNodeClient is not a test: it is the in-node client's process
// (see startInNodeClient) and returns at once unless it is that.
func TestHelperInNodeClient(t *testing.T) {
	cfgJSON := os.Getenv(innodeEnv)
	if cfgJSON == "" {
		return
	}
	var cfg innodeConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		t.Fatalf("$%s: %v", innodeEnv, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var outMu sync.Mutex
	emit := func(prefix string, v any) {
		b, _ := json.Marshal(v)
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf("%s%s\n", prefix, b)
	}
	url := "http://" + cfg.Addr.String() + "/" + cfg.Query
	loads := []*loadResult{{Kind: "keep-alive"}, {Kind: "new-connection"}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for kind, n := range []int{cfg.KeepAlive, cfg.NewConn} {
		res := loads[kind]
		for range n {
			wg.Go(func() {
				tr := &http.Transport{DisableKeepAlives: kind == 1, MaxIdleConnsPerHost: 1, Proxy: nil}
				defer tr.CloseIdleConnections()
				c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
				var conns atomic.Int64
				trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
					if !i.Reused {
						conns.Add(1)
					}
				}}
				var mine loadResult
				// Requests are not cancelled at the end: one in flight
				// finishes and counts.
				for i := 1; ctx.Err() == nil; i++ {
					req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, url, nil)
					at := time.Now()
					err := getOK(c, req)
					if err != nil {
						mine.Failed++
						if len(mine.Failures) < 3 {
							mine.Failures = append(mine.Failures, at.Format("15:04:05.000")+" "+err.Error())
						}
					} else {
						mine.Completed++
					}
					if kind == 0 && i%cfg.Recycle == 0 {
						tr.CloseIdleConnections()
					}
				}
				mu.Lock()
				res.Completed += mine.Completed
				res.Failed += mine.Failed
				res.Conns += conns.Load()
				res.Failures = append(res.Failures, mine.Failures...)
				mu.Unlock()
			})
		}
	}
	wg.Go(func() { paced(ctx, cfg.ProbeEvery, func() { emit(innodeProbe, probe(cfg.Addr, true)) }) })
	fmt.Println(innodeRunning)
	wg.Wait()
	for _, l := range loads {
		emit(innodeLoad, l)
	}
}

func getOK(c *http.Client, req *http.Request) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "pod ") {
		return fmt.Errorf("%s: %q", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// inNodeClient is the running in-node client.
type inNodeClient struct {
	probes probes
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	loads  []loadResult
	// read is closed when its stdout is read to the end.
	read   chan struct{}
	stderr strings.Builder
	once   sync.Once
}

// startInNodeClient runs the in-node client in a pod of its own on node:
// its network namespace and its cgroup (below the node's, where the node's
// agent attached its programs), as `kubectl exec` would.
func startInNodeClient(t *testing.T, s *stack.Stack, node string, cfg innodeConfig) *inNodeClient {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: innodeClientPod, Labels: map[string]string{"app": innodeClientPod}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{
				Name: "app", Image: stack.AppImage, Args: []string{"--port=8080", "--shutdown-delay=0s"},
			}},
		},
	}
	if err := s.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
			t.Errorf("delete pod %s: %v", pod.Name, err)
		}
	})
	var netns, cgroup string
	eventually(t, time.Minute, "the client pod runs", func() error {
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if pod.Status.PodIP == "" || len(pod.Status.ContainerStatuses) == 0 || pod.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("phase %s, IP %q", pod.Status.Phase, pod.Status.PodIP)
		}
		var err error
		if netns, cgroup, err = cluster.PodSandbox(pod); err != nil {
			return err
		}
		for _, p := range []string{"/run/netns/" + netns, cgroup} {
			if _, err := os.Stat(p); err != nil {
				return err
			}
		}
		return nil
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	c := &inNodeClient{read: make(chan struct{})}
	c.cmd = exec.Command("ip", "netns", "exec", netns, self, "-test.run=^TestHelperInNodeClient$", "-test.timeout=10m")
	c.cmd.Env = append(os.Environ(), innodeEnv+"="+string(b))
	c.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Pdeathsig: syscall.SIGKILL}
	c.cmd.Stderr = &c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.stop(t) })
	running := make(chan struct{})
	go func() {
		defer close(c.read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == innodeRunning:
				close(running)
			case strings.HasPrefix(line, innodeProbe):
				var r probeResult
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, innodeProbe)), &r); err == nil {
					c.probes.add(r)
				}
			case strings.HasPrefix(line, innodeLoad):
				var l loadResult
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, innodeLoad)), &l); err == nil {
					c.loads = append(c.loads, l)
				}
			}
		}
	}()
	select {
	case <-running:
	case <-c.read:
		t.Fatalf("the in-node client ended before it ran: %v\n%s", c.cmd.Wait(), c.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the in-node client did not start within 30 s")
	}
	t.Logf("in-node client: pid %d in pod %s on %s (netns %s, cgroup %s)", c.cmd.Process.Pid, pod.Name, node, netns, cgroup)
	return c
}

// stop ends the client (its requests in flight finish) and returns its
// loads' results.
func (c *inNodeClient) stop(t *testing.T) []loadResult {
	t.Helper()
	c.once.Do(func() {
		_ = c.stdin.Close()
		select {
		case <-c.read:
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.read
			t.Error("the in-node client did not stop within 30 s: killed")
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("the in-node client: %v\n%s", err, c.stderr.String())
		}
		if len(c.loads) != 2 {
			t.Errorf("the in-node client reported %d loads, want 2", len(c.loads))
		}
	})
	return c.loads
}

// modeWatch follows a ServerlessService's status: when this test saw each
// change of its mode (counted only with a True Ready condition).
type modeWatch struct {
	mu   sync.Mutex
	seen []modeSeen
}

type modeSeen struct {
	at   time.Time
	mode v1alpha1.Mode
}

func watchMode(t *testing.T, s *stack.Stack, name string) *modeWatch {
	t.Helper()
	wc, err := client.NewWithWatch(shared.Config, client.Options{Scheme: s.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &modeWatch{}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	var wt watch.Interface
	if wt, err = wc.Watch(ctx, &v1alpha1.ServerlessServiceList{}, client.InNamespace(appNS)); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for ev := range wt.ResultChan() {
				sks, ok := ev.Object.(*v1alpha1.ServerlessService)
				if !ok || sks.Name != name {
					continue
				}
				mode := sks.Status.Mode
				if !meta.IsStatusConditionTrue(sks.Status.Conditions, "Ready") {
					mode = ""
				}
				w.mu.Lock()
				if len(w.seen) == 0 || w.seen[len(w.seen)-1].mode != mode {
					w.seen = append(w.seen, modeSeen{at: time.Now(), mode: mode})
				}
				w.mu.Unlock()
			}
			wt.Stop()
			// The server ended the watch: start again (a change in
			// between is seen with the next event's state).
			for ctx.Err() == nil {
				if wt, err = wc.Watch(ctx, &v1alpha1.ServerlessServiceList{}, client.InNamespace(appNS)); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		if wt != nil {
			wt.Stop()
		}
	}()
	return w
}

// wait returns when the status changed to mode at or after from.
func (w *modeWatch) wait(t *testing.T, mode v1alpha1.Mode, from time.Time, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, timeout, "the ServerlessService's status says "+string(mode), func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, s := range w.seen {
			if s.mode == mode && !s.at.Before(from) {
				at = s.at
				return nil
			}
		}
		if from.IsZero() && len(w.seen) > 0 && w.seen[len(w.seen)-1].mode == mode {
			at = w.seen[len(w.seen)-1].at
			return nil
		}
		return fmt.Errorf("seen %v", w.seen)
	})
	return at
}

// waitFor is eventually with a 20 ms step, for waits measured in
// milliseconds.
func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	poll(t, timeout, 20*time.Millisecond, what, f)
}

// agentAddr is the address of node's ready agent pod.
func agentAddr(t *testing.T, s *stack.Stack, node string) netip.Addr {
	t.Helper()
	var addr netip.Addr
	eventually(t, time.Minute, "a ready agent on "+node, func() error {
		var pods corev1.PodList
		if err := s.Client.List(context.Background(), &pods, client.InNamespace(stack.Namespace), client.MatchingLabels{"app.kubernetes.io/component": "agent"}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if p.Spec.NodeName != node || p.DeletionTimestamp != nil || err != nil {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					addr = ip
					return nil
				}
			}
		}
		return fmt.Errorf("none of %d agent pods", len(pods.Items))
	})
	localRoute(t, addr)
	return addr
}

func scrapeSum(t *testing.T, ip netip.Addr, metric string, match map[string]string) float64 {
	t.Helper()
	m, err := stack.Scrape(context.Background(), ip, 9090)
	if err != nil {
		t.Fatal(err)
	}
	return stack.Sum(m, metric, match)
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// meanGap is the mean time between the starts of consecutive probes.
func meanGap(p []probeResult) time.Duration {
	if len(p) < 2 {
		return 0
	}
	return p[len(p)-1].At.Sub(p[0].At) / time.Duration(len(p)-1)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
