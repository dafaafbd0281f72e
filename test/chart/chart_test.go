package chart_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// The object names of a default install.
const (
	agentName       = "sockscale-agent"
	controllerName  = "sockscale-controller"
	statsService    = "sockscale-controller-stats"
	autoscalerCM    = "sockscale-autoscaler"
	dashboardCM     = "sockscale-dashboard"
	agentMetricsSvc = "sockscale-agent-metrics"
)

func TestChartLintStrict(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"everything optional on", []string{"--set", "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,metrics.dashboard.enabled=true"}},
		{"one controller replica", []string{"--set", "controller.replicas=1"}},
		{"activator", []string{"--set", "activator.enabled=true"}},
		{"activator with everything optional on", []string{"--set", "activator.enabled=true,activator.autoscaling.enabled=true,metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,metrics.dashboard.enabled=true"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"lint", "--strict", chartDir(t)}, tt.args...)
			if out, err := helm(t, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// Every object carries the common labels and, if namespaced, lives in the
// release namespace.
func TestLabelsAndNamespace(t *testing.T) {
	objs := render(t, append(vapAPI, "--set", "commonLabels.team=serving,metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,metrics.dashboard.enabled=true,activator.enabled=true,activator.autoscaling.enabled=true")...)
	clusterScoped := map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true, "CustomResourceDefinition": true,
		"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}
	for _, o := range objs {
		for k, want := range map[string]string{
			"app.kubernetes.io/name":       "sockscale",
			"app.kubernetes.io/instance":   release,
			"app.kubernetes.io/version":    "0.1.0",
			"app.kubernetes.io/managed-by": "Helm",
			"helm.sh/chart":                "sockscale-0.1.0",
			"team":                         "serving",
		} {
			if got := o.Labels[k]; got != want {
				t.Errorf("%s/%s: label %s = %q, want %q", o.Kind, o.Name, k, got, want)
			}
		}
		if o.Labels["app.kubernetes.io/component"] == "" {
			t.Errorf("%s/%s: no app.kubernetes.io/component label", o.Kind, o.Name)
		}
		if ns := o.Namespace; clusterScoped[o.Kind] && ns != "" || !clusterScoped[o.Kind] && ns != namespace {
			t.Errorf("%s/%s: namespace %q", o.Kind, o.Name, ns)
		}
	}
}

func TestAgentDaemonSet(t *testing.T) {
	ds := get[appsv1.DaemonSet](t, render(t), "DaemonSet", agentName)
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]

	if got, want := c.Image, "ghcr.io/sockscale/sockscale-agent:0.1.0"; got != want {
		t.Errorf("image %q, want %q", got, want)
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("imagePullPolicy %q", c.ImagePullPolicy)
	}
	if spec.HostNetwork {
		t.Error("hostNetwork is on by default; the agent attaches at the cgroup root and needs no host network")
	}

	// Security: no privileged, all capabilities dropped, the three the BPF
	// programs need added and, for agent.namespaceAccess (on by default),
	// SYS_ADMIN and SYS_PTRACE with the node's PIDs, and for the drain
	// DAC_READ_SEARCH (the descriptors of apps of other users); read-only
	// root.
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("the agent has no securityContext.capabilities")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("the agent is privileged")
	}
	if diff := cmp.Diff([]corev1.Capability{"ALL"}, sc.Capabilities.Drop); diff != "" {
		t.Errorf("capabilities dropped (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]corev1.Capability{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"}, sc.Capabilities.Add); diff != "" {
		t.Errorf("capabilities added (-want +got):\n%s", diff)
	}
	if !spec.HostPID {
		t.Error("agent.namespaceAccess without hostPID: the agent cannot open the node's network namespace")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the agent's root filesystem is writable")
	}
	if sc.AllowPrivilegeEscalation != nil {
		t.Errorf("allowPrivilegeEscalation %v with CAP_SYS_ADMIN: the API server refuses false", *sc.AllowPrivilegeEscalation)
	}

	// The host's cgroup v2 root and bpffs, by hostPath.
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	for _, v := range []struct {
		volume, hostPath, mountPath string
		readOnly                    bool
	}{
		{"cgroup", "/sys/fs/cgroup", "/host/cgroup", true},
		// Only the agent's own directory of the host's bpffs, not below
		// the container's /sys (sysfs takes no mount point).
		{"bpffs", "/sys/fs/bpf/sockscale", "/run/sockscale/bpffs", false},
	} {
		i := slices.IndexFunc(spec.Volumes, func(vol corev1.Volume) bool { return vol.Name == v.volume })
		if i < 0 || spec.Volumes[i].HostPath == nil || spec.Volumes[i].HostPath.Path != v.hostPath {
			t.Errorf("no hostPath volume %q of %s", v.volume, v.hostPath)
		}
		m, ok := mounts[v.volume]
		if !ok || m.MountPath != v.mountPath || m.ReadOnly != v.readOnly {
			t.Errorf("volume %q: mount %+v, want at %s (readOnly %v)", v.volume, m, v.mountPath, v.readOnly)
		}
	}
	if m := mounts["bpffs"]; m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationNone {
		t.Errorf("bpffs mountPropagation %v, want None", m.MountPropagation)
	}
	if i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "bpffs" }); i >= 0 && spec.Volumes[i].HostPath != nil {
		if typ := spec.Volumes[i].HostPath.Type; typ == nil || *typ != corev1.HostPathDirectoryOrCreate {
			t.Errorf("bpffs hostPath type %v, want DirectoryOrCreate (the kubelet makes it on the host's bpffs)", typ)
		}
	}

	// Flags: the mounted paths, and the controller's headless stats
	// Service in the release namespace.
	for _, want := range []string{
		"--cgroup-root=/host/cgroup",
		"--bpffs-dir=/run/sockscale/bpffs",
		"--metrics-bind-address=:9090",
		"--metrics-secure=true",
		"--health-probe-bind-address=:8081",
		"--report-period=1s",
		"--controller-stats-address=" + statsService + "." + namespace + ".svc:8443",
		"--controller-token-file=/var/run/secrets/sockscale.dev/stats-client/token",
		"--controller-ca-file=/var/run/secrets/sockscale.dev/stats-client/ca.crt",
		"--activator-selector=app.kubernetes.io/component=activator",
		// Activators only in the release namespace: a tenant can copy
		// their names and labels, not their namespace.
		"--activator-namespace=" + namespace,
		"--activator-port=8012",
		"--socket-redirect=auto",
		"--log-level=info",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %q", c.Args, want)
		}
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NODE_NAME" })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME is not spec.nodeName: %+v", c.Env)
	}

	// Probes on the health port.
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Port.String() != "health" {
			t.Errorf("probe %s: %+v", name, p)
		}
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "health" && p.ContainerPort == 8081 }) {
		t.Errorf("no health port 8081: %+v", c.Ports)
	}

	// A node agent: critical, tolerates every taint, rolls one node at a time.
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	if diff := cmp.Diff([]corev1.Toleration{{Operator: corev1.TolerationOpExists}}, spec.Tolerations); diff != "" {
		t.Errorf("tolerations (-want +got):\n%s", diff)
	}
	if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable.String() != "1" {
		t.Errorf("updateStrategy %+v", u)
	}
	wantRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	if diff := cmp.Diff(wantRes.String(), c.Resources.String()); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
	if spec.ServiceAccountName != agentName {
		t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
	}
}

