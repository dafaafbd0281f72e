package endpoints

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/internal/podaddr"
)

// ReadyActivators are the activator pods (selector in namespace ns, ""
// for every namespace) that are Ready, not terminating, and have an
// address: the ones traffic may be sent to. Each slice family lists the
// activators that have an address of its family (Endpoint.AddrOf).
func ReadyActivators(ctx context.Context, c client.Reader, ns string, selector labels.Selector) ([]Endpoint, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, fmt.Errorf("list activator pods: %w", err)
	}
	var out []Endpoint
	for _, p := range pods.Items {
		ip, ok := podaddr.Canonical(&p.Status)
		if !ok || p.DeletionTimestamp != nil || !podReady(&p) {
			continue
		}
		out = append(out, Endpoint{Name: p.Name, IP: ip, Addrs: podaddr.All(&p.Status)})
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
