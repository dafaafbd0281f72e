package sks

import (
	"context"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PublicAddress resolves a public Service to the ClusterIP and port its
// clients dial (the first port when it has several), for the activator
// probe.
func PublicAddress(c client.Reader) func(ctx context.Context, namespace, service string) (string, error) {
	return func(ctx context.Context, ns, name string) (string, error) {
		var svc corev1.Service
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
			return "", err
		}
		if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone || len(svc.Spec.Ports) == 0 {
			return "", fmt.Errorf("service %s/%s has no ClusterIP and port to probe", ns, name)
		}
		return net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port))), nil
	}
}