// The agent reads pods, and for the socket-layer redirect (on unless
// agent.socketRedirect=off) Services, ServerlessServices and serving
// Routes; it writes nothing. Its "create"s are on nodestats, a virtual
// resource no API serves (the controller's permission check for its
// reports), and on TokenReviews and SubjectAccessReviews, which store
// nothing (its /metrics' check of a scraper).
func TestAgentClusterRoleIsReadOnly(t *testing.T) {
	objs := render(t)
	role := get[rbacv1.ClusterRole](t, objs, "ClusterRole", agentName)
	read := []string{"list", "watch"} // informers only: no get
	want := []rbacv1.PolicyRule{
		// get: its own pod, read once for its owning DaemonSet (an
		// uninstall is told from a restart by that DaemonSet's deletion).
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
		// The drain holds a leaving pod while a slice lists it as ready.
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		{APIGroups: []string{"sockscale.dev"}, Resources: []string{"nodestats"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: read},
		{APIGroups: []string{"serving.sockscale.dev"}, Resources: []string{"routes"}, Verbs: read},
		{APIGroups: []string{"sockscale.dev"}, Resources: []string{"serverlessservices"}, Verbs: read},
	}
	if diff := cmp.Diff(want, role.Rules); diff != "" {
		t.Errorf("agent ClusterRole rules (-want +got):\n%s", diff)
	}
	off := get[rbacv1.ClusterRole](t, render(t, "--set", "agent.socketRedirect=off"), "ClusterRole", agentName)
	if diff := cmp.Diff(want[:5], off.Rules); diff != "" {
		t.Errorf("agent ClusterRole rules with agent.socketRedirect=off (-want +got):\n%s", diff)
	}
	binding := get[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", agentName)
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: agentName, Namespace: namespace}}
	if diff := cmp.Diff(wantSubjects, binding.Subjects); diff != "" || binding.RoleRef.Name != agentName {
		t.Errorf("agent ClusterRoleBinding to %q (-want +got subjects):\n%s", binding.RoleRef.Name, diff)
	}
	get[corev1.ServiceAccount](t, objs, "ServiceAccount", agentName)
}

