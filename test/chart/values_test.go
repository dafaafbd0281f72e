package chart_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// controllerDefaults reads the map literal that config.DefaultConfigMapData
// returns from controller/internal/config/config.go. The package is
// internal to controller/, so Go forbids importing it from here; its own
// test (TestDefaultConfigMapParsesToDefaults) checks that this map parses to
// config.Defaults(), and this file checks that the chart ships this map:
// together, the chart's ConfigMap parses to the controller's defaults.
func controllerDefaults(t *testing.T) map[string]string {
	t.Helper()
	file := filepath.Join(chartDir(t), "..", "..", "controller", "internal", "config", "config.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "DefaultConfigMapData" || fn.Body == nil || len(fn.Body.List) != 1 {
			continue
		}
		ret, ok := fn.Body.List[0].(*ast.ReturnStmt)
		if !ok || len(ret.Results) != 1 {
			break
		}
		lit, ok := ret.Results[0].(*ast.CompositeLit)
		if !ok {
			break
		}
		m := map[string]string{}
		for _, e := range lit.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				t.Fatalf("%s: DefaultConfigMapData: an element that is not key: value", file)
			}
			m[stringLit(t, kv.Key)] = stringLit(t, kv.Value)
		}
		return m
	}
	t.Fatalf("%s: DefaultConfigMapData is no longer `return map[string]string{...}` of string literals; update this test", file)
	return nil
}

func stringLit(t *testing.T, e ast.Expr) string {
	t.Helper()
	b, ok := e.(*ast.BasicLit)
	if !ok || b.Kind != token.STRING {
		t.Fatalf("DefaultConfigMapData: %T is not a string literal", e)
	}
	s, err := strconv.Unquote(b.Value)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// withoutDocs drops the "_example"-style keys the controller ignores.
func withoutDocs(data map[string]string) map[string]string {
	out := maps.Clone(data)
	maps.DeleteFunc(out, func(k, _ string) bool { return strings.HasPrefix(k, "_") })
	return out
}

// chartDepartures are the keys whose chart default is sockscale's own
// choice, not Knative's (the controller's built-in default, which stays
// one setting away): target-burst-capacity 0 keeps the activators out of
// a target's path except at zero (docs/autoscaling.md, "The chart's
// default: the direct path").
var chartDepartures = map[string]string{"target-burst-capacity": "0"}

// chartDefaults is what the chart's autoscaler ConfigMap holds by default.
func chartDefaults(t *testing.T) map[string]string {
	want := controllerDefaults(t)
	maps.Copy(want, chartDepartures)
	return want
}

func TestAutoscalerConfigMapDefaults(t *testing.T) {
	want := chartDefaults(t)
	if len(want) < 19 {
		t.Fatalf("read only %d keys from DefaultConfigMapData", len(want))
	}
	for k, v := range chartDepartures {
		if knative := controllerDefaults(t)[k]; knative == v {
			t.Errorf("%s: the chart's %q is the controller's default too: no departure left to list", k, v)
		}
	}
	cm := get[corev1.ConfigMap](t, render(t), "ConfigMap", autoscalerCM)
	if diff := cmp.Diff(want, withoutDocs(cm.Data)); diff != "" {
		t.Errorf("the chart's autoscaler ConfigMap differs from config.DefaultConfigMapData and the listed departures (-want +chart):\n%s", diff)
	}
	if !strings.Contains(cm.Data["_example"], "autoscaling.knative.dev/<key>") {
		t.Errorf("the ConfigMap's _example does not document the per-target overrides: %q", cm.Data["_example"])
	}
}

// Single keys are overridden from the command line or a values file, and
// always reach the ConfigMap as the strings the controller parses.
func TestAutoscalerConfigMapOverrides(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want map[string]string // keys that change
	}{
		{"--set a duration", []string{"--set", "autoscaler.stable-window=30s"}, map[string]string{"stable-window": "30s"}},
		{"--set numbers and a bool", []string{"--set", "autoscaler.min-scale=2,autoscaler.container-concurrency-target-percentage=0.8,autoscaler.enable-scale-to-zero=false"},
			map[string]string{"min-scale": "2", "container-concurrency-target-percentage": "0.8", "enable-scale-to-zero": "false"}},
		{"--set-string", []string{"--set-string", "autoscaler.target-burst-capacity=-1"}, map[string]string{"target-burst-capacity": "-1"}},
		// An unquoted whole number in a values file arrives as a float64;
		// it must not become "1e+06", which a count key refuses.
		{"unquoted numbers in a values file", []string{"-f", "VALUES:autoscaler: {max-scale-limit: 1000000, max-scale: 1000000, activator-capacity: 150.5}"},
			map[string]string{"max-scale-limit": "1000000", "max-scale": "1000000", "activator-capacity": "150.5"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := slicesMap(tt.args, func(a string) string {
				if v, ok := strings.CutPrefix(a, "VALUES:"); ok {
					return writeValues(t, v)
				}
				return a
			})
			want := chartDefaults(t)
			maps.Copy(want, tt.want)
			cm := get[corev1.ConfigMap](t, render(t, args...), "ConfigMap", autoscalerCM)
			if diff := cmp.Diff(want, withoutDocs(cm.Data)); diff != "" {
				t.Errorf("ConfigMap data (-want +got):\n%s", diff)
			}
		})
	}
}

