package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Volumes. configMap, secret, downwardAPI and projected volumes (the
// ServiceAccount token the admission plugin injects is one) are written as
// files once, when the pod starts (later changes of their sources are not
// followed); emptyDir is a directory of the pod's; hostPath is translated
// per node (see hostPath). Each is bind-mounted at its mountPath in the
// container's own mount namespace.

func (w *podWorker) volumeDir(name string) string { return filepath.Join(w.dir, "volumes", name) }

func (w *podWorker) writeVolumes(ctx context.Context, pod *corev1.Pod) error {
	for _, v := range pod.Spec.Volumes {
		dir := w.volumeDir(v.Name)
		var err error
		switch {
		case v.EmptyDir != nil:
			err = os.MkdirAll(dir, 0o777)
		case v.ConfigMap != nil:
			err = w.writeConfigMap(ctx, pod, dir, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode)
		case v.Secret != nil:
			err = w.writeSecret(ctx, pod, dir, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode)
		case v.DownwardAPI != nil:
			err = w.writeDownward(pod, dir, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
		case v.Projected != nil:
			err = os.MkdirAll(dir, 0o755)
			for _, src := range v.Projected.Sources {
				if err != nil {
					break
				}
				switch {
				case src.ServiceAccountToken != nil:
					err = w.writeToken(ctx, pod, dir, src.ServiceAccountToken, v.Projected.DefaultMode)
				case src.ConfigMap != nil:
					err = w.writeConfigMap(ctx, pod, dir, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional, v.Projected.DefaultMode)
				case src.Secret != nil:
					err = w.writeSecret(ctx, pod, dir, src.Secret.Name, src.Secret.Items, src.Secret.Optional, v.Projected.DefaultMode)
				case src.DownwardAPI != nil:
					err = w.writeDownward(pod, dir, src.DownwardAPI.Items, v.Projected.DefaultMode)
				}
			}
		case v.HostPath != nil:
			_, err = w.hostPath(v.HostPath)
		default:
			err = errors.New("volume type not supported by the node simulator")
		}
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	return w.writeDNS(pod)
}

func mode(m *int32, def os.FileMode) os.FileMode {
	if m != nil {
		return os.FileMode(*m)
	}
	return def
}

func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath, defMode *int32) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if len(items) == 0 {
		for k, v := range data {
			if err := writeFile(filepath.Join(dir, k), v, mode(defMode, 0o644)); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("no key %s", it.Key)
		}
		if err := writeFile(filepath.Join(dir, it.Path), v, mode(it.Mode, mode(defMode, 0o644))); err != nil {
			return err
		}
	}
	return nil
}

func (w *podWorker) writeConfigMap(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, optional *bool, defMode *int32) error {
	cm, err := w.s.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if optional != nil && *optional {
			return os.MkdirAll(dir, 0o755)
		}
		return fmt.Errorf("configmap %s: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return writeKeys(dir, data, items, defMode)
}

func (w *podWorker) writeSecret(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, optional *bool, defMode *int32) error {
	s, err := w.s.client.CoreV1().Secrets(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if optional != nil && *optional {
			return os.MkdirAll(dir, 0o755)
		}
		return fmt.Errorf("secret %s: %w", name, err)
	}
	return writeKeys(dir, s.Data, items, defMode)
}

func (w *podWorker) writeDownward(pod *corev1.Pod, dir string, items []corev1.DownwardAPIVolumeFile, defMode *int32) error {
	for _, it := range items {
		if it.FieldRef == nil {
			continue // resourceFieldRef files: not supported
		}
		v, err := w.fieldRef(pod, it.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, it.Path), []byte(v), mode(it.Mode, mode(defMode, 0o644))); err != nil {
			return err
		}
	}
	return nil
}

// writeToken asks the TokenRequest API for the pod's ServiceAccount token,
// bound to the pod. Tokens of 3607 s (the admission plugin's) are extended
// by the apiserver to a year, so the simulator does not refresh them.
func (w *podWorker) writeToken(ctx context.Context, pod *corev1.Pod, dir string, src *corev1.ServiceAccountTokenProjection, defMode *int32) error {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		tr.Spec.Audiences = []string{src.Audience}
	}
	tok, err := w.s.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for serviceaccount %s: %w", sa, err)
	}
	return writeFile(filepath.Join(dir, src.Path), []byte(tok.Status.Token), mode(defMode, 0o644))
}