// The agent reads its own DaemonSet, by name and nothing else: deleted, it
// means an uninstall, and the agent removes its programs and pins. It
// records Events (ActivatorSetRefused) on its own pod: in the release
// namespace only.
func TestAgentRoleReadsOnlyItsDaemonSet(t *testing.T) {
	objs := render(t)
	role := get[rbacv1.Role](t, objs, "Role", agentName)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{agentName}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	if diff := cmp.Diff(want, role.Rules); diff != "" || role.Namespace != namespace {
		t.Errorf("agent Role in %q rules (-want +got):\n%s", role.Namespace, diff)
	}
	binding := get[rbacv1.RoleBinding](t, objs, "RoleBinding", agentName)
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: agentName, Namespace: namespace}}
	if diff := cmp.Diff(wantSubjects, binding.Subjects); diff != "" || binding.RoleRef.Kind != "Role" || binding.RoleRef.Name != agentName {
		t.Errorf("agent RoleBinding to %s %q (-want +got subjects):\n%s", binding.RoleRef.Kind, binding.RoleRef.Name, diff)
	}
	// The pod's name and namespace find the DaemonSet (ownerReferences).
	env := map[string]string{}
	for _, e := range get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("agent env from fields %v; want POD_NAME and POD_NAMESPACE from the pod's metadata", env)
	}
}

func TestAgentMetricsService(t *testing.T) {
	svc := get[corev1.Service](t, render(t), "Service", agentMetricsSvc)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("clusterIP %q, want None (headless: one address per agent)", svc.Spec.ClusterIP)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9090 || svc.Spec.Selector["app.kubernetes.io/component"] != "agent" {
		t.Errorf("spec %+v, want port 9090 selecting the agents", svc.Spec)
	}
}

func TestControllerDeployment(t *testing.T) {
	objs := render(t)
	d := get[appsv1.Deployment](t, objs, "Deployment", controllerName)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	if got, want := c.Image, "ghcr.io/sockscale/sockscale-controller:0.1.0"; got != want {
		t.Errorf("image %q, want %q", got, want)
	}
	for _, want := range []string{
		"--leader-elect",
		"--metrics-bind-address=:8080",
		"--health-probe-bind-address=:8081",
		"--concurrent-reconciles=8",
		"--scale-target-kinds=Deployment.apps,StatefulSet.apps",
		"--stats-bind-address=:8443",
		"--autoscaler-config=" + namespace + "/" + autoscalerCM,
		"--activator-port=8012",
		"--activator-route-port=8013",
		"--external-domain=example.com",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %q", c.Args, want)
		}
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAMESPACE" })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("POD_NAMESPACE is not metadata.namespace: %+v", c.Env)
	}
	if psc := spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("the controller may run as root")
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("controller securityContext %+v: want read-only root, drop ALL, add none", sc)
	}
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name {
			t.Errorf("probe %s: %+v", name, p)
		}
	}
	if a := spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("affinity %+v: want a preferred pod anti-affinity across nodes", a)
	}

	pdb := get[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", controllerName)
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PDB minAvailable %v, want 1", pdb.Spec.MinAvailable)
	}
	if diff := cmp.Diff(d.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels); diff != "" {
		t.Errorf("PDB selector differs from the Deployment's (-deployment +pdb):\n%s", diff)
	}
}

