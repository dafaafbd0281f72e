package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestE2EAgent runs the real sockscale-agent as a DaemonSet with the
// hostPaths and capabilities a real node needs: each node's agent attaches
// at its own cgroup subtree and pins into its own bpffs directory, and
// counts the requests of a pod on its node.
func TestE2EAgent(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	labels := map[string]string{"app": "sockscale-agent"}
	rbac := func() error {
		if _, err := c.Client.CoreV1().ServiceAccounts(e2eNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent"}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-agent"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-agent"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "e2e-agent"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "agent", Namespace: e2eNS}},
		}, metav1.CreateOptions{})
		return err
	}
	if err := rbac(); err != nil {
		t.Fatal(err)
	}
	hostPath := func(p string) corev1.VolumeSource {
		return corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "sockscale-agent", Namespace: e2eNS},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: "agent",
					Containers: []corev1.Container{{
						Name: "agent", Image: agentImage,
						// The default --socket-redirect=auto on a cluster with
						// neither the ServerlessService CRD nor RBAC on Services,
						// which the redirect watches (the chart installs both):
						// the agent must count anyway, and say why it does not
						// redirect.
						// Neither in the node's network namespace nor able to
						// open it (no hostPID, no SYS_ADMIN): the flags the
						// chart gives such an agent (agent.namespaceAccess=false),
						// or the kubelet's probes would count as load.
						Args: []string{"--cgroup-root=/sys/fs/cgroup", "--bpffs-dir=/sys/fs/bpf/sockscale", "--report-period=200ms",
							"--probe-sources=any", "--connection-audit-period=0",
							// Scraped over plain HTTP below: this DaemonSet has no
							// RBAC to review a scraper's token.
							"--metrics-secure=false"},
						// The activators' namespace defaults to the agent's own.
						Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
							FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
							{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{
								FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}},
						SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
							Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"BPF", "NET_ADMIN", "PERFMON"}}},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "cgroup", MountPath: "/sys/fs/cgroup"},
							{Name: "bpffs", MountPath: "/sys/fs/bpf"},
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(8081)}},
							PeriodSeconds: 1,
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "cgroup", VolumeSource: hostPath("/sys/fs/cgroup")},
						{Name: "bpffs", VolumeSource: hostPath("/sys/fs/bpf")},
					},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().DaemonSets(e2eNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agents := map[string]string{} // node -> agent pod IP
	eventually(t, 90*time.Second, "an agent ready on each node", func() error {
		list, err := c.Client.CoreV1().Pods(e2eNS).List(ctx, metav1.ListOptions{LabelSelector: "app=sockscale-agent"})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if podReady(&p) {
				agents[p.Spec.NodeName] = p.Status.PodIP
			} else {
				return fmt.Errorf("%s on %s not ready: %+v", p.Name, p.Spec.NodeName, p.Status.ContainerStatuses)
			}
		}
		if len(agents) != 2 {
			return fmt.Errorf("ready agents: %v", agents)
		}
		return nil
	})
	for node := range agents {
		entries, err := os.ReadDir(filepath.Join(nodeBPFFS(node), "sockscale"))
		if err != nil || len(entries) == 0 {
			t.Errorf("node %s: nothing pinned in its bpffs directory: %v", node, err)
		}
	}
	// Requests to a pod are counted by the agent of its node.
	p := createReadyPod(t, c, echoPod("counted", nil))
	for range 5 {
		if _, err := get("http://" + p.Status.PodIP + ":8080/"); err != nil {
			t.Fatal(err)
		}
	}
	want := fmt.Sprintf(`sockscale_agent_requests_total{namespace="%s",pod="counted"`, e2eNS)
	eventually(t, 30*time.Second, "the agent of "+p.Spec.NodeName+" counts the pod's requests", func() error {
		body, err := get("http://" + agents[p.Spec.NodeName] + ":9090/metrics")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, want) && strings.HasSuffix(line, " 5") {
				return nil
			}
		}
		return fmt.Errorf("no %s... 5 in /metrics", want)
	})
	// The redirect could not run here: it says so, and the agent never
	// restarted over it.
	for node, ip := range agents {
		eventually(t, 30*time.Second, "the agent of "+node+" reports its redirect unavailable", func() error {
			body, err := get("http://" + ip + ":9090/metrics")
			if err != nil {
				return err
			}
			if !strings.Contains(body, `sockscale_agent_socket_redirect_state{state="unavailable"} 1`) {
				return errors.New(`no sockscale_agent_socket_redirect_state{state="unavailable"} 1 in /metrics`)
			}
			return nil
		})
	}
	list, err := c.Client.CoreV1().Pods(e2eNS).List(ctx, metav1.ListOptions{LabelSelector: "app=sockscale-agent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 0 {
				t.Errorf("agent %s on %s restarted %d times", p.Name, p.Spec.NodeName, cs.RestartCount)
			}
		}
	}
}
