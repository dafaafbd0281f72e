package sks

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PublicAddress resolves a public Service to the ClusterIP and port its
// clients dial, for the activator probe: the PodAutoscaler's
// spec.service.port when it sets one (it must be one of the Service's
// ports), else the Service's first TCP port (the probe is HTTP).
func PublicAddress(c client.Reader) func(ctx context.Context, namespace, service string, port int32) (string, error) {
	return func(ctx context.Context, ns, name string, port int32) (string, error) {
		var svc corev1.Service
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
			return "", err
		}
		if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone || len(svc.Spec.Ports) == 0 {
			return "", fmt.Errorf("service %s/%s has no ClusterIP and port to probe", ns, name)
		}
		var have []string
		for _, p := range svc.Spec.Ports {
			have = append(have, strconv.Itoa(int(p.Port)))
			tcp := p.Protocol == "" || p.Protocol == corev1.ProtocolTCP
			if (port == 0 && tcp) || (port != 0 && p.Port == port) {
				return net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(p.Port))), nil
			}
		}
		if port != 0 {
			return "", fmt.Errorf("spec.service.port %d is not a port of Service %s/%s (it has %s)", port, ns, name, strings.Join(have, ", "))
		}
		return "", fmt.Errorf("service %s/%s has no ClusterIP and port to probe: no TCP port", ns, name)
	}
}