func TestControllerSingleReplica(t *testing.T) {
	objs := render(t, "--set", "controller.replicas=1")
	if pdb := objs.find("PodDisruptionBudget", controllerName); pdb != nil {
		t.Error("a PodDisruptionBudget with minAvailable 1 for a single replica would block every node drain")
	}
	d := get[appsv1.Deployment](t, objs, "Deployment", controllerName)
	if *d.Spec.Replicas != 1 {
		t.Errorf("replicas %d, want 1", *d.Spec.Replicas)
	}
}

func TestControllerServices(t *testing.T) {
	objs := render(t)
	stats := get[corev1.Service](t, objs, "Service", statsService)
	if stats.Spec.ClusterIP != corev1.ClusterIPNone || stats.Spec.PublishNotReadyAddresses {
		t.Errorf("stats Service: clusterIP %q, publishNotReadyAddresses %v; want headless, ready replicas only",
			stats.Spec.ClusterIP, stats.Spec.PublishNotReadyAddresses)
	}
	if len(stats.Spec.Ports) != 1 || stats.Spec.Ports[0].Port != 8443 || stats.Spec.Ports[0].TargetPort.String() != "stats" {
		t.Errorf("stats Service ports %+v, want 8443 -> stats", stats.Spec.Ports)
	}
	metrics := get[corev1.Service](t, objs, "Service", controllerName+"-metrics")
	if len(metrics.Spec.Ports) != 1 || metrics.Spec.Ports[0].Port != 8080 {
		t.Errorf("metrics Service ports %+v, want 8080", metrics.Spec.Ports)
	}
	d := get[appsv1.Deployment](t, objs, "Deployment", controllerName)
	for _, svc := range []*corev1.Service{stats, metrics} {
		for k, v := range svc.Spec.Selector {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("Service %s selects %s=%s, which the controller's pods lack", svc.Name, k, v)
			}
		}
	}
}

// The ClusterRole's rules are controller-gen's, included verbatim.
func TestControllerClusterRoleIsGenerated(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir(t), "files", "rbac", "role.yaml"))
	if err != nil {
		t.Fatalf("the generated RBAC (make generate): %v", err)
	}
	var generated rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &generated); err != nil {
		t.Fatal(err)
	}
	if len(generated.Rules) == 0 {
		t.Fatal("files/rbac/role.yaml has no rules")
	}
	objs := render(t)
	role := get[rbacv1.ClusterRole](t, objs, "ClusterRole", controllerName)
	if diff := cmp.Diff(generated.Rules, role.Rules); diff != "" {
		t.Errorf("controller ClusterRole rules differ from files/rbac/role.yaml (-generated +rendered):\n%s", diff)
	}
	binding := get[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", controllerName)
	if binding.RoleRef.Name != controllerName || len(binding.Subjects) != 1 || binding.Subjects[0].Name != controllerName || binding.Subjects[0].Namespace != namespace {
		t.Errorf("controller ClusterRoleBinding %+v", binding)
	}
}

