package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/internal/testutil/workload"
)

// othersNamespace holds the cluster's other workloads (-others).
const othersNamespace = "scale-others"

// maxOthers bounds -others: 100,000 large Deployments and slices
// already take the one machine's API server and etcd a long setup.
const maxOthers = 100_000

// otherSlicePods is how many endpoints each other workload's
// EndpointSlice lists.
const otherSlicePods = 100

// setupOthers writes n workloads sockscale does not serve, each a
// Deployment as users write them and its Service's EndpointSlice of
// otherSlicePods pods (workload.Deployment, workload.EndpointSlice): the
// controller watches every Deployment and EndpointSlice of a cluster,
// and what it caches of these is what the rest of a cluster costs it.
func (sc *scaleCluster) setupOthers(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	if _, err := sc.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: othersNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: %w", othersNamespace, err)
	}
	return parallel(ctx, n, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("other-%d", i)
		d := workload.Deployment(othersNamespace, name)
		d.UID, d.ResourceVersion, d.ManagedFields = "", "", nil
		if _, err := sc.cs.AppsV1().Deployments(othersNamespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("deployment %s: %w", name, err)
		}
		s := workload.EndpointSlice(othersNamespace, name, otherSlicePods)
		s.UID, s.ResourceVersion, s.OwnerReferences = "", "", nil
		if _, err := sc.cs.DiscoveryV1().EndpointSlices(othersNamespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("endpointslice of %s: %w", name, err)
		}
		return nil
	})
}
