package chart_test

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The node label of agent.pools.
const poolLabel = "sockscale.dev/agent-pool"

// Two pools as a platform team writes them: hosts with cgroup v1 and v2
// (no namespace access there, no tolerations, more memory) and hosts whose
// kubelet has a cgroupRoot of its own; the main agent keeps off some nodes
// with an affinity of two terms.
const poolsValues = `
agent:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: example.com/agents, operator: NotIn, values: ["off"]}
          - matchFields:
              - {key: metadata.name, operator: In, values: [special]}
  pools:
    hybrid:
      cgroupRoot: /sys/fs/cgroup/unified
      namespaceAccess: false
      tolerations: []
      resources: {limits: {memory: 256Mi}}
    kubelet-root:
      cgroupRoot: /sys/fs/cgroup/unified/kubepods.slice
      nodeSelector: {example.com/disk: ssd}
      podLabels: {team: platform}
      affinity: null
      drain: {minWait: 5s}
`

// daemonSets decodes every DaemonSet of a render, by name.
func daemonSets(t *testing.T, objs objects) map[string]*appsv1.DaemonSet {
	t.Helper()
	out := map[string]*appsv1.DaemonSet{}
	for _, o := range objs.ofKind("DaemonSet") {
		out[o.Name] = get[appsv1.DaemonSet](t, objs, "DaemonSet", o.Name)
	}
	return out
}

// hostPath is the host path of a pod's volume name.
func hostPath(t *testing.T, spec corev1.PodSpec, name string) string {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == name && v.HostPath != nil {
			return v.HostPath.Path
		}
	}
	t.Fatalf("no hostPath volume %q", name)
	return ""
}