// The namespaced Role: leader election (and with buckets, their
// balancing) and the one ConfigMap, nothing else.
func TestControllerRole(t *testing.T) {
	objs := render(t)
	role := get[rbacv1.Role](t, objs, "Role", controllerName)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{autoscalerCM}, Verbs: []string{"get"}},
	}
	if diff := cmp.Diff(want, role.Rules); diff != "" {
		t.Errorf("controller Role rules (-want +got):\n%s", diff)
	}
	// With buckets, the balancer lists the Leases and deletes member ones.
	bucketed := render(t, "--set", "controller.buckets=4")
	role = get[rbacv1.Role](t, bucketed, "Role", controllerName)
	want[0].Verbs = []string{"get", "list", "create", "update", "delete"}
	if diff := cmp.Diff(want, role.Rules); diff != "" {
		t.Errorf("controller Role rules with controller.buckets=4 (-want +got):\n%s", diff)
	}
	if d := get[appsv1.Deployment](t, bucketed, "Deployment", controllerName); !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--buckets=4") {
		t.Errorf("controller args %q lack --buckets=4", d.Spec.Template.Spec.Containers[0].Args)
	}
	rb := get[rbacv1.RoleBinding](t, objs, "RoleBinding", controllerName)
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != controllerName || len(rb.Subjects) != 1 || rb.Subjects[0].Name != controllerName {
		t.Errorf("controller RoleBinding %+v", rb)
	}
}

// Another release namespace reaches every reference to it.
func TestOtherNamespace(t *testing.T) {
	out, err := helm(t, "template", release, chartDir(t), "--namespace", "serving")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	ds := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName)
	for _, want := range []string{"--controller-stats-address=" + statsService + ".serving.svc:8443", "--activator-namespace=serving"} {
		if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, want) {
			t.Errorf("agent args %q lack %q", ds.Spec.Template.Spec.Containers[0].Args, want)
		}
	}
	d := get[appsv1.Deployment](t, objs, "Deployment", controllerName)
	if want := "--autoscaler-config=serving/" + autoscalerCM; !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, want) {
		t.Errorf("controller args %q lack %q", d.Spec.Template.Spec.Containers[0].Args, want)
	}
	for _, o := range objs {
		if o.Namespace != "" && o.Namespace != "serving" {
			t.Errorf("%s/%s in namespace %q", o.Kind, o.Name, o.Namespace)
		}
	}
}

func TestImages(t *testing.T) {
	for _, tt := range []struct {
		name                 string
		args                 []string
		wantAgent, wantCtl   string
		wantPolicy           corev1.PullPolicy
		wantImagePullSecrets []corev1.LocalObjectReference
	}{
		{name: "appVersion", wantAgent: "ghcr.io/sockscale/sockscale-agent:0.1.0", wantCtl: "ghcr.io/sockscale/sockscale-controller:0.1.0", wantPolicy: corev1.PullIfNotPresent},
		{
			name:      "tags, a local registry and a pull secret",
			args:      []string{"--set", "agent.image.tag=dev,controller.image.tag=dev,agent.image.repository=localhost:5000/sockscale-agent,imagePullSecrets[0].name=reg,agent.image.pullPolicy=Never,controller.image.pullPolicy=Never"},
			wantAgent: "localhost:5000/sockscale-agent:dev", wantCtl: "ghcr.io/sockscale/sockscale-controller:dev", wantPolicy: corev1.PullNever,
			wantImagePullSecrets: []corev1.LocalObjectReference{{Name: "reg"}},
		},
		{
			name:      "digest wins over tag",
			args:      []string{"--set", "agent.image.digest=sha256:" + strings.Repeat("a", 64) + ",agent.image.tag=dev"},
			wantAgent: "ghcr.io/sockscale/sockscale-agent@sha256:" + strings.Repeat("a", 64), wantCtl: "ghcr.io/sockscale/sockscale-controller:0.1.0", wantPolicy: corev1.PullIfNotPresent,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, tt.args...)
			ds := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName)
			d := get[appsv1.Deployment](t, objs, "Deployment", controllerName)
			for _, pod := range []corev1.PodSpec{ds.Spec.Template.Spec, d.Spec.Template.Spec} {
				if diff := cmp.Diff(tt.wantImagePullSecrets, pod.ImagePullSecrets); diff != "" {
					t.Errorf("imagePullSecrets (-want +got):\n%s", diff)
				}
			}
			if got := ds.Spec.Template.Spec.Containers[0]; got.Image != tt.wantAgent || got.ImagePullPolicy != tt.wantPolicy {
				t.Errorf("agent image %q (%s), want %q (%s)", got.Image, got.ImagePullPolicy, tt.wantAgent, tt.wantPolicy)
			}
			if got := d.Spec.Template.Spec.Containers[0].Image; got != tt.wantCtl {
				t.Errorf("controller image %q, want %q", got, tt.wantCtl)
			}
		})
	}
}

