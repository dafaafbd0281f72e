package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/bucket"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/stats/report"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationBucketsSplitTargets runs two replicas with --buckets=4
// against a real kube-apiserver, eight targets under load reported by
// the agents' reporter. The replicas hold two buckets each and each
// target is decided by one of them only (its per-target series are on
// the owner's /metrics, not the other's); every target is scaled to its
// load; the reporter sends each replica only its targets' records. When
// one replica stops, the other holds all four buckets within seconds
// and acts on the next change of load of every target.
func TestIntegrationBucketsSplitTargets(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	const targets = 8
	name := func(i int) string { return fmt.Sprintf("t-%d", i) }
	for i := range targets {
		cl.CreateDeployment(t, "default", name(i), 1, 1)
		if err := c.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name(i)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, &v1alpha1.PodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name(i)},
			Spec: v1alpha1.PodAutoscalerSpec{
				ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: name(i)},
				Service:        v1alpha1.ServiceRef{Name: name(i)},
			},
		}); err != nil {
			t.Fatal(err)
		}
	}
	bin := buildController(t)
	// The replicas listen on one port at two loopback addresses, as two
	// pods behind the stats Service would, and the agent is the agents'
	// own reporter, resolving the Service to the replicas running.
	port := sharedPort(t, "127.0.0.2", "127.0.0.3")
	start := func(id, ip string) *replica {
		r := startReplica(t, cl, bin, id, "--buckets=4", "--stats-bind-address="+net.JoinHostPort(ip, port))
		r.stats = net.JoinHostPort(ip, port)
		return r
	}

	// The agent: one pod per target, each with load in flight, reported
	// every second.
	var mu sync.Mutex
	load := 200.0 // ceil(200/70) = 3 pods at the default target of 70
	running := []string{"127.0.0.2", "127.0.0.3"}
	agent, err := report.New("sockscale-controller-stats:"+port, 2*time.Second, &posts{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	agent.SetResolver(func(context.Context, string) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(running), nil
	})
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			mu.Lock()
			b := &stats.Batch{Node: "node-a", Start: time.Now().Add(-time.Second), Period: time.Second}
			for i := range targets {
				b.Pods = append(b.Pods, stats.PodStat{IP: netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + i)}), Namespace: "default",
					Pod: name(i) + "-abc", Workload: name(i), Concurrency: load, Requests: uint64(load * 10)})
			}
			mu.Unlock()
			agent.Send(context.Background(), b)
		}
	}()

	a, b := start("replica-a", "127.0.0.2"), start("replica-b", "127.0.0.3")
	allAt := func(want int32) func() (bool, string) {
		return func() (bool, string) {
			var got []string
			ok := true
			for i := range targets {
				n := cl.Replicas(t, "default", name(i))
				got = append(got, fmt.Sprintf("%s=%d", name(i), n))
				ok = ok && n == want
			}
			return ok, strings.Join(got, " ") + fmt.Sprintf("; buckets held: replica-a %v, replica-b %v", a.metricSum("sockscale_controller_bucket_held"), b.metricSum("sockscale_controller_bucket_held"))
		}
	}
	testenv.Eventually(t, 90*time.Second, "every target scaled to 3", allAt(3))
	testenv.Eventually(t, 30*time.Second, "two buckets held by each replica", func() (bool, string) {
		ha, hb := a.metricSum("sockscale_controller_bucket_held"), b.metricSum("sockscale_controller_bucket_held")
		return ha == 2 && hb == 2, fmt.Sprintf("replica-a %v, replica-b %v", ha, hb)
	})
	// Each target is decided by exactly the replica that holds its bucket.
	for i := range targets {
		series := fmt.Sprintf(`sockscale_controller_desired_pods{namespace="default",podautoscaler="%s"}`, name(i))
		owner, other := a, b
		if a.metricSeries(fmt.Sprintf(`sockscale_controller_bucket_held{bucket="%d"}`, bucket.Of("default", name(i), 4))) != 1 {
			owner, other = b, a
		}
		if got := owner.metricSeries(series); got != 3 {
			t.Errorf("%s: its bucket's holder %s reports desired %v, want 3", name(i), owner.name, got)
		}
		if got := other.metricSeries(series); got != -1 {
			t.Errorf("%s: %s, which does not hold its bucket, decides it too (desired %v)", name(i), other.name, got)
		}
	}

	// The agent sends each replica only the records of its buckets: over
	// 4 s, each takes its own targets' records and no others.
	own := map[*replica]int{}
	for i := range targets {
		if a.metricSeries(fmt.Sprintf(`sockscale_controller_bucket_held{bucket="%d"}`, bucket.Of("default", name(i), 4))) == 1 {
			own[a]++
		} else {
			own[b]++
		}
	}
	records := func(r *replica) float64 {
		return r.metricSeries(`sockscale_controller_stats_records_total{kind="pod"}`)
	}
	a0, b0 := records(a), records(b)
	time.Sleep(4 * time.Second)
	for r, n0 := range map[*replica]float64{a: a0, b: b0} {
		took := records(r) - n0
		// 4 or 5 posts in 4 s, each with the replica's own targets only.
		if took < float64(4*own[r]) || took > float64(5*own[r]) {
			t.Errorf("%s took %v pod records in 4 s, want those of its %d targets only (%d to %d; every target's would be %d)",
				r.name, took, own[r], 4*own[r], 5*own[r], 4*targets)
		}
	}

	// replica-a stops (a rollout): replica-b takes its buckets at once.
	stopped := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	mu.Lock()
	running = []string{"127.0.0.3"}
	mu.Unlock()
	testenv.Eventually(t, 30*time.Second, "replica-b to hold every bucket", func() (bool, string) {
		for i := range targets { // the windows were warm: no scale-down at the handover
			if got := cl.Replicas(t, "default", name(i)); got < 3 {
				t.Fatalf("%s after replica-a stopped: %s has %d replicas, want at least 3", time.Since(stopped).Round(time.Millisecond), name(i), got)
			}
		}
		h := b.metricSum("sockscale_controller_bucket_held")
		return h == 4, fmt.Sprintf("replica-b holds %v", h)
	})
	took := time.Since(stopped)
	t.Logf("replica-b held every bucket %v after replica-a was told to stop", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("replica-b held every bucket %v after replica-a was told to stop, want within 10 s (released, not expired: 15 s)", took.Round(time.Millisecond))
	}
	mu.Lock()
	load = 400 // ceil(400/70) = 6
	mu.Unlock()
	testenv.Eventually(t, 60*time.Second, "every target scaled to 6 by replica-b", allAt(6))
}

