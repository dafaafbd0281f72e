package chart_test

import (
	"crypto/x509"
	"encoding/pem"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

const statsClientDir = "/var/run/secrets/sockscale.dev/stats-client"

// TestStatsClientCredentials: agents and activators mount, in one
// projected volume, a pod-bound ServiceAccount token for the controller's
// audience and (with statsTLS) the stats CA, and pass both files; the
// controller checks that audience, takes no unauthenticated stats unless
// told to, and serves HTTPS with the Secret's pair.
func TestStatsClientCredentials(t *testing.T) {
	for _, tt := range []struct {
		name     string
		set      []string
		audience string
		insecure bool
		tls      bool
	}{
		{"defaults", nil, "sockscale-controller", false, true},
		{"another audience, insecure, no TLS", []string{"--set", "controller.statsAuth.audience=stats.example.com", "--set", "controller.statsAuth.insecureSkipAuth=true",
			"--set", "controller.statsTLS.enabled=false"}, "stats.example.com", true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, tt.set...)
			agent := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec
			act := get[appsv1.Deployment](t, objs, "Deployment", activatorName).Spec.Template.Spec
			sources := []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Audience: tt.audience, ExpirationSeconds: ptr.To(int64(3600)), Path: "token"}}}
			wantArgs := []string{"--controller-token-file=" + statsClientDir + "/token"}
			if tt.tls {
				sources = append(sources, corev1.VolumeProjection{Secret: &corev1.SecretProjection{
					LocalObjectReference: corev1.LocalObjectReference{Name: statsService + "-tls"},
					Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}})
				wantArgs = append(wantArgs, "--controller-ca-file="+statsClientDir+"/ca.crt")
			}
			wantVolume := corev1.Volume{Name: "stats-client", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}}
			wantMount := corev1.VolumeMount{Name: "stats-client", MountPath: statsClientDir, ReadOnly: true}
			for name, spec := range map[string]corev1.PodSpec{"agent": agent, "activator": act} {
				i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "stats-client" })
				if i < 0 {
					t.Errorf("%s: no stats-client volume", name)
					continue
				}
				if diff := cmp.Diff(wantVolume, spec.Volumes[i]); diff != "" {
					t.Errorf("%s: stats-client volume (-want +got):\n%s", name, diff)
				}
				c := spec.Containers[0]
				if !slices.Contains(c.VolumeMounts, wantMount) {
					t.Errorf("%s: mounts %+v, want %+v", name, c.VolumeMounts, wantMount)
				}
				for _, a := range wantArgs {
					if !slices.Contains(c.Args, a) {
						t.Errorf("%s: args %q lack %s", name, c.Args, a)
					}
				}
				if !tt.tls && slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--controller-ca-file") }) {
					t.Errorf("%s: --controller-ca-file without TLS", name)
				}
			}
			ctl := get[appsv1.Deployment](t, objs, "Deployment", controllerName).Spec.Template.Spec
			args := ctl.Containers[0].Args
			if !slices.Contains(args, "--stats-token-audience="+tt.audience) {
				t.Errorf("controller args %q lack --stats-token-audience=%s", args, tt.audience)
			}
			if got := slices.Contains(args, "--stats-insecure-skip-auth"); got != tt.insecure {
				t.Errorf("controller --stats-insecure-skip-auth: %v, want %v", got, tt.insecure)
			}
			if got := slices.Contains(args, "--stats-tls-cert-file=/var/run/secrets/sockscale.dev/stats-tls/tls.crt"); got != tt.tls {
				t.Errorf("controller --stats-tls-cert-file: %v, want %v", got, tt.tls)
			}
			if !tt.tls {
				return
			}
			// The pair is the Secret's, and its certificate names the stats
			// Service as the senders dial it, signed by the CA they trust.
			i := slices.IndexFunc(ctl.Volumes, func(v corev1.Volume) bool { return v.Name == "stats-tls" })
			if i < 0 || ctl.Volumes[i].Secret == nil || ctl.Volumes[i].Secret.SecretName != statsService+"-tls" {
				t.Fatalf("controller volumes %+v: want the Secret %s-tls as stats-tls", ctl.Volumes, statsService)
			}
			sec := get[corev1.Secret](t, objs, "Secret", statsService+"-tls")
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(sec.Data["ca.crt"]) {
				t.Fatal("ca.crt holds no certificate")
			}
			block, _ := pem.Decode(sec.Data["tls.crt"])
			if block == nil {
				t.Fatal("tls.crt holds no PEM")
			}
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			for _, host := range []string{statsService + "." + namespace + ".svc", statsService + "." + namespace + ".svc.cluster.local"} {
				if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: pool}); err != nil {
					t.Errorf("the serving certificate for %s: %v", host, err)
				}
			}
			if len(sec.Data["tls.key"]) == 0 || sec.Type != corev1.SecretTypeTLS {
				t.Errorf("Secret %s: type %s, %d key bytes", sec.Name, sec.Type, len(sec.Data["tls.key"]))
			}
		})
	}
	if out, err := helm(t, templateArgs(t, "--set", "controller.statsAuth.audience=a b")...); err == nil || !strings.Contains(out+err.Error(), "statsAuth/audience") {
		t.Errorf("an audience with a space: err %v, want the schema to name controller.statsAuth.audience", err)
	}
}