// Scheduling and resource values reach both pod specs unchanged.
func TestPassThrough(t *testing.T) {
	values := `
agent:
  priorityClassName: my-node-critical
  tolerations: [{key: dedicated, operator: Equal, value: serving, effect: NoSchedule}]
  nodeSelector: {pool: serving}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [amd64]}]}]
  resources: {requests: {cpu: 10m, memory: 32Mi}, limits: {memory: 1Gi}}
  terminationGracePeriodSeconds: 7
  updateStrategy: {maxUnavailable: 20%}
  podAnnotations: {a: b}
  hostNetwork: true
  cgroupRoot: /sys/fs/cgroup/unified
  reportPeriod: 500ms
  logLevel: debug
  activatorNamespace: serving
  extraArgs: [--kubeconfig=/etc/kube/config]
controller:
  priorityClassName: system-cluster-critical
  tolerations: [{key: dedicated, operator: Exists}]
  nodeSelector: {pool: system}
  affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: topology.kubernetes.io/zone, labelSelector: {matchLabels: {app: other}}}]}}
  resources: {requests: {cpu: 1, memory: 1Gi}}
  replicas: 3
`
	objs := render(t, "-f", writeValues(t, values))
	ds := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName)
	d := get[appsv1.Deployment](t, objs, "Deployment", controllerName)

	a := ds.Spec.Template.Spec
	if a.PriorityClassName != "my-node-critical" || a.NodeSelector["pool"] != "serving" ||
		len(a.Tolerations) != 1 || a.Tolerations[0].Key != "dedicated" || a.Tolerations[0].Effect != corev1.TaintEffectNoSchedule ||
		a.Affinity == nil || a.Affinity.NodeAffinity == nil || *a.TerminationGracePeriodSeconds != 7 {
		t.Errorf("agent pod spec did not take the values: %+v", a)
	}
	wantRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
	}
	if diff := cmp.Diff(wantRes.String(), a.Containers[0].Resources.String()); diff != "" {
		t.Errorf("agent resources (-want +got):\n%s", diff)
	}
	if got := ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String(); got != "20%" {
		t.Errorf("agent maxUnavailable %s, want 20%%", got)
	}
	if ds.Spec.Template.Annotations["a"] != "b" {
		t.Errorf("agent pod annotations %v", ds.Spec.Template.Annotations)
	}
	// hostNetwork needs ClusterFirstWithHostNet to still resolve the
	// controller's Service.
	if !a.HostNetwork || a.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %q; want true, ClusterFirstWithHostNet", a.HostNetwork, a.DNSPolicy)
	}
	for _, want := range []string{"--report-period=500ms", "--log-level=debug", "--activator-namespace=serving", "--kubeconfig=/etc/kube/config"} {
		if !slices.Contains(a.Containers[0].Args, want) {
			t.Errorf("agent args %q lack %q", a.Containers[0].Args, want)
		}
	}
	if i := slices.IndexFunc(a.Volumes, func(v corev1.Volume) bool { return v.Name == "cgroup" }); i < 0 || a.Volumes[i].HostPath.Path != "/sys/fs/cgroup/unified" {
		t.Errorf("cgroup volume does not follow agent.cgroupRoot: %+v", a.Volumes)
	}

	c := d.Spec.Template.Spec
	if *d.Spec.Replicas != 3 || c.PriorityClassName != "system-cluster-critical" || c.NodeSelector["pool"] != "system" ||
		len(c.Tolerations) != 1 || c.Tolerations[0].Key != "dedicated" {
		t.Errorf("controller pod spec did not take the values: replicas %d, %+v", *d.Spec.Replicas, c)
	}
	if c.Affinity == nil || c.Affinity.PodAntiAffinity == nil || len(c.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(c.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Errorf("controller affinity %+v: want the user's, replacing the default", c.Affinity)
	}
	if got := c.Containers[0].Resources.Requests.Memory().String(); got != "1Gi" {
		t.Errorf("controller memory request %s", got)
	}
}