// hostPath translates a hostPath volume to this node's share of the host:
//
//	<cgroup2 root> (e.g. /sys/fs/cgroup/unified)  -> <cgroup2 root>/sockscale-cluster/<node>
//	/sys/fs/cgroup (on a hybrid host)             -> the same: the node looks cgroup2-only
//	<cgroup2 root>/<p>, /sys/fs/cgroup/<p> (hybrid) -> <node subtree>/<p>
//	/sys/fs/bpf[/<p>]                             -> /sys/fs/bpf/sockscale-cluster/<node>[/<p>]
//	any other path that exists on the host        -> itself (shared by every node)
//	any other path (DirectoryOrCreate, FileOrCreate) -> <state-dir>/nodes/<node>/root/<path>
//
// So every node's agent attaches at its own cgroup subtree and pins into its
// own bpffs directory with the same DaemonSet spec.
func (w *podWorker) hostPath(hp *corev1.HostPathVolumeSource) (string, error) {
	p := filepath.Clean(hp.Path)
	nodeCg := nodeCgroup(w.s.cgroupRoot, w.node.name)
	under := func(base string) (string, bool) {
		if p == base {
			return "", true
		}
		if rest, ok := strings.CutPrefix(p, base+"/"); ok {
			return rest, true
		}
		return "", false
	}
	if rest, ok := under(w.s.cgroupRoot); ok {
		return filepath.Join(nodeCg, rest), nil
	}
	if w.s.cgroupRoot != "/sys/fs/cgroup" {
		if rest, ok := under("/sys/fs/cgroup"); ok {
			return filepath.Join(nodeCg, rest), nil
		}
	}
	if rest, ok := under("/sys/fs/bpf"); ok {
		dir := filepath.Join(nodeBPFFS(w.node.name), rest)
		return dir, os.MkdirAll(dir, 0o700)
	}
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	local := filepath.Join(w.s.opts.StateDir, "nodes", w.node.name, "root", p)
	typ := corev1.HostPathUnset
	if hp.Type != nil {
		typ = *hp.Type
	}
	switch typ {
	case corev1.HostPathDirectoryOrCreate, corev1.HostPathUnset:
		return local, os.MkdirAll(local, 0o755)
	case corev1.HostPathFileOrCreate:
		if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
			return "", err
		}
		f, err := os.OpenFile(local, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return "", err
		}
		return local, f.Close()
	}
	if _, err := os.Stat(local); err == nil {
		return local, nil
	}
	return "", fmt.Errorf("hostPath %s (type %s) does not exist", p, typ)
}

// writeDNS writes the pod's resolv.conf and hosts files.
func (w *podWorker) writeDNS(pod *corev1.Pod) error {
	w.mu.Lock()
	ips := w.podIPs()
	w.mu.Unlock()
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	// Each of the pod's addresses names it, as the kubelet writes them.
	for _, ip := range ips {
		hosts += fmt.Sprintf("%s\t%s\n", ip, pod.Name)
	}
	if err := writeFile(filepath.Join(w.dir, "hosts"), []byte(hosts), 0o644); err != nil {
		return err
	}
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	var ns, search, opts []string
	switch {
	case policy == corev1.DNSClusterFirstWithHostNet, policy == corev1.DNSClusterFirst && !pod.Spec.HostNetwork:
		ns = []string{HostIP.String()}
		search = []string{pod.Namespace + ".svc." + ClusterDomain, "svc." + ClusterDomain, ClusterDomain}
		opts = []string{"ndots:5"}
	case policy == corev1.DNSNone:
	default:
		return nil // the host's resolv.conf
	}
	if c := pod.Spec.DNSConfig; c != nil {
		ns = append(ns, c.Nameservers...)
		search = append(search, c.Searches...)
		for _, o := range c.Options {
			if o.Value != nil {
				opts = append(opts, o.Name+":"+*o.Value)
			} else {
				opts = append(opts, o.Name)
			}
		}
	}
	var b strings.Builder
	for _, n := range ns {
		fmt.Fprintf(&b, "nameserver %s\n", n)
	}
	if len(search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(search, " "))
	}
	if len(opts) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(opts, " "))
	}
	return writeFile(filepath.Join(w.dir, "resolv.conf"), []byte(b.String()), 0o644)
}

// mounts are the container's bind mounts: its volumeMounts, then
// /etc/resolv.conf and /etc/hosts.
func (w *podWorker) mounts(pod *corev1.Pod, c *corev1.Container) ([]mountSpec, error) {
	vols := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		vols[pod.Spec.Volumes[i].Name] = &pod.Spec.Volumes[i]
	}
	var out []mountSpec
	for _, vm := range c.VolumeMounts {
		v := vols[vm.Name]
		if v == nil {
			return nil, fmt.Errorf("volumeMount %s: no such volume", vm.Name)
		}
		src := w.volumeDir(v.Name)
		if v.HostPath != nil {
			var err error
			if src, err = w.hostPath(v.HostPath); err != nil {
				return nil, err
			}
		}
		if vm.SubPath != "" {
			src = filepath.Join(src, vm.SubPath)
		}
		out = append(out, mountSpec{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly})
	}
	if _, err := os.Stat(filepath.Join(w.dir, "resolv.conf")); err == nil {
		out = append(out, mountSpec{Source: filepath.Join(w.dir, "resolv.conf"), Target: "/etc/resolv.conf", ReadOnly: true})
	}
	if !pod.Spec.HostNetwork {
		out = append(out, mountSpec{Source: filepath.Join(w.dir, "hosts"), Target: "/etc/hosts", ReadOnly: true})
	}
	return out, nil
}
