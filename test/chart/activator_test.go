package chart_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
)

// The activator's objects (on by default; the tests set it explicitly).
const (
	activatorName       = "sockscale-activator"
	activatorMetricsSvc = "sockscale-activator-metrics"
	activatorOn         = "activator.enabled=true"
)

// The controller's default --activator-selector (the chart does not pass
// one), by which it finds the activator pods it puts in targets' paths.
const controllerActivatorSelector = "app.kubernetes.io/component=activator"

// renderActivator renders with the activator on and more --set values.
func renderActivator(t *testing.T, set ...string) objects {
	t.Helper()
	return render(t, "--set", strings.Join(append([]string{activatorOn}, set...), ","))
}

func activatorContainer(t *testing.T, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("the activator has %d containers, want 1", n)
	}
	return d.Spec.Template.Spec.Containers[0]
}

// Off by default (the activator does not resolve targets from the API
// yet): nothing of it is rendered, so the controller never puts it in a
// target's path.
// TestActivatorOnByDefault: the defaults deploy the activator, and
// activator.enabled=false renders nothing of it.
func TestActivatorOnByDefault(t *testing.T) {
	var found bool
	for _, o := range render(t) {
		found = found || (o.Kind == "Deployment" && o.Name == activatorName)
	}
	if !found {
		t.Errorf("the defaults render no Deployment %s", activatorName)
	}
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"disabled", []string{"--set", "activator.enabled=false"}},
		// Its monitor and HPA follow activator.enabled, not only their own switch.
		{"disabled with monitors and HPA on", []string{"--set", "activator.enabled=false,metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,activator.autoscaling.enabled=true"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, o := range render(t, tt.args...) {
				if o.Labels["app.kubernetes.io/component"] == "activator" || strings.HasPrefix(o.Name, activatorName) {
					t.Errorf("%s/%s rendered with activator.enabled=false", o.Kind, o.Name)
				}
			}
		})
	}
}