// The capabilities are one values list: a colleague's test on a simulated
// node settles the minimum; older kernels swap in SYS_ADMIN, which
// Kubernetes refuses together with allowPrivilegeEscalation: false.
func TestAgentCapabilitiesValue(t *testing.T) {
	objs := render(t, "--set", "agent.capabilities={SYS_ADMIN,NET_ADMIN}")
	sc := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec.Containers[0].SecurityContext
	// agent.namespaceAccess adds what it needs, once.
	if diff := cmp.Diff([]corev1.Capability{"SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"}, sc.Capabilities.Add); diff != "" {
		t.Errorf("capabilities added (-want +got):\n%s", diff)
	}
	if sc.AllowPrivilegeEscalation != nil {
		t.Errorf("allowPrivilegeEscalation %v with CAP_SYS_ADMIN: the API server refuses false", *sc.AllowPrivilegeEscalation)
	}

	// Without agent.namespaceAccess: exactly the three the programs need,
	// no escalation, no node PIDs, and the agent told that it cannot see
	// the node's addresses.
	objs = render(t, "--set", "agent.namespaceAccess=false")
	spec := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec
	sc = spec.Containers[0].SecurityContext
	if diff := cmp.Diff([]corev1.Capability{"BPF", "NET_ADMIN", "PERFMON"}, sc.Capabilities.Add); diff != "" {
		t.Errorf("namespaceAccess=false: capabilities added (-want +got):\n%s", diff)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("namespaceAccess=false: the agent allows privilege escalation")
	}
	if spec.HostPID || !slices.Contains(spec.Containers[0].Args, "--probe-sources=any") || !slices.Contains(spec.Containers[0].Args, "--connection-audit-period=0") {
		t.Errorf("namespaceAccess=false: hostPID %t, args %q; want no hostPID, --probe-sources=any and no connection check", spec.HostPID, spec.Containers[0].Args)
	}

	objs = render(t, "--set", "agent.privileged=true,agent.bpffs.mountPropagation=Bidirectional")
	c := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec.Containers[0]
	if c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("agent.privileged=true did not make the agent privileged")
	}
	i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "bpffs" })
	if i < 0 || *c.VolumeMounts[i].MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("bpffs mount %+v, want Bidirectional", c.VolumeMounts)
	}
}

func TestOptionalMonitoring(t *testing.T) {
	for _, tt := range []struct {
		name        string
		args        []string
		want        map[string]string // kind -> name present
		wantMissing []string          // kinds (or ConfigMap name) absent
	}{
		{
			name:        "off by default",
			wantMissing: []string{"ServiceMonitor", "PodMonitor", dashboardCM},
		},
		{
			name: "on",
			args: []string{"--set", "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,metrics.dashboard.enabled=true"},
			want: map[string]string{"ServiceMonitor": controllerName, "PodMonitor": agentName, "ConfigMap": dashboardCM},
		},
		{
			name: "on, with the activator",
			args: []string{"--set", "metrics.serviceMonitor.enabled=true,activator.enabled=true"},
			want: map[string]string{"ServiceMonitor": activatorName},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, tt.args...)
			for kind, name := range tt.want {
				if objs.find(kind, name) == nil {
					t.Errorf("no %s %q; rendered %s", kind, name, objs)
				}
			}
			for _, k := range tt.wantMissing {
				if len(objs.ofKind(k)) > 0 || objs.find("ConfigMap", k) != nil {
					t.Errorf("%s rendered although disabled", k)
				}
			}
		})
	}
}

