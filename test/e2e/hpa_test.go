package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EHPAClass: a PodAutoscaler of the HPA class under the local
// cluster's real HPA controller (kube-controller-manager, 15 s sync),
// which reads the agents' per-pod concurrency through the custom metrics
// API: a step of load brings the count the HPA's formula gives, less load
// takes pods away, no load takes the target to zero (sockscale's part),
// and requests at zero are held by the activator and all answered.
func TestE2EHPAClass(t *testing.T) {
	s := up(t)
	t.Parallel() // with the package's other HPA and KEDA scenarios, after the rest: each has its own apps
	ctx := context.Background()
	const name = "hpa-class"
	// target 10 x 70 % = 7 requests in flight per pod; a 10 s window is
	// the HPA's scale-down stabilization too.
	url := deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) {
		p.Class, p.Metric, p.Target, p.MaxScale = v1alpha1.ClassHPA, "concurrency", ptr.To(10.0), ptr.To(int32(6))
		p.Window = &metav1.Duration{Duration: 10 * time.Second}
	})
	t.Cleanup(func() { _ = s.Remove(context.Background(), stack.App{Namespace: appNS, Name: name}) })
	var hpa autoscalingv2.HorizontalPodAutoscaler
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &hpa); err != nil {
		t.Fatalf("the HPA class made no HorizontalPodAutoscaler: %v", err)
	}

	// 21 in flight: the HPA's formula, ceil(1 x 21/7) = 3 pods, which then
	// hold at 7 each (within its 10 % tolerance).
	steady := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: 7, KeepAlive: true})
	defer steady.Stop()
	step := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: 14, KeepAlive: true})
	defer step.Stop()
	hpaCount(t, s, name, 3, 2*time.Minute, "at 21 in flight")
	if c := meta.FindStatusCondition(paOf(t, s, name).Status.Conditions, "HPAScalingActive"); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("under load the PodAutoscaler's HPAScalingActive condition is %+v, want True (the HPA reads the metric)", c)
	}
	for range 10 {
		if got := replicas(t, s, name); got != 3 {
			t.Fatalf("at 21 in flight on 3 pods the HPA went to %d: %s", got, paLine(t, s, name))
		}
		time.Sleep(2 * time.Second)
	}

	// 7 in flight: ceil(3 x 7/3/7) = 1.
	r := step.Stop()
	hpaCount(t, s, name, 1, 2*time.Minute, "at 7 in flight")

	// No load: sockscale takes the target to zero after the stable window
	// and the grace period, the activator in the path.
	r2 := steady.Stop()
	if failed := r.Failed + r2.Failed; failed > 0 {
		t.Errorf("%d of %d requests failed while the HPA scaled", failed, r.Completed+r2.Completed+failed)
	}
	waitAtZero(t, s, 2*time.Minute, name)

	// Ten requests at zero: held, then answered by the pods sockscale
	// brings at once (the HPA ignores a Deployment at zero).
	coldStart(t, s, url, name, "HPA class")
}

// TestE2EOwnHPAScaleToZero: the user's own HPA, as the HPA's docs write
// one, with minReplicas 0 (HPAScaleToZero, a feature gate the local
// cluster turns on) on the external metrics API's concurrency of its
// Deployment; sockscale only puts the activator in front while no pod is
// ready (PodAutoscaler class external.autoscaling.sockscale.dev). The HPA
// scales up on load and down to zero without it; requests at zero are
// held by the activator, whose count the external metric includes, until
// the HPA's next sync brings a pod; every one is answered.
func TestE2EOwnHPAScaleToZero(t *testing.T) {
	s := up(t)
	t.Parallel() // with the package's other HPA and KEDA scenarios, after the rest: each has its own apps
	ctx := context.Background()
	const name = "own-hpa"
	url := deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) { p.Class = v1alpha1.ClassExternal })
	t.Cleanup(func() { _ = s.Remove(context.Background(), stack.App{Namespace: appNS, Name: name}) })
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: name},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
			MinReplicas:    ptr.To(int32(0)),
			MaxReplicas:    5,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ExternalMetricSourceType, External: &autoscalingv2.ExternalMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: "concurrency", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"deployment": name}}},
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr.To(resource.MustParse("7"))},
			}}},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(int32(10))}},
		},
	}
	if err := s.Client.Create(ctx, hpa); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Client.Delete(context.Background(), hpa) })

	// 14 in flight: ceil(14/7) = 2 pods.
	load := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: 14, KeepAlive: true})
	defer load.Stop()
	hpaCount(t, s, name, 2, 2*time.Minute, "at 14 in flight")
	if r := load.Stop(); r.Failed > 0 {
		t.Errorf("%d of %d requests failed while the HPA scaled", r.Failed, r.Completed+r.Failed)
	}

	// No load: the HPA itself goes to zero; the activators take the
	// public Service.
	waitAtZero(t, s, 2*time.Minute, name)

	coldStart(t, s, url, name, "own HPA, minReplicas 0")
}