func TestActivatorDeployment(t *testing.T) {
	objs := renderActivator(t)
	d := get[appsv1.Deployment](t, objs, "Deployment", activatorName)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	spec := d.Spec.Template.Spec
	c := activatorContainer(t, d)

	if got, want := c.Image, "ghcr.io/sockscale/sockscale-activator:0.1.0"; got != want {
		t.Errorf("image %q, want %q", got, want)
	}
	// The flags the activator's main parses, in the chart's order.
	wantArgs := []string{
		"--proxy-bind-address=:8012",
		"--route-bind-address=:8013",
		"--metrics-bind-address=:9090",
		"--metrics-secure=true",
		"--health-probe-bind-address=:8081",
		"--queue-depth=10000",
		// No --max-held: at maxHeld 0 the activator derives it from its
		// memory limit.
		"--probe-period=15ms",
		"--cluster-domain=cluster.local",
		"--network-policies=enforce",
		"--reconnect-served-clients=true",
		"--controller-stats-address=" + statsService + "." + namespace + ".svc:8443",
		"--controller-token-file=/var/run/secrets/sockscale.dev/stats-client/token",
		"--controller-ca-file=/var/run/secrets/sockscale.dev/stats-client/ca.crt",
		"--log-level=info",
	}
	if diff := cmp.Diff(wantArgs, c.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	// The same stats address as the agents'.
	agent := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec.Containers[0]
	stats := wantArgs[slices.IndexFunc(wantArgs, func(a string) bool { return strings.HasPrefix(a, "--controller-stats-address=") })]
	if !slices.Contains(agent.Args, stats) {
		t.Errorf("the agents report to another address than the activators: %q", agent.Args)
	}
	// Identity from the downward API.
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if diff := cmp.Diff(map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"}, env); diff != "" {
		t.Errorf("downward API env (-want +got):\n%s", diff)
	}

	// Found by the controller's and the agents' activator selectors, and
	// by nothing meant for another component.
	agentSelector := strings.TrimPrefix(agent.Args[slices.IndexFunc(agent.Args, func(a string) bool { return strings.HasPrefix(a, "--activator-selector=") })], "--activator-selector=")
	for _, s := range []string{controllerActivatorSelector, agentSelector} {
		sel, err := labels.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("selector %q does not match the activator's pod labels %v", s, d.Spec.Template.Labels)
		}
	}
	for _, l := range []map[string]string{d.Labels, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels} {
		if l["app.kubernetes.io/component"] != "activator" {
			t.Errorf("labels %v lack app.kubernetes.io/component=activator", l)
		}
	}

	// Least privilege: not root, nothing added, nothing writable.
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
		psc.RunAsGroup == nil || *psc.RunAsGroup != 65532 || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want non-root 65532:65532, seccomp RuntimeDefault", psc)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
		(sc.Privileged != nil && *sc.Privileged) {
		t.Errorf("container securityContext %+v: want no escalation, read-only root, drop ALL, add none", sc)
	}
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Error("the activator needs its ServiceAccount token (it reads the API)")
	}
	if spec.ServiceAccountName != activatorName {
		t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
	}

	// Probes on the health port; readiness short, since it is how a
	// stopping activator leaves the Services; no preStop.
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Port.String() != "health" {
			t.Errorf("probe %s: %+v", name, p)
		}
	}
	if p := c.ReadinessProbe; p != nil && p.PeriodSeconds > 2 {
		t.Errorf("readiness period %ds, want <= 2s", p.PeriodSeconds)
	}
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		t.Errorf("preStop %+v: readiness drains the activator", c.Lifecycle.PreStop)
	}
	wantPorts := map[string]int32{"proxy": 8012, "http-route": 8013, "metrics": 9090, "health": 8081}
	gotPorts := map[string]int32{}
	for _, p := range c.Ports {
		gotPorts[p.Name] = p.ContainerPort
	}
	if diff := cmp.Diff(wantPorts, gotPorts); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}

	// Held requests may wait up to the default request timeout, 300 s.
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= 300 || *g > 330 {
		t.Errorf("terminationGracePeriodSeconds %v, want a little over 300", g)
	}
	wantRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	if diff := cmp.Diff(wantRes.String(), c.Resources.String()); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}

	// Spread over nodes, softly, by both anti-affinity and a spread constraint.
	if a := spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" ||
		len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
		t.Errorf("affinity %+v: want a preferred pod anti-affinity across nodes", a)
	}
	if ts := spec.TopologySpreadConstraints; len(ts) != 1 || ts[0].TopologyKey != "kubernetes.io/hostname" || ts[0].WhenUnsatisfiable != corev1.ScheduleAnyway ||
		ts[0].MaxSkew != 1 || ts[0].LabelSelector == nil || !cmp.Equal(ts[0].LabelSelector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("topologySpreadConstraints %+v: want one over kubernetes.io/hostname, ScheduleAnyway, selecting the activators", ts)
	}
}

// The controller writes activator.ports.proxy into the public endpoints
// of proxied targets (--activator-port): it must be where the activator
// listens, whether or not the chart deploys the activator.
func TestActivatorPortIsTheControllers(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  string
		port int
	}{
		{"default, activator off", "", 8012},
		{"default, activator on", activatorOn, 8012},
		{"another port", activatorOn + ",activator.ports.proxy=9012", 9012},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var args []string
			if tt.set != "" {
				args = []string{"--set", tt.set}
			}
			objs := render(t, args...)
			p := strconv.Itoa(tt.port)
			ctl := get[appsv1.Deployment](t, objs, "Deployment", controllerName).Spec.Template.Spec.Containers[0]
			if want := "--activator-port=" + p; !slices.Contains(ctl.Args, want) {
				t.Errorf("controller args %q lack %q", ctl.Args, want)
			}
			if objs.find("Deployment", activatorName) == nil {
				return
			}
			c := activatorContainer(t, get[appsv1.Deployment](t, objs, "Deployment", activatorName))
			if want := "--proxy-bind-address=:" + p; !slices.Contains(c.Args, want) {
				t.Errorf("activator args %q lack %q", c.Args, want)
			}
			svc := get[corev1.Service](t, objs, "Service", activatorName)
			if len(svc.Spec.Ports) != 2 || svc.Spec.Ports[0].Port != int32(tt.port) {
				t.Errorf("activator Service ports %+v, want %d", svc.Spec.Ports, tt.port)
			}
		})
	}
}