// The monitors scrape the right ports, keep the series' own namespace and
// pod labels, and set the job names the dashboard selects on.
func TestMonitors(t *testing.T) {
	objs := render(t, "--set", "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,metrics.serviceMonitor.labels.release=prom,activator.enabled=true")
	type endpoint struct {
		Port        string `json:"port"`
		Path        string `json:"path"`
		HonorLabels bool   `json:"honorLabels"`
		Relabelings []struct {
			TargetLabel string `json:"targetLabel"`
			Replacement string `json:"replacement"`
		} `json:"relabelings"`
	}
	var sm struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []endpoint `json:"endpoints"`
		} `json:"spec"`
	}
	unmarshal(t, objs.find("ServiceMonitor", controllerName), &sm)
	var am struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []endpoint `json:"endpoints"`
		} `json:"spec"`
	}
	unmarshal(t, objs.find("ServiceMonitor", activatorName), &am)
	var pm struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []endpoint `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	unmarshal(t, objs.find("PodMonitor", agentName), &pm)

	for _, l := range []map[string]string{sm.Metadata.Labels, am.Metadata.Labels} {
		if l["release"] != "prom" {
			t.Errorf("ServiceMonitor labels %v lack release=prom", l)
		}
	}
	for _, m := range []struct {
		name, component, job string
		selector             map[string]string
		endpoints            []endpoint
	}{
		{"ServiceMonitor", "controller", "sockscale-controller", sm.Spec.Selector.MatchLabels, sm.Spec.Endpoints},
		{"PodMonitor", "agent", "sockscale-agent", pm.Spec.Selector.MatchLabels, pm.Spec.Endpoints},
		{"the activator's ServiceMonitor", "activator", "sockscale-activator", am.Spec.Selector.MatchLabels, am.Spec.Endpoints},
	} {
		if m.selector["app.kubernetes.io/component"] != m.component {
			t.Errorf("%s selects %v, want the %s", m.name, m.selector, m.component)
		}
		if len(m.endpoints) != 1 {
			t.Fatalf("%s has %d endpoints", m.name, len(m.endpoints))
		}
		e := m.endpoints[0]
		if e.Port != "metrics" || e.Path != "/metrics" || !e.HonorLabels {
			t.Errorf("%s endpoint %+v: want port metrics, /metrics, honorLabels", m.name, e)
		}
		if !slices.ContainsFunc(e.Relabelings, func(r struct {
			TargetLabel string `json:"targetLabel"`
			Replacement string `json:"replacement"`
		}) bool {
			return r.TargetLabel == "job" && r.Replacement == m.job
		}) {
			t.Errorf("%s does not set job=%s: %+v", m.name, m.job, e.Relabelings)
		}
	}
}

func TestGrafanaDashboard(t *testing.T) {
	objs := render(t, "--set", "metrics.dashboard.enabled=true,metrics.dashboard.namespace=monitoring")
	cm := get[corev1.ConfigMap](t, objs, "ConfigMap", dashboardCM)
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("labels %v lack grafana_dashboard: \"1\"", cm.Labels)
	}
	if cm.Namespace != "monitoring" {
		t.Errorf("namespace %q, want monitoring", cm.Namespace)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(cm.Data["sockscale.json"]), &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	all := strings.Join(exprs, "\n")
	for _, want := range []string{
		"sockscale_agent_requests_in_flight",
		"rate(sockscale_agent_request_concurrency_seconds_total",
		"sockscale_controller_desired_pods",
		"sockscale_controller_panic_mode",
		`process_cpu_seconds_total{job="sockscale-agent"}`,
		`process_resident_memory_bytes{job="sockscale-agent"}`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel queries %s", want)
		}
	}
}

// writeValues writes a values file for -f.
func writeValues(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func unmarshal(t *testing.T, o *object, v any) {
	t.Helper()
	if o == nil {
		t.Fatal("object not rendered")
	}
	if err := json.Unmarshal(o.raw, v); err != nil {
		t.Fatal(err)
	}
}
