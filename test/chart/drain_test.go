package chart_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
)

// The agents serve the preStop wait on the node's loopback and the
// controller gives serving Revisions the hook, both on agent.drain.port,
// where the agent can: with namespaceAccess or hostNetwork.
func TestDrain(t *testing.T) {
	drainArgs := func(args []string) []string {
		var out []string
		for _, a := range args {
			if strings.HasPrefix(a, "--drain-") {
				out = append(out, a)
			}
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		sets       []string
		agent, ctl []string
	}{
		{"default", nil, []string{"--drain-bind-address=127.0.0.1:9094", "--drain-min-wait=2s"}, []string{"--drain-port=9094"}},
		{"another port and wait", []string{"agent.drain.port=9200", "agent.drain.minWait=5s"},
			[]string{"--drain-bind-address=127.0.0.1:9200", "--drain-min-wait=5s"}, []string{"--drain-port=9200"}},
		{"off", []string{"agent.drain.enabled=false"}, nil, nil},
		{"no namespace access", []string{"agent.namespaceAccess=false"}, nil, nil},
		{"host network instead", []string{"agent.namespaceAccess=false", "agent.hostNetwork=true"},
			[]string{"--drain-bind-address=127.0.0.1:9094", "--drain-min-wait=2s"}, []string{"--drain-port=9094"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			for _, s := range tc.sets {
				extra = append(extra, "--set", s)
			}
			objs := render(t, extra...)
			agent := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec.Containers[0].Args
			ctl := get[appsv1.Deployment](t, objs, "Deployment", controllerName).Spec.Template.Spec.Containers[0].Args
			if diff := cmp.Diff(tc.agent, drainArgs(agent)); diff != "" {
				t.Errorf("agent's drain args (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.ctl, drainArgs(ctl)); diff != "" {
				t.Errorf("controller's drain args (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := helm(t, templateArgs(t, "--set", "agent.drain.minWait=2")...); err == nil || !slices.ContainsFunc([]string{err.Error()}, func(s string) bool { return strings.Contains(s, "minWait") }) {
		t.Errorf("agent.drain.minWait=2: %v, want refused naming the key", err)
	}
}

// With pools the controller gives the hook when the agents of any
// DaemonSet drain (on the chart-wide port); each DaemonSet's agents drain
// by its own values.
func TestDrainPools(t *testing.T) {
	drainArgs := func(args []string) []string {
		var out []string
		for _, a := range args {
			if strings.HasPrefix(a, "--drain-") {
				out = append(out, a)
			}
		}
		return out
	}
	on := []string{"--drain-bind-address=127.0.0.1:9094", "--drain-min-wait=2s"}
	for _, tc := range []struct {
		name       string
		set        string
		main, pool []string // the drain flags of agentName and agentName-gpu
		ctl        []string
	}{
		{"both", "agent.pools.gpu.logLevel=debug", on, on, []string{"--drain-port=9094"}},
		{"off in the pool", "agent.pools.gpu.drain.enabled=false", on, nil, []string{"--drain-port=9094"}},
		{"only in the pool", "agent.drain.enabled=false,agent.pools.gpu.drain.enabled=true", nil, on, []string{"--drain-port=9094"}},
		{"only the pool can", "agent.namespaceAccess=false,agent.pools.gpu.namespaceAccess=true", nil, on, []string{"--drain-port=9094"}},
		{"only the pool, by hostNetwork", "agent.namespaceAccess=false,agent.pools.gpu.hostNetwork=true", nil, on, []string{"--drain-port=9094"}},
		{"the pool's wait, the agent's port", "agent.drain.port=9200,agent.pools.gpu.drain.minWait=5s",
			[]string{"--drain-bind-address=127.0.0.1:9200", "--drain-min-wait=2s"}, []string{"--drain-bind-address=127.0.0.1:9200", "--drain-min-wait=5s"}, []string{"--drain-port=9200"}},
		{"nowhere", "agent.drain.enabled=false,agent.pools.gpu.namespaceAccess=false", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, "--set", tc.set)
			for name, want := range map[string][]string{agentName: tc.main, agentName + "-gpu": tc.pool} {
				got := drainArgs(get[appsv1.DaemonSet](t, objs, "DaemonSet", name).Spec.Template.Spec.Containers[0].Args)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s's drain args (-want +got):\n%s", name, diff)
				}
			}
			ctl := get[appsv1.Deployment](t, objs, "Deployment", controllerName).Spec.Template.Spec.Containers[0].Args
			if diff := cmp.Diff(tc.ctl, drainArgs(ctl)); diff != "" {
				t.Errorf("controller's drain args (-want +got):\n%s", diff)
			}
		})
	}
}