// A bad value stops the install with an error naming the key and what is
// allowed (values.schema.json, or a template's fail for rules across keys).
func TestBadValues(t *testing.T) {
	for _, tt := range []struct {
		set  string
		want []string // substrings of helm's error
	}{
		{"controller.replicas=0", []string{"/controller/replicas", "minimum", "want 1"}},
		{"controller.replicas=-1", []string{"/controller/replicas", "minimum"}},
		{"agent.reportPeriod=-1s", []string{"/agent/reportPeriod", "'-1s' does not match pattern"}},
		{"agent.reportPeriod=1", []string{"/agent/reportPeriod"}},
		{"agent.logLevel=verbose", []string{"/agent/logLevel", "'debug', 'info', 'warn', 'error'"}},
		{"agent.socketRedirect=maybe", []string{"/agent/socketRedirect", "'auto', 'on', 'off'"}},
		{"agent.bpffs.mountPropagation=Shared", []string{"/agent/bpffs/mountPropagation", "'None', 'HostToContainer', 'Bidirectional'"}},
		{"agent.image.pullPolicy=Sometimes", []string{"/agent/image/pullPolicy", "'Always', 'IfNotPresent', 'Never'"}},
		{"agent.capabilities={bpf}", []string{"/agent/capabilities/0"}},
		{"agent.updateStrategy.maxUnavailable=0", []string{"/agent/updateStrategy/maxUnavailable"}},
		{"agent.ports.metrics=70000", []string{"/agent/ports/metrics", "maximum"}},
		{"agent.cgroupRoot=sys/fs/cgroup", []string{"/agent/cgroupRoot"}},
		{"agent.typo=1", []string{"/agent", "'typo' not allowed"}},
		{"controller.concurrentReconciles=0", []string{"/controller/concurrentReconciles", "minimum"}},
		{"controller.concurrentReconciles=2000", []string{"/controller/concurrentReconciles", "maximum"}},
		{"controller.buckets=0", []string{"/controller/buckets", "minimum"}},
		{"controller.buckets=65", []string{"/controller/buckets", "maximum"}},
		{"controller.podDisruptionBudget.minAvailable=0", []string{"/controller/podDisruptionBudget/minAvailable"}},
		{"autoscaler.stable-window=soon", []string{"/autoscaler/stable-window"}},
		{"autoscaler.min-scale=-1", []string{"/autoscaler/min-scale", "minimum"}},
		{"autoscaler.panic-threshold-percentage=50", []string{"/autoscaler/panic-threshold-percentage", "want 110"}},
		{"autoscaler.max-scale-down-rate=1", []string{"/autoscaler/max-scale-down-rate", "exclusiveMinimum"}},
		{"autoscaler.stable-windw=30s", []string{"/autoscaler", "'stable-windw' not allowed"}},
		{"autoscaler.podspec-volumes-hostpath=on", []string{"/autoscaler/podspec-volumes-hostpath", "'enabled', 'disabled', 'allowed'"}},
		{"controller.admissionPolicy.enabled=yes", []string{"/controller/admissionPolicy/enabled", "got string, want boolean"}},
		{"controller.scaleTargets[0].kind=deployments", []string{"/controller/scaleTargets/0/kind", "'deployments' does not match pattern"}},
		{"controller.scaleTargets[1].resource=StatefulSets", []string{"/controller/scaleTargets/1/resource", "'StatefulSets' does not match pattern"}},
		{"controller.scaleTargetPolicy.enabled=yes", []string{"/controller/scaleTargetPolicy/enabled", "got string, want boolean"}},
		{"controller.metrics.certSecret=Metrics_TLS", []string{"/controller/metrics/certSecret", "'Metrics_TLS' does not match pattern"}},
		{"controller.metrics.secure=yes", []string{"/controller/metrics/secure", "got string, want boolean"}},
		{"networkPolicy.enabled=yes", []string{"/networkPolicy/enabled", "got string, want boolean"}},
		{"networkPolicy.metricsFrom=monitoring", []string{"/networkPolicy/metricsFrom", "got string, want array"}},
		{"networkPolicy.agentMetricsFrom[0].namespace=monitoring", []string{"/networkPolicy/agentMetricsFrom/0", "'namespace' not allowed"}},
		// The activator's values are checked whether or not it is enabled.
		{"activator.queueDepth=0", []string{"/activator/queueDepth", "minimum", "want 1"}},
		{"activator.maxHeld=-1", []string{"/activator/maxHeld", "minimum"}},
		{"activator.maxHeld=1000001", []string{"/activator/maxHeld", "maximum"}},
		{"activator.ports.proxy=0", []string{"/activator/ports/proxy", "minimum"}},
		{"activator.ports.metrics=70000", []string{"/activator/ports/metrics", "maximum"}},
		{"activator.logLevel=verbose", []string{"/activator/logLevel", "'debug', 'info', 'warn', 'error'"}},
		{"activator.probePeriod=fast", []string{"/activator/probePeriod", "'fast' does not match pattern"}},
		{"activator.clusterDomain=Cluster.Local", []string{"/activator/clusterDomain"}},
		{"activator.networkPolicies=audit", []string{"/activator/networkPolicies", "'audit' does not match pattern '^(enforce|ignore)$'"}},
		{"activator.reconnectServedClients=sometimes", []string{"/activator/reconnectServedClients", "got string, want boolean"}},
		{"activator.replicas=0", []string{"/activator/replicas", "minimum"}},
		{"activator.terminationGracePeriodSeconds=-1", []string{"/activator/terminationGracePeriodSeconds", "minimum"}},
		{"activator.autoscaling.targetCPUUtilizationPercentage=0", []string{"/activator/autoscaling/targetCPUUtilizationPercentage", "minimum"}},
		{"activator.autoscaling.maxReplicas=0", []string{"/activator/autoscaling/maxReplicas", "minimum"}},
		{"activator.image.pullPolicy=Sometimes", []string{"/activator/image/pullPolicy"}},
		{"activator.enabled=yes", []string{"/activator/enabled"}},
		{"activator.typo=1", []string{"/activator", "'typo' not allowed"}},
		// Rules across keys, checked by the templates.
		{"agent.bpffs.mountPropagation=Bidirectional", []string{"agent.bpffs.mountPropagation", "agent.privileged=true"}},
		{"controller.leaderElect=false", []string{"controller.leaderElect", "controller.replicas > 1"}},
		{"controller.replicas=1,controller.leaderElect=false,controller.buckets=4", []string{"controller.buckets (4)", "controller.leaderElect=true"}},
		{"activator.enabled=true,activator.ports.metrics=8012", []string{"activator.ports", "must differ"}},
		{"activator.enabled=true,activator.probePeriod=0s", []string{"activator.probePeriod", "positive"}},
		{"activator.enabled=true,activator.autoscaling.enabled=true,activator.autoscaling.minReplicas=5,activator.autoscaling.maxReplicas=3",
			[]string{"activator.autoscaling.minReplicas (5)", "activator.autoscaling.maxReplicas (3)"}},
		{"activator.enabled=true,activator.podDisruptionBudget.minAvailable=2", []string{"activator.podDisruptionBudget.minAvailable (2)", "replicas (2)"}},
		// agent.pools: names, keys a pool may not set, and its values
		// checked as the agent's.
		{"agent.pools.GPU.logLevel=debug", []string{`pool name "GPU"`, "DNS-1123 label", "lower-case letters, digits and '-'"}},
		{"agent.pools.gpu_a.logLevel=debug", []string{`pool name "gpu_a"`, "DNS-1123 label"}},
		{"agent.pools.abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz.logLevel=debug",
			[]string{`pool name "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz"`, "68 characters", "Kubernetes allows 63", "at most 47"}},
		{"fullnameOverride=abcdefghijabcdefghijabcdefghijabcdefghij,agent.pools.abcdefghijklmnopq.logLevel=debug", []string{"64 characters", "at most 16"}},
		{"agent.pools.gpu.cgroupRot=/x", []string{"agent.pools.gpu.cgroupRot: not a key a pool may set", "a pool may set cgroupRoot, bpffs,", "podLabels"}},
		{"agent.pools.gpu.socketRedirect=off", []string{"agent.pools.gpu.socketRedirect: chart-wide", "ClusterRole", "set agent.socketRedirect"}},
		{"agent.pools.gpu.ports.metrics=9100", []string{"agent.pools.gpu.ports: chart-wide", "set agent.ports"}},
		{"agent.pools.gpu.image.tag=v2", []string{"agent.pools.gpu.image: chart-wide", "set agent.image"}},
		{"agent.pools.gpu.metrics.secure=false", []string{"agent.pools.gpu.metrics: chart-wide", "PodMonitor"}},
		{"agent.pools.gpu.activatorNamespace=x", []string{"agent.pools.gpu.activatorNamespace: chart-wide"}},
		{"agent.pools.gpu.serviceAccount.annotations.a=b", []string{"agent.pools.gpu.serviceAccount: chart-wide"}},
		{"agent.pools.gpu.drain.port=9200", []string{"agent.pools.gpu.drain.port: chart-wide", "set agent.drain.port"}},
		{"agent.pools.gpu.pools.cpu.logLevel=debug", []string{"agent.pools.gpu.pools: pools do not nest"}},
		{"agent.pools.gpu.drain.typo=1", []string{"/agent/pools/gpu/drain", "'typo' not allowed"}},
		{"agent.pools.gpu.cgroupRoot=sys/fs/cgroup", []string{"/agent/pools/gpu/cgroupRoot", "does not match pattern '^/'"}},
		{"agent.pools.gpu.logLevel=verbose", []string{"/agent/pools/gpu/logLevel", "'debug', 'info', 'warn', 'error'"}},
		{"agent.pools.gpu=on", []string{"/agent/pools/gpu", "want object"}},
		{"agent.pools.gpu.bpffs.mountPropagation=Bidirectional", []string{"agent.pools.gpu.bpffs.mountPropagation", "agent.pools.gpu.privileged=true"}},
	} {
		t.Run(tt.set, func(t *testing.T) {
			_, err := helm(t, templateArgs(t, "--set", tt.set)...)
			if err == nil {
				t.Fatalf("--set %s rendered; want an error", tt.set)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("--set %s: error does not contain %q:\n%v", tt.set, w, err)
				}
			}
		})
	}
}

// Every key of values.yaml has a comment right above it, except the
// contents of free-form maps (their parent is documented).
func TestValuesDocumented(t *testing.T) {
	f, err := os.Open(filepath.Join(chartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	key := regexp.MustCompile(`^(\s*)([A-Za-z0-9_.-]+):`)
	freeForm := map[string]bool{"resources": true, "requests": true, "limits": true, "nodeSelector": true}
	type open struct {
		indent int
		name   string
	}
	var stack []open // enclosing keys
	prev := ""
	n := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		n++
		line := s.Text()
		if m := key.FindStringSubmatch(line); m != nil {
			indent := len(m[1])
			for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
				stack = stack[:len(stack)-1]
			}
			inFree := len(stack) > 0 && freeForm[stack[len(stack)-1].name]
			if !inFree && !strings.HasPrefix(strings.TrimSpace(prev), "#") {
				t.Errorf("values.yaml:%d: key %q has no comment above it", n, m[2])
			}
			stack = append(stack, open{indent, m[2]})
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("read only %d lines of values.yaml", n)
	}
}

func slicesMap(in []string, f func(string) string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = f(s)
	}
	return out
}
