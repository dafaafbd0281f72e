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
	svc := func(name, clusterIP string, ports ...int32) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: corev1.ServiceSpec{ClusterIP: clusterIP}}
		for _, p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: p})
		}
		return s
	}
	c := fake.NewClientBuilder().WithObjects(
		svc("hello", "10.96.0.10", 80, 443),
		svc("headless", corev1.ClusterIPNone, 80),
		svc("portless", "10.96.0.11"),
	).Build()
	resolve := PublicAddress(c)
	tests := []struct {
		name, want, wantErr string
	}{
		{"hello", "10.96.0.10:80", ""}, // the first port of several
		{"headless", "", "no ClusterIP and port"},
		{"portless", "", "no ClusterIP and port"},
		{"missing", "", "not found"},
	}
	for _, tt := range tests {
		got, err := resolve(context.Background(), "default", tt.name)
		if got != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: %q, %v; want %q, error containing %q", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}
