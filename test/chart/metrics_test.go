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

// The agent's and the activator's /metrics, like the controller's: HTTPS
// with token review by default, a given certificate mounted and trusted,
// and their monitors scraping so. A PodMonitor cannot present
// Prometheus' own token: the agents' presents a chart-made
// ServiceAccount's, bound to the metrics-reader role.
func TestComponentSecureMetrics(t *testing.T) {
	type secretKey struct{ Name, Key string }
	type tlsConfig struct {
		InsecureSkipVerify bool   `json:"insecureSkipVerify"`
		ServerName         string `json:"serverName"`
		CA                 *struct {
			Secret secretKey `json:"secret"`
		} `json:"ca"`
	}
	type authorization struct {
		Type        string    `json:"type"`
		Credentials secretKey `json:"credentials"`
	}
	type endpoint struct {
		Scheme          string         `json:"scheme"`
		BearerTokenFile string         `json:"bearerTokenFile"`
		Authorization   *authorization `json:"authorization"`
		TLSConfig       *tlsConfig     `json:"tlsConfig"`
	}
	const token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	scraperToken := &authorization{Type: "Bearer", Credentials: secretKey{agentName + "-scraper-token", "token"}}
	ca := func(host string) *tlsConfig {
		return &tlsConfig{ServerName: host + "-metrics." + namespace + ".svc", CA: &struct {
			Secret secretKey `json:"secret"`
		}{Secret: secretKey{"metrics-tls", "ca.crt"}}}
	}
	for _, tt := range []struct {
		name      string
		component string // agent or activator
		set       string
		args      []string // in the container's args
		mount     bool     // the Secret mounted
		endpoint  endpoint
	}{
		{"agent: self-signed", "agent", "", []string{"--metrics-secure=true"}, false,
			endpoint{Scheme: "https", Authorization: scraperToken, TLSConfig: &tlsConfig{InsecureSkipVerify: true}}},
		{"agent: a certificate Secret", "agent", "agent.metrics.certSecret=metrics-tls",
			[]string{"--metrics-secure=true", "--metrics-cert-path=/etc/sockscale/metrics-certs"}, true,
			endpoint{Scheme: "https", Authorization: scraperToken, TLSConfig: ca(agentName)}},
		{"agent: plain HTTP", "agent", "agent.metrics.secure=false", []string{"--metrics-secure=false"}, false, endpoint{}},
		{"activator: self-signed", "activator", "", []string{"--metrics-secure=true"}, false,
			endpoint{Scheme: "https", BearerTokenFile: token, TLSConfig: &tlsConfig{InsecureSkipVerify: true}}},
		{"activator: a certificate Secret", "activator", "activator.metrics.certSecret=metrics-tls",
			[]string{"--metrics-secure=true", "--metrics-cert-path=/etc/sockscale/metrics-certs"}, true,
			endpoint{Scheme: "https", BearerTokenFile: token, TLSConfig: ca(activatorName)}},
		{"activator: plain HTTP", "activator", "activator.metrics.secure=false", []string{"--metrics-secure=false"}, false, endpoint{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set := "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true"
			if tt.set != "" {
				set += "," + tt.set
			}
			objs := render(t, "--set", set)
			var spec corev1.PodSpec
			monitor := objs.find("ServiceMonitor", activatorName)
			if tt.component == "agent" {
				spec = get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec
				monitor = objs.find("PodMonitor", agentName)
			} else {
				spec = get[appsv1.Deployment](t, objs, "Deployment", activatorName).Spec.Template.Spec
			}
			c := spec.Containers[0]
			for _, a := range tt.args {
				if !slices.Contains(c.Args, a) {
					t.Errorf("args %q lack %q", c.Args, a)
				}
			}
			mounted := slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
				return v.Secret != nil && v.Secret.SecretName == "metrics-tls"
			}) && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.MountPath == "/etc/sockscale/metrics-certs" && m.ReadOnly
			})
			if mounted != tt.mount {
				t.Errorf("certificate Secret mounted: %v, want %v (volumes %+v)", mounted, tt.mount, spec.Volumes)
			}
			var m struct {
				Spec struct {
					Endpoints    []endpoint `json:"endpoints"`
					PodEndpoints []endpoint `json:"podMetricsEndpoints"`
				} `json:"spec"`
			}
			if err := json.Unmarshal(monitor.raw, &m); err != nil {
				t.Fatal(err)
			}
			got := append(m.Spec.Endpoints, m.Spec.PodEndpoints...)
			if diff := cmp.Diff([]endpoint{tt.endpoint}, got); diff != "" {
				t.Errorf("monitor endpoint (-want +got):\n%s", diff)
			}
			if tt.component != "agent" {
				return
			}
			// The PodMonitor's token: a ServiceAccount's, bound to the
			// metrics-reader role, only while it is needed.
			scraper := agentName + "-scraper"
			if tt.endpoint.Authorization == nil {
				if objs.find("Secret", scraper+"-token") != nil {
					t.Error("a scraper token Secret for a plain-HTTP agent")
				}
				return
			}
			secret := get[corev1.Secret](t, objs, "Secret", scraper+"-token")
			if secret.Type != corev1.SecretTypeServiceAccountToken || secret.Annotations[corev1.ServiceAccountNameKey] != scraper {
				t.Errorf("token Secret type %q for %q, want %s for %s", secret.Type, secret.Annotations[corev1.ServiceAccountNameKey], corev1.SecretTypeServiceAccountToken, scraper)
			}
			get[corev1.ServiceAccount](t, objs, "ServiceAccount", scraper)
			b := get[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", scraper)
			wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: scraper, Namespace: namespace}}
			if diff := cmp.Diff(wantSubjects, b.Subjects); diff != "" || b.RoleRef.Name != "sockscale-metrics-reader" {
				t.Errorf("scraper binding to %q (-want +got subjects):\n%s", b.RoleRef.Name, diff)
			}
		})
	}
}