// hpaCount waits until the HPA has set want pods and they are ready.
func hpaCount(t *testing.T, s *stack.Stack, name string, want int32, timeout time.Duration, what string) {
	t.Helper()
	start := time.Now()
	e2etest.Eventually(t, timeout, fmt.Sprintf("%d pods %s", want, what), func() error {
		if got, ready := replicas(t, s, name), ready(t, s, name); got != want || ready != want {
			return fmt.Errorf("%d pods wanted, %d ready: %s", got, ready, hpaLine(s, name))
		}
		return nil
	})
	t.Logf("%s: %d pods after %s", what, want, time.Since(start).Round(time.Second))
}

// hpaLine says what HorizontalPodAutoscaler name last did and saw.
func hpaLine(s *stack.Stack, name string) string {
	var hpa autoscalingv2.HorizontalPodAutoscaler
	if err := s.Client.Get(context.Background(), client.ObjectKey{Namespace: appNS, Name: name}, &hpa); err != nil {
		return "HPA: " + err.Error()
	}
	line := fmt.Sprintf("HPA current %d desired %d", hpa.Status.CurrentReplicas, hpa.Status.DesiredReplicas)
	for _, m := range hpa.Status.CurrentMetrics {
		switch {
		case m.Pods != nil:
			line += fmt.Sprintf(", pods %s average %s", m.Pods.Metric.Name, m.Pods.Current.AverageValue)
		case m.External != nil:
			line += fmt.Sprintf(", external %s average %s", m.External.Metric.Name, m.External.Current.AverageValue)
		}
	}
	for _, c := range hpa.Status.Conditions {
		line += fmt.Sprintf("; %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
	}
	return line
}

// coldStart sends 10 requests at once to target at zero (url is its
// public URL) and checks that a pod of target answers each; it logs how
// long all took, as what.
func coldStart(t *testing.T, s *stack.Stack, url, target, what string) {
	t.Helper()
	start := time.Now()
	for i, c := range coldRequests(url, target, 10) {
		if c != "200" {
			t.Errorf("request %d at zero: %s, want 200 from a pod of %s", i, c, target)
		}
	}
	t.Logf("10 requests at zero answered in %s (%s): %s", time.Since(start).Round(time.Millisecond), what, paLine(t, s, target))
}

// coldRequests sends n requests at once to url, the public URL of
// target, and returns each one's outcome: "200" when a pod of target
// answered it, else what happened (a 200 from another app's pod, behind a
// stale address, is not an answer).
func coldRequests(url, target string, n int) []string {
	client := &http.Client{Timeout: 2 * time.Minute}
	out := make([]string, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			resp, err := client.Get(url)
			if err != nil {
				out[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body := strings.TrimSpace(string(b))
			switch {
			case resp.StatusCode != http.StatusOK:
				out[i] = fmt.Sprintf("%d %s", resp.StatusCode, body)
			case !strings.HasPrefix(body, "pod "+target+"-"):
				out[i] = "200 from another app: " + body
			default:
				out[i] = "200"
			}
		})
	}
	wg.Wait()
	return out
}