// sharedPort is a TCP port free on every one of ips.
func sharedPort(t *testing.T, ips ...string) string {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(l.Addr().String())
		free := true
		for _, ip := range ips[1:] {
			l2, err := net.Listen("tcp", net.JoinHostPort(ip, port))
			if err != nil {
				free = false
				break
			}
			l2.Close()
		}
		l.Close()
		if free {
			return port
		}
	}
	t.Fatalf("no port free on all of %v", ips)
	return ""
}

// posts counts the agent's posts (report.Recorder).
type posts struct{ ok, failed, refused atomic.Int64 }

func (p *posts) Report(ok bool) {
	if ok {
		p.ok.Add(1)
	} else {
		p.failed.Add(1)
	}
}
func (p *posts) Refused()     { p.refused.Add(1) }
func (p *posts) Error(string) {}

// metricSeries is the value of the series named exactly so (name and
// labels as /metrics prints them), or -1.
func (r *replica) metricSeries(series string) float64 {
	v, _ := r.scan(func(s string) bool { return s == series })
	return v
}

// metricSum adds up every series of name, or -1 when there is none.
func (r *replica) metricSum(name string) float64 {
	_, sum := r.scan(func(s string) bool { return s == name || strings.HasPrefix(s, name+"{") })
	return sum
}

// scan reads the replica's /metrics: the first value and the sum of the
// series match accepts (-1 and -1 when none).
func (r *replica) scan(match func(series string) bool) (first, sum float64) {
	first, sum = -1, -1
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") || !match(line[:i]) {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		if first == -1 && sum == -1 {
			first, sum = v, 0
		}
		sum += v
	}
	return
}
