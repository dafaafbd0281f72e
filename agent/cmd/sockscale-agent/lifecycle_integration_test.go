//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestIntegrationAgentStopKeepsOrUninstalls runs the agent in-process
// against a real kube-apiserver and the real kernel, as the pod of a
// DaemonSet. Stopped while its DaemonSet stands (a restart, a rolling
// update), it leaves its 3 accounting and 4 redirect programs attached and
// pinned; stopped after the DaemonSet was deleted (an uninstall), it
// detaches all 7 and removes its pin directory.
func TestIntegrationAgentStopKeepsOrUninstalls(t *testing.T) {
	cl, root, pinDir := agentEnv(t, "lifecycle")
	ctx := context.Background()

	labels := map[string]string{"app": "sockscale-agent"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sockscale-agent"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "sockscale-agent"}}},
			},
		},
	}
	if err := cl.Client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sockscale-agent-x1", Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: new(bool)}}},
		Spec: corev1.PodSpec{NodeName: "node-a", TerminationGracePeriodSeconds: new(int64), Containers: []corev1.Container{{Name: "agent", Image: "sockscale-agent"}}},
	}
	if err := cl.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}

	// runAgent runs the agent until between(); then stops it as a SIGTERM
	// would (its ctx ends) and returns once run returned.
	runAgent := func(between func()) {
		t.Helper()
		cfg, err := parseFlags([]string{
			"--node-name=node-a", "--cgroup-root=" + root, "--bpffs-dir=" + pinDir, "--kubeconfig=" + cl.Kubeconfig,
			"--metrics-bind-address=127.0.0.1:0", "--metrics-secure=false", "--health-probe-bind-address=127.0.0.1:0", "--socket-redirect=auto",
			"--pod-name=" + pod.Name, "--pod-namespace=default", "--activator-namespace=default",
		})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- run(runCtx, cfg, slog.New(slog.NewTextHandler(os.Stderr, nil))) }()
		waitFor(t, 20*time.Second, "7 programs attached", func() string {
			if n := sockscalePrograms(t, root); n != 7 {
				return fmt.Sprintf("%d attached", n)
			}
			return ""
		})
		between()
		stop()
		if err := <-done; err != nil {
			t.Fatalf("run: %v", err)
		}
	}

	// A restart: the DaemonSet stays.
	runAgent(func() { time.Sleep(time.Second) })
	if n := sockscalePrograms(t, root); n != 7 {
		t.Errorf("after a stop with the DaemonSet there: %d programs attached at %s; want 7 (kept for the next agent)", n, root)
	}
	if _, err := os.Stat(pinDir); err != nil {
		t.Errorf("after a stop with the DaemonSet there: pins gone: %v", err)
	}

	// An uninstall: the DaemonSet is deleted while the agent runs (the
	// agent adopts the pinned state first), then the agent is stopped.
	runAgent(func() {
		time.Sleep(time.Second) // the agent's watch of its DaemonSet is open
		if err := cl.Client.Delete(ctx, ds); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	})
	if n := sockscalePrograms(t, root); n != 0 {
		t.Errorf("after a stop with the DaemonSet deleted: %d programs attached at %s; want 0", n, root)
	}
	if _, err := os.Stat(pinDir); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(pinDir)
		t.Errorf("after a stop with the DaemonSet deleted: pin directory %s still there (%v, %d entries); want it removed", pinDir, err, len(entries))
	}
}

// sockscalePrograms counts our programs attached at a cgroup, as bpftool
// reports them.
func sockscalePrograms(t *testing.T, cgroup string) int {
	t.Helper()
	out, err := exec.Command("bpftool", "cgroup", "show", cgroup).CombinedOutput()
	if err != nil {
		t.Fatalf("bpftool cgroup show %s: %v: %s", cgroup, err, out)
	}
	return strings.Count(string(out), "sockscale_")
}