func TestActivatorServices(t *testing.T) {
	objs := renderActivator(t)
	proxy := get[corev1.Service](t, objs, "Service", activatorName)
	if proxy.Spec.Type != corev1.ServiceTypeClusterIP || proxy.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("proxy Service type %q clusterIP %q, want a ClusterIP", proxy.Spec.Type, proxy.Spec.ClusterIP)
	}
	if p := proxy.Spec.Ports; len(p) != 2 || p[0].Name != "proxy" || p[0].Port != 8012 || p[0].TargetPort.String() != "proxy" ||
		p[1].Name != "http-route" || p[1].Port != 8013 || p[1].TargetPort.String() != "http-route" {
		t.Errorf("proxy Service ports %+v, want proxy 8012 -> proxy, http-route 8013 -> http-route", p)
	}
	metrics := get[corev1.Service](t, objs, "Service", activatorMetricsSvc)
	if p := metrics.Spec.Ports; len(p) != 1 || p[0].Port != 9090 || p[0].TargetPort.String() != "metrics" {
		t.Errorf("metrics Service ports %+v, want 9090 -> metrics", p)
	}
	d := get[appsv1.Deployment](t, objs, "Deployment", activatorName)
	for _, svc := range []*corev1.Service{proxy, metrics} {
		if svc.Spec.Selector["app.kubernetes.io/component"] != "activator" {
			t.Errorf("Service %s selects %v, want the activators", svc.Name, svc.Spec.Selector)
		}
		for k, v := range svc.Spec.Selector {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("Service %s selects %s=%s, which the activator's pods lack", svc.Name, k, v)
			}
		}
	}
}

// Read-only: the activator reports to the controller, which does every
// write; its one "create" is on targetstats, a virtual resource that no
// API serves: the controller's permission check for its reports. Pods,
// Namespaces and NetworkPolicies are listed and watched to apply a target
// namespace's policies to the clients of the requests it forwards
// (activator.networkPolicies); never a Secret.
func TestActivatorClusterRoleIsReadOnly(t *testing.T) {
	objs := renderActivator(t)
	role := get[rbacv1.ClusterRole](t, objs, "ClusterRole", activatorName)
	read := []string{"list", "watch"} // informers only: no get
	report := rbacv1.PolicyRule{APIGroups: []string{"sockscale.dev"}, Resources: []string{"targetstats"}, Verbs: []string{"create"}}
	// Its /metrics' check of a scraper: reviews store nothing.
	reviews := []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces", "pods", "services"}, Verbs: read},
		reviews[0], reviews[1],
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"httproutes"}, Verbs: read},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses", "networkpolicies"}, Verbs: read},
		{APIGroups: []string{"serving.sockscale.dev"}, Resources: []string{"routes"}, Verbs: read},
		{APIGroups: []string{"sockscale.dev"}, Resources: []string{"podautoscalers", "serverlessservices"}, Verbs: read},
		report,
	}
	if diff := cmp.Diff(want, role.Rules); diff != "" {
		t.Errorf("activator ClusterRole rules (-want +got):\n%s", diff)
	}
	// Said again without the exact list, so that a rule added later still
	// has to be read-only.
	for _, r := range role.Rules {
		if cmp.Equal(r, report) || cmp.Equal(r, reviews[0]) || cmp.Equal(r, reviews[1]) {
			continue
		}
		for _, v := range r.Verbs {
			if !slices.Contains(read, v) {
				t.Errorf("rule %+v grants %q", r, v)
			}
		}
		if slices.Contains(r.Resources, "*") || slices.Contains(r.Resources, "secrets") || slices.Contains(r.Resources, "pods/exec") {
			t.Errorf("rule %+v reads more than the activator needs", r)
		}
	}
	binding := get[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", activatorName)
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: activatorName, Namespace: namespace}}
	if diff := cmp.Diff(wantSubjects, binding.Subjects); diff != "" || binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != activatorName {
		t.Errorf("activator ClusterRoleBinding to %s %q (-want +got subjects):\n%s", binding.RoleRef.Kind, binding.RoleRef.Name, diff)
	}
	get[corev1.ServiceAccount](t, objs, "ServiceAccount", activatorName)
	// The controller and the agent have Roles; none binds the activator.
	for _, o := range objs.ofKind("RoleBinding") {
		rb := get[rbacv1.RoleBinding](t, objs, "RoleBinding", o.Name)
		for _, s := range rb.Subjects {
			if s.Name == activatorName {
				t.Errorf("RoleBinding %s binds the activator's ServiceAccount; it needs no Role", rb.Name)
			}
		}
	}
}

