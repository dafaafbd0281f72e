package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
	"github.com/sockscale/sockscale/test/bench/harness"
)

// footprint runs the real agent against a real kube-apiserver with 50 and
// then 250 pods on its node under load, and reports the agent's CPU and
// memory. One process with 250 addresses stands in for the pods: to the
// agent and the kernel they are 250 pods (250 addresses, 250 Pod objects).
func footprint(root string, d time.Duration) error {
	cp, err := harness.StartControlPlane("sockscale-agent")
	if err != nil {
		return err
	}
	defer cp.Stop()
	client := kubernetes.NewForConfigOrDie(cp.Cfg)

	pod, err := testpod.Create(testpod.Options{Subnet: 78, CgroupParent: root, Addresses: 250})
	if err != nil {
		return err
	}
	defer func() { _ = pod.Delete() }()
	if err := pod.Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
		return err
	}

	bin, err := harness.GoBuild(cp.Dir, "github.com/sockscale/sockscale/agent/cmd/sockscale-agent")
	if err != nil {
		return err
	}
	metricsAddr, healthAddr := "127.0.0.1:19090", "127.0.0.1:18081"
	pinDir := fmt.Sprintf("/sys/fs/bpf/sockscale-bench-%d", os.Getpid())
	agent := exec.Command(bin, "--node-name=bench-node", "--cgroup-root="+root, "--bpffs-dir="+pinDir,
		"--kubeconfig="+cp.Kubeconfig, "--activator-namespace=default", "--metrics-bind-address="+metricsAddr, "--metrics-secure=false", "--health-probe-bind-address="+healthAddr, "--log-level=warn")
	agent.Stderr = os.Stderr
	if err := agent.Start(); err != nil {
		return err
	}
	defer func() {
		_ = agent.Process.Kill()
		_ = agent.Wait()
		_ = exec.Command(bin, "--uninstall", "--bpffs-dir="+pinDir).Run()
	}()
	if err := harness.WaitHTTP("http://"+healthAddr+"/readyz", 20*time.Second); err != nil {
		return fmt.Errorf("agent not ready: %w", err)
	}

	fmt.Printf("\nAgent footprint: real agent and kube-apiserver; closed loop c=32 spread over the pods; %v per row\n", d)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "pods\t/metrics scraped every\trps\tagent CPU (% of a core)\tagent RSS\t/metrics size\t")
	created := 0
	for _, n := range []int{50, 250} {
		for ; created < n; created++ {
			if err := createPod(client, created, pod.IPs[created].String()); err != nil {
				return err
			}
		}
		if err := waitTracked(metricsAddr, n, 30*time.Second); err != nil {
			return err
		}
		urls := make([]string, n)
		for i := range urls {
			urls[i] = "http://" + net.JoinHostPort(pod.IPs[i].String(), strconv.Itoa(testpod.HTTPPort)) + "/?sleep=5ms"
		}
		// Prometheus's default scrape interval is 1m; 15s is common; every
		// second is the worst case.
		for _, scrapeEvery := range []time.Duration{time.Second, 15 * time.Second} {
			cpu0 := harness.ProcessCPU(agent.Process.Pid)
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), d)
			var size atomic.Int64
			go func() { // a Prometheus
				for ctx.Err() == nil {
					if body, err := harness.Get("http://" + metricsAddr + "/metrics"); err == nil {
						size.Store(int64(len(body)))
					}
					select {
					case <-ctx.Done():
					case <-time.After(scrapeEvery):
					}
				}
			}()
			load := loadgen.Start(ctx, loadgen.Options{URLs: urls, Concurrency: 32, KeepAlive: true})
			<-ctx.Done()
			requests := load.Stop().Completed
			cancel()
			elapsed := time.Since(start)
			cpu := harness.ProcessCPU(agent.Process.Pid) - cpu0
			fmt.Fprintf(w, "%d\t%v\t%.0f\t%.2f%%\t%.1f MB\t%d KB\t\n", n, scrapeEvery, float64(requests)/elapsed.Seconds(),
				100*cpu.Seconds()/elapsed.Seconds(), float64(harness.ProcessRSS(agent.Process.Pid))/(1<<20), size.Load()>>10)
		}
	}
	return w.Flush()
}

func createPod(client kubernetes.Interface, i int, ip string) error {
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("bench-%03d", i)},
		Spec:       corev1.PodSpec{NodeName: "bench-node", Containers: []corev1.Container{{Name: "c", Image: "c"}}},
	}
	created, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	_, err = client.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

func waitTracked(metricsAddr string, n int, timeout time.Duration) error {
	want := fmt.Sprintf("sockscale_agent_tracked_pods %d\n", n)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if body, err := harness.Get("http://" + metricsAddr + "/metrics"); err == nil && strings.Contains(body, want) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("agent never tracked %d pods", n)
}