func TestAgentPools(t *testing.T) {
	ds := daemonSets(t, render(t, "-f", writeValues(t, poolsValues)))
	hybrid, kubeletRoot := agentName+"-hybrid", agentName+"-kubelet-root"
	if got, want := slices.Sorted(maps.Keys(ds)), []string{agentName, hybrid, kubeletRoot}; !slices.Equal(got, want) {
		t.Fatalf("DaemonSets %v, want %v", got, want)
	}

	// Each agent attaches at its nodes' cgroup root, and only there.
	for name, want := range map[string]string{agentName: "/sys/fs/cgroup", hybrid: "/sys/fs/cgroup/unified", kubeletRoot: "/sys/fs/cgroup/unified/kubepods.slice"} {
		spec := ds[name].Spec.Template.Spec
		if got := hostPath(t, spec, "cgroup"); got != want {
			t.Errorf("%s mounts the cgroup root %s, want %s", name, got, want)
		}
		if !slices.Contains(spec.Containers[0].Args, "--cgroup-root=/host/cgroup") {
			t.Errorf("%s args %v lack --cgroup-root=/host/cgroup", name, spec.Containers[0].Args)
		}
		// Chart-wide: one ServiceAccount, the same bpffs directory.
		if spec.ServiceAccountName != agentName {
			t.Errorf("%s runs as %q, want %q", name, spec.ServiceAccountName, agentName)
		}
		if got := hostPath(t, spec, "bpffs"); got != "/sys/fs/bpf/sockscale" {
			t.Errorf("%s pins under %s, want /sys/fs/bpf/sockscale", name, got)
		}
	}

	// A pool's nodes: the agent's nodeSelector, the pool's, and the label.
	for name, want := range map[string]map[string]string{
		agentName:   {"kubernetes.io/os": "linux"},
		hybrid:      {"kubernetes.io/os": "linux", poolLabel: "hybrid"},
		kubeletRoot: {"kubernetes.io/os": "linux", "example.com/disk": "ssd", poolLabel: "kubelet-root"},
	} {
		if diff := cmp.Diff(want, ds[name].Spec.Template.Spec.NodeSelector); diff != "" {
			t.Errorf("%s nodeSelector (-want +got):\n%s", name, diff)
		}
	}

	// The main agent keeps off every pool's nodes: each of its required
	// terms gets the pools' NotIn, the user's expressions and fields stay.
	notIn := corev1.NodeSelectorRequirement{Key: poolLabel, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"hybrid", "kubelet-root"}}
	wantMain := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "example.com/agents", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"off"}}, notIn}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{notIn}, MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"special"}}}},
	}}}}
	if diff := cmp.Diff(wantMain, ds[agentName].Spec.Template.Spec.Affinity); diff != "" {
		t.Errorf("main agent's affinity (-want +got):\n%s", diff)
	}
	// A pool inherits the user's affinity (without the NotIn), or clears it with null.
	wantHybrid := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "example.com/agents", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"off"}}}},
		{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"special"}}}},
	}}}}
	if diff := cmp.Diff(wantHybrid, ds[hybrid].Spec.Template.Spec.Affinity); diff != "" {
		t.Errorf("hybrid's affinity (-want +got):\n%s", diff)
	}
	if a := ds[kubeletRoot].Spec.Template.Spec.Affinity; a != nil {
		t.Errorf("kubelet-root's affinity %+v, want none (affinity: null)", a)
	}

	// Deep merge: false and an empty list replace, maps merge key by key.
	h, k := ds[hybrid].Spec.Template.Spec, ds[kubeletRoot].Spec.Template.Spec
	if h.HostPID || !slices.Contains(h.Containers[0].Args, "--probe-sources=any") {
		t.Errorf("hybrid: hostPID %v, args %v; want namespaceAccess off (no hostPID, --probe-sources=any)", h.HostPID, h.Containers[0].Args)
	}
	if !k.HostPID {
		t.Error("kubelet-root: no hostPID; want namespaceAccess inherited")
	}
	if len(h.Tolerations) != 0 || len(k.Tolerations) != 1 {
		t.Errorf("tolerations: hybrid %v (want none), kubelet-root %v (want the agent's)", h.Tolerations, k.Tolerations)
	}
	if r := h.Containers[0].Resources; r.Limits.Memory().String() != "256Mi" || r.Requests.Memory().String() != "64Mi" || r.Requests.Cpu().String() != "50m" {
		t.Errorf("hybrid resources %+v, want the pool's limit and the agent's requests", r)
	}
	if got := ds[kubeletRoot].Spec.Template.Labels["team"]; got != "platform" {
		t.Errorf("kubelet-root pod labels %v lack team=platform", ds[kubeletRoot].Spec.Template.Labels)
	}

	// The labels: a pool's pods carry its label and component agent-pool.
	for name, pool := range map[string]string{hybrid: "hybrid", kubeletRoot: "kubelet-root"} {
		d := ds[name]
		for what, l := range map[string]map[string]string{"labels": d.Labels, "selector": d.Spec.Selector.MatchLabels, "pod labels": d.Spec.Template.Labels} {
			if l[poolLabel] != pool || l["app.kubernetes.io/component"] != "agent-pool" {
				t.Errorf("%s %s %v: want %s=%s and component agent-pool", name, what, l, poolLabel, pool)
			}
		}
	}
	// The main DaemonSet's selector is the one of every release before
	// pools: a DaemonSet's selector cannot change on upgrade.
	wantSelector := map[string]string{"app.kubernetes.io/name": "sockscale", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": "agent"}
	if diff := cmp.Diff(wantSelector, ds[agentName].Spec.Selector.MatchLabels); diff != "" || ds[agentName].Spec.Selector.MatchExpressions != nil {
		t.Errorf("main selector (-want +got):\n%s", diff)
	}
}

