package podindex

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/controller/internal/metricsapi"
	"github.com/sockscale/sockscale/internal/podaddr"
)

// Pod is what the index keeps of a pod: enough to match an agent's record
// (the node that reported it, the address it counted). Node is empty until
// the pod is scheduled, IP invalid until it has one.
type Pod = metricsapi.PodRef

// Index is a cache of every pod in the cluster, trimmed as it enters to
// the fields Pod holds and the labels: the manager's own cache holds only
// the activators' pods, and the metrics APIs need every Deployment's,
// including those sockscale does not autoscale. Trimmed, a pod costs a few
// hundred bytes (its labels most of them) instead of several kilobytes.
// Start it (it is a manager.Runnable) before reading.
type Index struct {
	cache.Cache
}

// New returns an index of the cluster's pods read through cfg.
func New(cfg *rest.Config, scheme *runtime.Scheme) (*Index, error) {
	c, err := cache.New(cfg, cache.Options{
		Scheme:   scheme,
		ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: Trim}},
	})
	if err != nil {
		return nil, fmt.Errorf("pod index: %w", err)
	}
	return &Index{Cache: c}, nil
}

// NeedLeaderElection is false: every replica answers the metrics APIs,
// leader or not.
func (x *Index) NeedLeaderElection() bool { return false }

// Trim is the cache transform of pods: a new Pod with only its name,
// namespace, labels, node and addresses.
func Trim(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: passed on as it is
	}
	return &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
			ResourceVersion: p.ResourceVersion, Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}, nil
}

// List returns the pods of namespace that selector selects.
func (x *Index) List(ctx context.Context, namespace string, selector labels.Selector) ([]Pod, error) {
	var list corev1.PodList
	if err := x.Cache.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, fmt.Errorf("list pods of %s (%s): %w", namespace, selector, err)
	}
	out := make([]Pod, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, of(&list.Items[i]))
	}
	return out, nil
}

// Get returns the pod namespace/name; ok is false when there is none.
func (x *Index) Get(ctx context.Context, namespace, name string) (Pod, bool, error) {
	var p corev1.Pod
	switch err := x.Cache.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &p); {
	case apierrors.IsNotFound(err):
		return Pod{}, false, nil
	case err != nil:
		return Pod{}, false, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return of(&p), true, nil
}

// of is what the index answers of p. Its IP is the one address agents
// report it by (podaddr.Canonical: its IPv4 address in a dual-stack
// cluster, even when status.podIP is the IPv6 one), so that a record is
// trusted for that address only; invalid (the zero Addr) until it has one.
func of(p *corev1.Pod) Pod {
	ip, _ := podaddr.Canonical(&p.Status)
	return Pod{Name: p.Name, Node: p.Spec.NodeName, IP: ip}
}

var _ metricsapi.Pods = (*Index)(nil)