// A PodDisruptionBudget only where it leaves a drain possible: with more
// than one replica (with the HPA: minReplicas).
func TestActivatorPodDisruptionBudget(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  string
		want bool
	}{
		{"two replicas", "", true},
		{"one replica", "activator.replicas=1", false},
		{"disabled", "activator.podDisruptionBudget.enabled=false", false},
		{"HPA from two", "activator.replicas=1,activator.autoscaling.enabled=true", true},
		{"HPA from one", "activator.autoscaling.enabled=true,activator.autoscaling.minReplicas=1", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var set []string
			if tt.set != "" {
				set = append(set, tt.set)
			}
			objs := renderActivator(t, set...)
			if !tt.want {
				if objs.find("PodDisruptionBudget", activatorName) != nil {
					t.Error("a PodDisruptionBudget with minAvailable 1 for a single replica would block every node drain")
				}
				return
			}
			pdb := get[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", activatorName)
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
				t.Errorf("PDB minAvailable %v, want 1", pdb.Spec.MinAvailable)
			}
			d := get[appsv1.Deployment](t, objs, "Deployment", activatorName)
			if diff := cmp.Diff(d.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels); diff != "" {
				t.Errorf("PDB selector differs from the Deployment's (-deployment +pdb):\n%s", diff)
			}
		})
	}
}

