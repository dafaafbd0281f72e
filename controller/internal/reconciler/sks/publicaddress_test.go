package sks

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestPublicAddress(t *testing.T) {
	svc := func(name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
	}
	tcp := func(p int32) corev1.ServicePort { return corev1.ServicePort{Port: p, Protocol: corev1.ProtocolTCP} }
	c := fake.NewClientBuilder().WithObjects(
		svc("hello", "10.96.0.10", tcp(9090), tcp(80), tcp(443)),
		svc("dns-first", "10.96.0.12", corev1.ServicePort{Port: 53, Protocol: corev1.ProtocolUDP}, tcp(8080)),
		svc("headless", corev1.ClusterIPNone, tcp(80)),
		svc("portless", "10.96.0.11"),
	).Build()
	resolve := PublicAddress(c)
	tests := []struct {
		name    string
		port    int32
		want    string
		wantErr string
	}{
		{"hello", 0, "10.96.0.10:9090", ""},  // no port asked: the first
		{"hello", 80, "10.96.0.10:80", ""},   // spec.service.port, not the first
		{"hello", 443, "10.96.0.10:443", ""}, // any of them
		{"hello", 8443, "", `spec.service.port 8443 is not a port of Service default/hello (it has 9090, 80, 443)`},
		{"dns-first", 0, "10.96.0.12:8080", ""}, // the first TCP port: the probe is HTTP
		{"headless", 0, "", "no ClusterIP and port"},
		{"portless", 0, "", "no ClusterIP and port"},
		{"missing", 0, "", "not found"},
	}
	for _, tt := range tests {
		got, err := resolve(context.Background(), "default", tt.name, tt.port)
		if got != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s port %d: %q, %v; want %q, error containing %q", tt.name, tt.port, got, err, tt.want, tt.wantErr)
		}
	}
}