// No DaemonSet's selector matches another's pods (they would fight over
// them), each matches its own; whatever selects "the agents" (the
// PodMonitor, the NetworkPolicies) matches every agent pod, including the
// main DaemonSet's of a release before pools, and nothing else of the
// release; the metrics Services together select every agent pod, and
// the main one selects them as before.
func TestAgentPoolSelectors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no pools", nil},
		{"pools", []string{"-f", writeValues(t, poolsValues)}},
		{"one pool", []string{"--set", "agent.pools.gpu.logLevel=debug"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--set", "metrics.podMonitor.enabled=true"}, tc.args...)
			objs := render(t, args...)
			ds := daemonSets(t, objs)
			for a, da := range ds {
				sel, err := metav1.LabelSelectorAsSelector(da.Spec.Selector)
				if err != nil {
					t.Fatal(err)
				}
				for b, db := range ds {
					if got := sel.Matches(labels.Set(db.Spec.Template.Labels)); got != (a == b) {
						t.Errorf("DaemonSet %s's selector %v matches %s's pod labels %v: %v, want %v", a, sel, b, db.Spec.Template.Labels, got, a == b)
					}
				}
			}

			// Pods of the release that are no agent.
			var others []map[string]string
			for _, o := range objs.ofKind("Deployment") {
				others = append(others, get[appsv1.Deployment](t, objs, "Deployment", o.Name).Spec.Template.Labels)
			}
			// The main pods of the release before: the upgrade that adds the
			// first pool rolls them one node at a time.
			before := map[string]string{"app.kubernetes.io/name": "sockscale", "app.kubernetes.io/instance": release,
				"app.kubernetes.io/component": "agent", "app.kubernetes.io/version": "0.0.9", "helm.sh/chart": "sockscale-0.0.9"}
			agentPods := map[string]map[string]string{"the main pods before pools": before}
			for name, d := range ds {
				agentPods[name] = d.Spec.Template.Labels
			}

			// Each agent pod is behind one metrics Service; the main one's
			// selector is that of every release before pools.
			var services []*corev1.Service
			for _, o := range objs.ofKind("Service") {
				if strings.HasPrefix(o.Name, agentName+"-") && strings.HasSuffix(o.Name, "-metrics") {
					services = append(services, get[corev1.Service](t, objs, "Service", o.Name))
				}
			}
			for name, l := range agentPods {
				var behind []string
				for _, svc := range services {
					if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(l)) {
						behind = append(behind, svc.Name)
					}
				}
				if len(behind) != 1 {
					t.Errorf("the pods of %s are behind the Services %v, want one", name, behind)
				}
			}
			for _, svc := range services {
				for _, l := range others {
					if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(l)) {
						t.Errorf("Service %s matches a pod that is no agent: %v", svc.Name, l)
					}
				}
			}
			if main := get[corev1.Service](t, objs, "Service", agentMetricsSvc); !maps.Equal(main.Spec.Selector, map[string]string{
				"app.kubernetes.io/name": "sockscale", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": "agent"}) {
				t.Errorf("Service %s selects %v, want the main agents as before pools", main.Name, main.Spec.Selector)
			}

			selectors := map[string]labels.Selector{}
			var pm struct {
				Spec struct {
					Selector metav1.LabelSelector `json:"selector"`
				} `json:"spec"`
			}
			unmarshal(t, objs.find("PodMonitor", agentName), &pm)
			selectors["PodMonitor"] = mustSelector(t, &pm.Spec.Selector)
			np := get[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", agentName)
			selectors["NetworkPolicy "+agentName] = mustSelector(t, &np.Spec.PodSelector)
			ctl := get[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", controllerName)
			from := ingressPorts(ctl)[8443]
			if len(from) == 0 || from[0].PodSelector == nil {
				t.Fatalf("controller's stats port open to %v, want the agents first", from)
			}
			selectors["NetworkPolicy "+controllerName+" stats from"] = mustSelector(t, from[0].PodSelector)
			for what, sel := range selectors {
				for name, l := range agentPods {
					if !sel.Matches(labels.Set(l)) {
						t.Errorf("%s (%v) misses %s: %v", what, sel, name, l)
					}
				}
				for _, l := range others {
					if sel.Matches(labels.Set(l)) {
						t.Errorf("%s (%v) matches a pod that is no agent: %v", what, sel, l)
					}
				}
			}
		})
	}
}

