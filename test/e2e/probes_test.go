package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EProbesOnlyFromTheNode: requests with the kubelet's User-Agent are
// health probes, not load, only when they come from the node (here the
// host, whose addresses the agents follow in the nodes' network
// namespace); the same requests from a pod are load, as a tenant's that
// sent them to hide its load would be. The agent's check of the pod's
// connections against its socket table ran and found nothing to correct.
func TestE2EProbesOnlyFromTheNode(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	url := deploy(t, s, "probes", func(p *v1alpha1.PodAutoscalerSpec) { p.MinScale, p.MaxScale = ptr.To(int32(1)), ptr.To(int32(1)) })
	series := func() *stack.PodSeries {
		m, err := s.AgentMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ps := range m {
			if ps.Namespace == appNS && ps.Workload == "probes" {
				return ps
			}
		}
		t.Fatalf("no agent reports a pod of probes: %v", m)
		return nil
	}
	// settled waits until the agent's count of requests stands still and
	// returns it with the probes (which the node's readiness probes keep
	// moving).
	settled := func() (requests, probes float64) {
		e2etest.Eventually(t, 15*time.Second, "the agent's count settles", func() error {
			first := series().Values["sockscale_agent_requests_total"]
			time.Sleep(1500 * time.Millisecond)
			now := series().Values
			requests, probes = now["sockscale_agent_requests_total"], now["sockscale_agent_probes_total"]
			if requests != first {
				return fmt.Errorf("still moving: %v then %v", first, requests)
			}
			return nil
		})
		return requests, probes
	}
	if v, ok := series().Values["sockscale_agent_connections_miscounted"]; !ok || v != 0 {
		t.Errorf("the agent's check of the pod's connections: miscounted %v (reported: %t), want 0", v, ok)
	}

	// The kubelet probes the pod's own address, never a Service.
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app": "probes"}); err != nil || len(pods.Items) != 1 || pods.Items[0].Status.PodIP == "" {
		t.Fatalf("the pod of probes: %v (%d pods)", err, len(pods.Items))
	}
	podURL := "http://" + net.JoinHostPort(pods.Items[0].Status.PodIP, "8080") + "/"
	localRoute(t, netip.MustParseAddr(pods.Items[0].Status.PodIP))

	req0, probes0 := settled()
	fromNode := loadgen.Run(loadgen.Options{URLs: []string{podURL}, Concurrency: 2, Header: http.Header{"User-Agent": {"kube-probe/1.36"}}}, 2*time.Second)
	if fromNode.Failed > 0 || fromNode.Completed == 0 {
		t.Fatalf("probes from the node: %d completed, %d failed", fromNode.Completed, fromNode.Failed)
	}
	req1, probes1 := settled()
	// The node's readiness probes count too: at least ours.
	if req1 != req0 || probes1-probes0 < float64(fromNode.Completed) {
		t.Errorf("%d requests with a probe's User-Agent from the node: %v more load, %v more probes; want 0 and at least %d", fromNode.Completed, req1-req0, probes1-probes0, fromNode.Completed)
	}

	// From a pod, straight to the pod and through the public Service
	// (and the activators, if they are in its path: they disarm the
	// header, see handler.disarmProbeAgents).
	box := newClientSandbox(t, s, "prober", cluster.NodeName(0))
	for _, u := range []string{podURL, url} {
		fromPod := box.probeLoad(t, u, 2*time.Second)
		if fromPod.Failed > 0 || fromPod.Completed == 0 {
			t.Fatalf("probes from a pod to %s: %d completed, %d failed", u, fromPod.Completed, fromPod.Failed)
		}
		req2, _ := settled()
		if req2-req1 != float64(fromPod.Completed) {
			t.Errorf("%d requests with a probe's User-Agent from a pod to %s: %v counted as load, want all", fromPod.Completed, u, req2-req1)
		}
		req1 = req2
	}
}

const probeLoadEnv = "SOCKSCALE_E2E_PROBE_LOAD"

type probeLoadConfig struct {
	URL      string
	Duration time.Duration
}

// probeLoad runs TestHelperProbeLoad in the sandbox's network namespace:
// requests with the kubelet's User-Agent from the pod's own address.
func (b *clientSandbox) probeLoad(t *testing.T, url string, d time.Duration) loadgen.Result {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(probeLoadConfig{URL: url, Duration: d})
	cmd := exec.Command("ip", "netns", "exec", b.netns, self, "-test.run=^TestHelperProbeLoad$", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), probeLoadEnv+"="+string(js))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the probe load in %s: %v\n%s", b.pod, err, stderr.String())
	}
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "probe-load "); ok {
			var r loadgen.Result
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatalf("the probe load in %s said nothing:\n%s\n%s", b.pod, out, stderr.String())
	return loadgen.Result{}
}

// TestHelperProbeLoad is not a test: it is the pod's client (see
// clientSandbox.probeLoad) and returns at once unless it is that.
func TestHelperProbeLoad(t *testing.T) {
	js := os.Getenv(probeLoadEnv)
	if js == "" {
		return
	}
	var c probeLoadConfig
	if err := json.Unmarshal([]byte(js), &c); err != nil {
		t.Fatal(err)
	}
	r := loadgen.Run(loadgen.Options{URLs: []string{c.URL}, Concurrency: 2, Header: http.Header{"User-Agent": {"kube-probe/1.36"}}}, c.Duration)
	line, _ := json.Marshal(struct{ Completed, Failed int64 }{r.Completed, r.Failed})
	fmt.Printf("probe-load %s\n", line)
}
