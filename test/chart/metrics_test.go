package chart_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// The controller's /metrics: HTTPS with token review by default, the
// ServiceMonitor scraping it so, a ClusterRole for scrapers, and a given
// certificate mounted and trusted instead of the self-signed one.
func TestControllerSecureMetrics(t *testing.T) {
	type tlsConfig struct {
		InsecureSkipVerify bool   `json:"insecureSkipVerify"`
		ServerName         string `json:"serverName"`
		CA                 *struct {
			Secret struct{ Name, Key string } `json:"secret"`
		} `json:"ca"`
	}
	type endpoint struct {
		Scheme          string     `json:"scheme"`
		BearerTokenFile string     `json:"bearerTokenFile"`
		TLSConfig       *tlsConfig `json:"tlsConfig"`
	}
	const token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	for _, tt := range []struct {
		name     string
		set      string
		args     []string // in the container's args
		mount    bool     // the Secret mounted
		endpoint endpoint
	}{
		{"default: self-signed", "", []string{"--metrics-secure=true"}, false,
			endpoint{Scheme: "https", BearerTokenFile: token, TLSConfig: &tlsConfig{InsecureSkipVerify: true}}},
		{"a certificate Secret", "controller.metrics.certSecret=metrics-tls", []string{"--metrics-secure=true", "--metrics-cert-path=/etc/sockscale/metrics-certs"}, true,
			endpoint{Scheme: "https", BearerTokenFile: token, TLSConfig: &tlsConfig{ServerName: "sockscale-controller-metrics." + namespace + ".svc",
				CA: &struct {
					Secret struct{ Name, Key string } `json:"secret"`
				}{Secret: struct{ Name, Key string }{"metrics-tls", "ca.crt"}}}}},
		{"plain HTTP", "controller.metrics.secure=false", []string{"--metrics-secure=false"}, false, endpoint{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set := "metrics.serviceMonitor.enabled=true"
			if tt.set != "" {
				set += "," + tt.set
			}
			objs := render(t, "--set", set)
			d := get[appsv1.Deployment](t, objs, "Deployment", controllerName)
			c := d.Spec.Template.Spec.Containers[0]
			for _, a := range tt.args {
				if !slices.Contains(c.Args, a) {
					t.Errorf("args %q lack %q", c.Args, a)
				}
			}
			mounted := slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
				return v.Secret != nil && v.Secret.SecretName == "metrics-tls"
			}) && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.MountPath == "/etc/sockscale/metrics-certs" && m.ReadOnly
			})
			if mounted != tt.mount {
				t.Errorf("certificate Secret mounted: %v, want %v (volumes %+v)", mounted, tt.mount, d.Spec.Template.Spec.Volumes)
			}
			var sm struct {
				Spec struct {
					Endpoints []endpoint `json:"endpoints"`
				} `json:"spec"`
			}
			if err := json.Unmarshal(objs.find("ServiceMonitor", controllerName).raw, &sm); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]endpoint{tt.endpoint}, sm.Spec.Endpoints); diff != "" {
				t.Errorf("ServiceMonitor endpoint (-want +got):\n%s", diff)
			}
			reader := get[rbacv1.ClusterRole](t, objs, "ClusterRole", "sockscale-metrics-reader")
			want := []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}
			if diff := cmp.Diff(want, reader.Rules); diff != "" {
				t.Errorf("metrics-reader rules (-want +got):\n%s", diff)
			}
		})
	}
	// The controller may review tokens and access, as its filter does.
	role := get[rbacv1.ClusterRole](t, render(t), "ClusterRole", controllerName)
	for _, want := range []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	} {
		if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return cmp.Equal(r, want) }) {
			t.Errorf("controller ClusterRole lacks %+v", want)
		}
	}
}