// With the HPA on, the Deployment leaves replicas to it (a rendered
// replicas would reset the HPA's choice at every upgrade).
func TestActivatorAutoscaling(t *testing.T) {
	objs := renderActivator(t)
	if len(objs.ofKind("HorizontalPodAutoscaler")) > 0 {
		t.Error("an HPA rendered although activator.autoscaling.enabled=false")
	}

	objs = renderActivator(t, "activator.autoscaling.enabled=true,activator.autoscaling.maxReplicas=6")
	d := get[appsv1.Deployment](t, objs, "Deployment", activatorName)
	if d.Spec.Replicas != nil {
		t.Errorf("replicas %d with the HPA on; want none", *d.Spec.Replicas)
	}
	hpa := get[autoscalingv2.HorizontalPodAutoscaler](t, objs, "HorizontalPodAutoscaler", activatorName)
	if ref := hpa.Spec.ScaleTargetRef; ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != activatorName {
		t.Errorf("scaleTargetRef %+v", ref)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 2 || hpa.Spec.MaxReplicas != 6 {
		t.Errorf("min %v max %d, want 2..6", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	m := hpa.Spec.Metrics
	if len(m) != 1 || m[0].Type != autoscalingv2.ResourceMetricSourceType || m[0].Resource == nil || m[0].Resource.Name != corev1.ResourceCPU ||
		m[0].Resource.Target.Type != autoscalingv2.UtilizationMetricType || m[0].Resource.Target.AverageUtilization == nil || *m[0].Resource.Target.AverageUtilization != 70 {
		t.Errorf("metrics %+v, want CPU at 70%% utilization", m)
	}
}

// Every value reaches the activator's pod spec.
func TestActivatorPassThrough(t *testing.T) {
	values := `
activator:
  enabled: true
  image: {repository: localhost:5000/sockscale-activator, digest: "sha256:` + strings.Repeat("b", 64) + `", pullPolicy: Never}
  replicas: 3
  ports: {proxy: 18012, route: 18013, metrics: 19090, health: 18081}
  queueDepth: 50
  maxHeld: 300
  probePeriod: 100ms
  clusterDomain: corp.example
  networkPolicies: ignore
  reconnectServedClients: false
  logLevel: debug
  extraArgs: [--kubeconfig=/etc/kube/config]
  extraEnv: [{name: GOMEMLIMIT, value: 200MiB}]
  resources: {requests: {cpu: 1, memory: 1Gi}, limits: {memory: 2Gi}}
  priorityClassName: system-cluster-critical
  tolerations: [{key: dedicated, operator: Exists}]
  nodeSelector: {pool: ingress}
  affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: topology.kubernetes.io/zone, labelSelector: {matchLabels: {app: other}}}]}}
  topologySpreadConstraints: [{maxSkew: 2, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: other}}}]
  terminationGracePeriodSeconds: 615
  podAnnotations: {a: b}
  podLabels: {c: d}
  serviceAccount: {annotations: {e: f}}
`
	objs := render(t, "-f", writeValues(t, values))
	d := get[appsv1.Deployment](t, objs, "Deployment", activatorName)
	spec := d.Spec.Template.Spec
	c := activatorContainer(t, d)
	if want := "localhost:5000/sockscale-activator@sha256:" + strings.Repeat("b", 64); c.Image != want || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("image %q (%s), want %q (Never)", c.Image, c.ImagePullPolicy, want)
	}
	wantArgs := []string{
		"--proxy-bind-address=:18012",
		"--route-bind-address=:18013",
		"--metrics-bind-address=:19090",
		"--metrics-secure=true",
		"--health-probe-bind-address=:18081",
		"--queue-depth=50",
		"--max-held=300",
		"--probe-period=100ms",
		"--cluster-domain=corp.example",
		"--network-policies=ignore",
		"--reconnect-served-clients=false",
		"--controller-stats-address=" + statsService + "." + namespace + ".svc:8443",
		"--controller-token-file=/var/run/secrets/sockscale.dev/stats-client/token",
		"--controller-ca-file=/var/run/secrets/sockscale.dev/stats-client/ca.crt",
		"--log-level=debug",
		"--kubeconfig=/etc/kube/config",
	}
	if diff := cmp.Diff(wantArgs, c.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" && e.Value == "200MiB" }) {
		t.Errorf("env %+v lacks GOMEMLIMIT", c.Env)
	}
	if got := c.Resources.Limits.Memory().String(); got != "2Gi" {
		t.Errorf("memory limit %s, want 2Gi", got)
	}
	if *d.Spec.Replicas != 3 || spec.PriorityClassName != "system-cluster-critical" || spec.NodeSelector["pool"] != "ingress" ||
		len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" || *spec.TerminationGracePeriodSeconds != 615 {
		t.Errorf("pod spec did not take the values: replicas %d, %+v", *d.Spec.Replicas, spec)
	}
	// The user's affinity and spread replace the defaults.
	if a := spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Errorf("affinity %+v: want the user's, replacing the default", a)
	}
	if ts := spec.TopologySpreadConstraints; len(ts) != 1 || ts[0].TopologyKey != "topology.kubernetes.io/zone" || ts[0].WhenUnsatisfiable != corev1.DoNotSchedule {
		t.Errorf("topologySpreadConstraints %+v: want the user's, replacing the default", ts)
	}
	if d.Spec.Template.Annotations["a"] != "b" || d.Spec.Template.Labels["c"] != "d" || d.Spec.Template.Labels["app.kubernetes.io/component"] != "activator" {
		t.Errorf("pod metadata %+v", d.Spec.Template.ObjectMeta)
	}
	if sa := get[corev1.ServiceAccount](t, objs, "ServiceAccount", activatorName); sa.Annotations["e"] != "f" {
		t.Errorf("ServiceAccount annotations %v", sa.Annotations)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if diff := cmp.Diff(map[string]int32{"proxy": 18012, "http-route": 18013, "metrics": 19090, "health": 18081}, ports); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
	if m := get[corev1.Service](t, objs, "Service", activatorMetricsSvc); m.Spec.Ports[0].Port != 19090 {
		t.Errorf("metrics Service port %d, want 19090", m.Spec.Ports[0].Port)
	}
}

// Another release namespace reaches the activator's stats address and
// its RBAC subject.
func TestActivatorOtherNamespace(t *testing.T) {
	out, err := helm(t, "template", release, chartDir(t), "--namespace", "serving", "--set", activatorOn)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	c := activatorContainer(t, get[appsv1.Deployment](t, objs, "Deployment", activatorName))
	if want := "--controller-stats-address=" + statsService + ".serving.svc:8443"; !slices.Contains(c.Args, want) {
		t.Errorf("activator args %q lack %q", c.Args, want)
	}
	if b := get[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", activatorName); len(b.Subjects) != 1 || b.Subjects[0].Namespace != "serving" {
		t.Errorf("ClusterRoleBinding subjects %+v", b.Subjects)
	}
}
