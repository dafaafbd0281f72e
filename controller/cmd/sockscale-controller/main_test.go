package main

import (
	"strings"
	"testing"
	"time"
)

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--stats-bind-address=8443"}, `--stats-bind-address="8443": want [host]:port`},
		{[]string{"--autoscaler-config=just-a-name"}, `--autoscaler-config="just-a-name": want namespace/name`},
		{[]string{"extra"}, "takes flags only"},
		{[]string{"--activator-namespace="}, `--activator-namespace="": want the namespace the activators run in`},
		{[]string{"--activator-namespace=Team A"}, `--activator-namespace="Team A": want the namespace the activators run in`},
		{[]string{"--activator-selector=a in (b"}, `--activator-selector="a in (b"`},
		{[]string{"--activator-selector="}, "must select something"},
		{[]string{"--activator-port=0"}, "--activator-port=0: want 1..65535"},
		{[]string{"--activator-route-port=70000"}, "--activator-route-port=70000: want 1..65535"},
		{[]string{"--drain-port=-1"}, "--drain-port=-1: want 1..65535, or 0 for no drain hook"},
		{[]string{"--cluster-domain=Cluster_Local"}, `--cluster-domain="Cluster_Local": want a DNS domain`},
		{[]string{"--external-domain=-bad-"}, `--external-domain="-bad-": want a DNS domain`},
		{[]string{"--gateway=public"}, `--gateway="public": want namespace/name of a Gateway`},
		{[]string{"--gateway=Gateway System/public"}, `--gateway="Gateway System/public": want namespace/name`},
		{[]string{"--stats-token-audience="}, `--stats-token-audience="": want one audience`},
		{[]string{"--stats-token-audience=a,b"}, `--stats-token-audience="a,b": want one audience`},
		{[]string{"--stats-tls-cert-file=/tls/tls.crt"}, `--stats-tls-cert-file="/tls/tls.crt" and --stats-tls-key-file="": set both (HTTPS) or neither (HTTP)`},
		{[]string{"--metrics-cert-path=/nonexistent"}, `--metrics-cert-name="tls.crt" in --metrics-cert-path="/nonexistent"`},
		{[]string{"--metrics-secure=false", "--metrics-cert-path=/etc"}, `--metrics-cert-path="/etc" needs --metrics-secure`},
		{[]string{"--metrics-bind-address=8080"}, `--metrics-bind-address="8080": want [host]:port`},
		{[]string{"--concurrent-reconciles=0"}, "--concurrent-reconciles=0: want 1..1024"},
		{[]string{"--concurrent-reconciles=1025"}, "--concurrent-reconciles=1025: want 1..1024"},
		{[]string{"--scale-target-kinds="}, `--scale-target-kinds="": scale target kind "": want Kind.group`},
		{[]string{"--scale-target-kinds=statefulsets.apps"}, `--scale-target-kinds="statefulsets.apps": scale target kind "statefulsets.apps": want Kind.group, e.g. StatefulSet.apps`},
		{[]string{"--scale-target-kinds=Rollout.Argo_Proj"}, `scale target kind "Rollout.Argo_Proj": group "Argo_Proj" is not a DNS subdomain`},
		{[]string{"--buckets=0"}, "--buckets=0: want 1..64"},
		{[]string{"--leader-elect", "--buckets=65"}, "--buckets=65: want 1..64"},
		{[]string{"--buckets=4"}, "--buckets=4 needs --leader-elect"},
		{[]string{"--release-stop=ns/ctl"}, `--release-stop="ns/ctl" needs --release`},
		{[]string{"--release", "--release-stop=ctl"}, `--release-stop="ctl": want namespace/name of the controller's Deployment`},
		{[]string{"--metrics-api=custom,pods"}, `--metrics-api="custom,pods": "pods" is not an API; want custom, external or custom,external`},
		{[]string{"--metrics-api="}, `--metrics-api="": "" is not an API`},
		{[]string{"--metrics-api=external,external"}, `--metrics-api="external,external": external twice`},
		{[]string{"--metrics-api-window=5s"}, "--metrics-api-window=5s: want 6s..10m0s"},
		{[]string{"--metrics-api-window=11m"}, "--metrics-api-window=11m0s: want 6s..10m0s"},
		{[]string{"--metrics-api-bind-address=6443"}, `--metrics-api-bind-address="6443": want [host]:port`},
		{[]string{"--metrics-api-bind-address=:6443"}, `--metrics-api-bind-address=":6443" needs --metrics-api-tls-cert-file and --metrics-api-tls-key-file`},
		{[]string{"--keda-scaler-bind-address=:9443", "--keda-scaler-tls-cert-file=c", "--keda-scaler-tls-key-file=k"}, `--keda-scaler-bind-address=":9443" needs --keda-scaler-tls-cert-file, --keda-scaler-tls-key-file and --keda-scaler-client-ca-file (got "c", "k", "")`},
	}
	for _, tt := range tests {
		if _, err := parseFlags(tt.args); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.args, err, tt.want)
		}
	}
	t.Setenv("POD_NAMESPACE", "ops")
	f, err := parseFlags(nil)
	if err != nil || f.configMap != "ops/sockscale-autoscaler" || f.statsAddr != ":8443" || f.activatorNamespace != "ops" || f.activatorPort != 8012 ||
		f.activatorRoutePort != 8013 || f.clusterDomain != "cluster.local" || f.gateway != nil || f.externalDomain != "example.com" ||
		f.statsAudience != "sockscale-controller" || f.statsInsecure || f.concurrentReconciles != 8 || f.buckets != 1 || f.bucketNamespace != "ops" ||
		f.metricsAPIAddr != "0" || strings.Join(f.metricsAPIs, ",") != "custom,external" || f.metricsWindow != time.Minute || f.kedaAddr != "0" {
		t.Errorf("defaults: %+v, %v", f, err)
	}
	if f, err := parseFlags([]string{"--release", "--release-stop=ops/sockscale-controller"}); err != nil || !f.release || f.releaseStop == nil || f.releaseStop.String() != "ops/sockscale-controller" {
		t.Errorf("--release --release-stop=ops/sockscale-controller: %+v, %v", f, err)
	}
	if f, err := parseFlags([]string{"--leader-elect", "--buckets=8"}); err != nil || f.buckets != 8 {
		t.Errorf("--leader-elect --buckets=8: %+v, %v", f, err)
	}
	if f.scaleTargetKinds.String() != "Deployment.apps,StatefulSet.apps" {
		t.Errorf("default scale target kinds %s, want Deployment.apps,StatefulSet.apps", f.scaleTargetKinds)
	}
	if f, err := parseFlags([]string{"--scale-target-kinds=Deployment.apps, Rollout.argoproj.io"}); err != nil || f.scaleTargetKinds.String() != "Deployment.apps,Rollout.argoproj.io" {
		t.Errorf("--scale-target-kinds=Deployment.apps, Rollout.argoproj.io: %v, %v", f.scaleTargetKinds, err)
	}
	if f, err := parseFlags([]string{"--gateway=gateway-system/public"}); err != nil || f.gateway == nil || f.gateway.String() != "gateway-system/public" {
		t.Errorf("--gateway=gateway-system/public: %+v, %v", f, err)
	}
}