func mustSelector(t *testing.T, s *metav1.LabelSelector) labels.Selector {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// The agent reads its own DaemonSet by name (agent/internal/lifecycle):
// the Role names every one.
func TestAgentPoolsRole(t *testing.T) {
	objs := render(t, "-f", writeValues(t, poolsValues))
	role := get[rbacv1.Role](t, objs, "Role", agentName)
	names := slices.Sorted(maps.Keys(daemonSets(t, objs)))
	want := rbacv1.PolicyRule{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: names, Verbs: []string{"get", "list", "watch"}}
	if diff := cmp.Diff(want, role.Rules[0]); diff != "" {
		t.Errorf("Role's DaemonSet rule (-want +got):\n%s", diff)
	}
}

// Without pools, and with an empty agent.pools, the chart renders what it
// rendered before pools existed: one DaemonSet, no new label or affinity
// (an upgrade changes nothing).
func TestAgentNoPoolsUnchanged(t *testing.T) {
	def, err := helm(t, templateArgs(t)...)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := helm(t, templateArgs(t, "--set-json", "agent.pools={}")...)
	if err != nil {
		t.Fatal(err)
	}
	// The stats certificate is made anew by every render.
	certs := regexp.MustCompile(`(?m)^(\s*(ca\.crt|tls\.crt|tls\.key)): .*$`)
	if a, b := certs.ReplaceAllString(def, "$1: X"), certs.ReplaceAllString(empty, "$1: X"); a != b {
		t.Errorf("agent.pools={} renders other manifests than the default")
	}
	if strings.Contains(def, poolLabel) || strings.Contains(def, "agent-pool") {
		t.Errorf("the default render names the pools' label or component")
	}
	objs, _ := decode(def)
	ds := daemonSets(t, objs)
	if len(ds) != 1 || ds[agentName] == nil {
		t.Fatalf("DaemonSets %v, want only %s", ds, agentName)
	}
	if a := ds[agentName].Spec.Template.Spec.Affinity; a != nil {
		t.Errorf("main agent's affinity %+v, want none", a)
	}
	svc := get[corev1.Service](t, objs, "Service", agentMetricsSvc)
	if diff := cmp.Diff(map[string]string{"app.kubernetes.io/name": "sockscale", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": "agent"}, svc.Spec.Selector); diff != "" {
		t.Errorf("metrics Service selector (-want +got):\n%s", diff)
	}
}

// A pool with hostNetwork sends its stats from its nodes' addresses: the
// controller's stats port stays open, as for agent.hostNetwork.
func TestAgentPoolHostNetwork(t *testing.T) {
	objs := render(t, "--set", "networkPolicy.enabled=true,agent.pools.edge.hostNetwork=true")
	if from := ingressPorts(get[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", controllerName))[8443]; from != nil {
		t.Errorf("controller's stats port only from %v, want anyone (a pool's agents use their nodes' network)", from)
	}
	spec := daemonSets(t, objs)[agentName+"-edge"].Spec.Template.Spec
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("edge: hostNetwork %v, dnsPolicy %q", spec.HostNetwork, spec.DNSPolicy)
	}
	if daemonSets(t, objs)[agentName].Spec.Template.Spec.HostNetwork {
		t.Error("the main agent uses the node's network too")
	}
}

// renderNotes renders NOTES.txt (helm template does not print it, and
// helm install --dry-run asks a cluster): a copy of the chart where a
// ConfigMap carries the notes.
func renderNotes(t *testing.T, extra ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "sockscale")
	if err := os.CopyFS(dir, os.DirFS(chartDir(t))); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(dir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"_test_notes.tpl": `{{- define "test.notes" -}}` + string(notes) + `{{- end -}}`,
		"test-notes.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: test-notes\ndata:\n  notes: {{ include \"test.notes\" . | toJson }}\n",
	}
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(dir, "templates", name), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"template", release, dir, "--namespace", namespace, "--show-only", "templates/test-notes.yaml"}, extra...)
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return get[corev1.ConfigMap](t, objs, "ConfigMap", "test-notes").Data["notes"]
}

// The install notes list the pools and say, per DaemonSet, where a drain
// that is asked for cannot work, and where the Revisions' hook finds no
// drain.
func TestAgentPoolsNotes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		want, not []string
	}{
		{"no pools", nil, nil, []string{"Agent pools", "WARNING", "FailedPreStopHook"}},
		{"no drain without pools", []string{"--set", "agent.namespaceAccess=false"},
			[]string{"WARNING: agent.drain.enabled has no effect without agent.namespaceAccess or agent.hostNetwork: a leaving pod of a serving Revision gets SIGTERM at once"},
			[]string{"Agent pools", "FailedPreStopHook"}},
		{"pools", []string{"-f", writeValues(t, poolsValues)}, []string{
			"kubectl label node <node> sockscale.dev/agent-pool=hybrid   # DaemonSet sockscale-agent-hybrid",
			"kubectl label node <node> sockscale.dev/agent-pool=kubelet-root   # DaemonSet sockscale-agent-kubelet-root",
			"WARNING: agent.pools.hybrid.drain.enabled has no effect without agent.pools.hybrid.namespaceAccess or agent.pools.hybrid.hostNetwork: a leaving pod of a serving Revision on the nodes of pool hybrid gets SIGTERM",
			"Where the agent does not drain (DaemonSet sockscale-agent-hybrid), the hook finds nothing on 127.0.0.1:9094 and fails at once",
		}, []string{"WARNING: agent.drain"}},
		{"drain off in a pool: no warning, the hook fails there", []string{"--set", "agent.pools.gpu.drain.enabled=false"},
			[]string{"Where the agent does not drain (DaemonSet sockscale-agent-gpu)"}, []string{"WARNING"}},
		{"drain only in a pool", []string{"--set", "agent.namespaceAccess=false,agent.pools.gpu.namespaceAccess=true"},
			[]string{"WARNING: agent.drain.enabled has no effect without agent.namespaceAccess or agent.hostNetwork: a leaving pod of a serving Revision on a node of no pool gets SIGTERM", "Where the agent does not drain (DaemonSet sockscale-agent)"},
			[]string{"WARNING: agent.pools"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notes := renderNotes(t, tc.args...)
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("notes lack %q:\n%s", w, notes)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(notes, w) {
					t.Errorf("notes have %q:\n%s", w, notes)
				}
			}
		})
	}
}
