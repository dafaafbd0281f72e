package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// initSpec is what the pod-init helper does before it execs the container's
// binary (see podinit.go).
type initSpec struct {
	// NetNS is the netns file to enter; empty for hostNetwork.
	NetNS    string      `json:"netns,omitempty"`
	Hostname string      `json:"hostname"`
	Mounts   []mountSpec `json:"mounts"`
	Env      []string    `json:"env"`
	// Rootfs is the image's unpacked root filesystem; Path (absolute, or
	// a name looked up in the PATH of Env) is resolved in it, never on the
	// host.
	Rootfs string   `json:"rootfs"`
	Path   string   `json:"path"`
	Args   []string `json:"args"`
	Dir    string   `json:"dir,omitempty"`
	// Caps are the capabilities the process keeps (numbers); every other
	// one leaves the bounding, permitted, effective and inheritable sets.
	Caps       []int  `json:"caps"`
	UID        *int64 `json:"uid,omitempty"`
	GID        *int64 `json:"gid,omitempty"`
	NoNewPrivs bool   `json:"noNewPrivs,omitempty"`
	// ReadOnlyRoot remounts / read-only in the container's mount namespace
	// (readOnlyRootFilesystem); the volumes and other mounts stay as they are.
	ReadOnlyRoot bool `json:"readOnlyRoot,omitempty"`
	// CreatedLog is a file the helper appends mount points it had to create
	// on the host to, so `down` removes them.
	CreatedLog string `json:"createdLog"`
}

type mountSpec struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

func (w *podWorker) initSpec(ctx context.Context, pod *corev1.Pod, c *corev1.Container, img *pulledImage) (*initSpec, error) {
	spec := &initSpec{Rootfs: img.Rootfs, Dir: c.WorkingDir, Hostname: pod.Name,
		CreatedLog: filepath.Join(w.s.opts.StateDir, "created-paths")}
	// The image's working directory is in its rootfs; the container's
	// own is a host path, like its volumes' mount paths (see README.md).
	if spec.Dir == "" && img.Config.WorkingDir != "" {
		spec.Dir = filepath.Join(img.Rootfs, img.Config.WorkingDir)
	}
	if pod.Spec.Hostname != "" {
		spec.Hostname = pod.Spec.Hostname
	}
	if pod.Spec.HostNetwork {
		spec.Hostname = w.node.name
	} else {
		spec.NetNS = filepath.Join("/run/netns", w.netns)
	}
	env, err := w.env(ctx, pod, c, img.Config.Env)
	if err != nil {
		return nil, err
	}
	for _, e := range env {
		spec.Env = append(spec.Env, e.Name+"="+e.Value)
	}
	vars := map[string]string{}
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	var command, args []string
	for _, a := range c.Command {
		command = append(command, expand(a, vars))
	}
	for _, a := range c.Args {
		args = append(args, expand(a, vars))
	}
	argv, err := containerArgv(command, args, img.Config)
	if err != nil {
		return nil, err
	}
	spec.Path, spec.Args = argv[0], argv[1:]
	mounts, err := w.mounts(pod, c)
	if err != nil {
		return nil, err
	}
	spec.Mounts = mounts
	caps, err := containerCaps(c.SecurityContext)
	if err != nil {
		return nil, err
	}
	spec.Caps = caps
	sc := c.SecurityContext
	psc := pod.Spec.SecurityContext
	// The image's user unless the pod or container sets one, as runc does.
	uid, gid, err := imageUser(img.Rootfs, img.Config.User)
	if err != nil {
		return nil, err
	}
	spec.UID, spec.GID = &uid, &gid
	if sc != nil && sc.RunAsUser != nil {
		spec.UID = sc.RunAsUser
	} else if psc != nil && psc.RunAsUser != nil {
		spec.UID = psc.RunAsUser
	}
	if sc != nil && sc.RunAsGroup != nil {
		spec.GID = sc.RunAsGroup
	} else if psc != nil && psc.RunAsGroup != nil {
		spec.GID = psc.RunAsGroup
	}
	nonRoot := psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	if sc != nil && sc.RunAsNonRoot != nil {
		nonRoot = *sc.RunAsNonRoot
	}
	if nonRoot && *spec.UID == 0 {
		return nil, fmt.Errorf("container has runAsNonRoot and image will run as root (image user %q, no runAsUser)", img.Config.User)
	}
	spec.ReadOnlyRoot = sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	if sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation && (sc.Privileged == nil || !*sc.Privileged) {
		spec.NoNewPrivs = true
	}
	return spec, nil
}

// expand replaces $(VAR) with earlier variables' values and $$ with $, as
// the kubelet does in command, args and env values.
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '$' && i+1 < len(s) {
			if s[i+1] == '$' {
				b.WriteByte('$')
				i++
				continue
			}
			if s[i+1] == '(' {
				if j := strings.IndexByte(s[i:], ')'); j > 0 {
					if v, ok := vars[s[i+2:i+j]]; ok {
						b.WriteString(v)
						i += j
						continue
					}
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// env is the container's environment: the kubelet's defaults, then envFrom,
// then env with valueFrom resolved.
func (w *podWorker) env(ctx context.Context, pod *corev1.Pod, c *corev1.Container, imageEnv []string) ([]corev1.EnvVar, error) {
	out := []corev1.EnvVar{
		{Name: "PATH", Value: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	// The image's environment, then what the kubelet and the container
	// set (they win, as with a runtime).
	for _, kv := range imageEnv {
		k, v, _ := strings.Cut(kv, "=")
		if k == "PATH" {
			out[0].Value = v
			continue
		}
		out = append(out, corev1.EnvVar{Name: k, Value: v})
	}
	out = append(out, []corev1.EnvVar{
		{Name: "HOSTNAME", Value: pod.Name},
		{Name: "KUBERNETES_SERVICE_HOST", Value: KubernetesServiceIP.String()},
		{Name: "KUBERNETES_SERVICE_PORT", Value: "443"},
		{Name: "KUBERNETES_SERVICE_PORT_HTTPS", Value: "443"},
		{Name: "KUBERNETES_PORT", Value: "tcp://" + KubernetesServiceIP.String() + ":443"},
		{Name: "KUBERNETES_PORT_443_TCP", Value: "tcp://" + KubernetesServiceIP.String() + ":443"},
		{Name: "KUBERNETES_PORT_443_TCP_PROTO", Value: "tcp"},
		{Name: "KUBERNETES_PORT_443_TCP_PORT", Value: "443"},
		{Name: "KUBERNETES_PORT_443_TCP_ADDR", Value: KubernetesServiceIP.String()},
	}...)
	idx := map[string]int{}
	setVar := func(name, val string) {
		if i, ok := idx[name]; ok {
			out[i].Value = val
			return
		}
		idx[name] = len(out)
		out = append(out, corev1.EnvVar{Name: name, Value: val})
	}
	for i, e := range out {
		idx[e.Name] = i
	}
	cms := w.s.client.CoreV1().ConfigMaps(pod.Namespace)
	secrets := w.s.client.CoreV1().Secrets(pod.Namespace)
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, err := cms.Get(ctx, ef.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional {
					continue
				}
				return nil, fmt.Errorf("envFrom configmap %s: %w", ef.ConfigMapRef.Name, err)
			}
			for k, v := range cm.Data {
				setVar(ef.Prefix+k, v)
			}
		case ef.SecretRef != nil:
			s, err := secrets.Get(ctx, ef.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if ef.SecretRef.Optional != nil && *ef.SecretRef.Optional {
					continue
				}
				return nil, fmt.Errorf("envFrom secret %s: %w", ef.SecretRef.Name, err)
			}
			for k, v := range s.Data {
				setVar(ef.Prefix+k, string(v))
			}
		}
	}
	vars := map[string]string{}
	for _, e := range out {
		vars[e.Name] = e.Value
	}
	for _, e := range c.Env {
		val := expand(e.Value, vars)
		if vf := e.ValueFrom; vf != nil {
			var err error
			switch {
			case vf.FieldRef != nil:
				val, err = w.fieldRef(pod, vf.FieldRef.FieldPath)
			case vf.ResourceFieldRef != nil:
				val = resourceRef(c, vf.ResourceFieldRef)
			case vf.ConfigMapKeyRef != nil:
				ref := vf.ConfigMapKeyRef
				var cm *corev1.ConfigMap
				if cm, err = cms.Get(ctx, ref.Name, metav1.GetOptions{}); err == nil {
					var ok bool
					if val, ok = cm.Data[ref.Key]; !ok && (ref.Optional == nil || !*ref.Optional) {
						err = fmt.Errorf("configmap %s has no key %s", ref.Name, ref.Key)
					}
				} else if ref.Optional != nil && *ref.Optional {
					err = nil
					continue
				}
			case vf.SecretKeyRef != nil:
				ref := vf.SecretKeyRef
				var s *corev1.Secret
				if s, err = secrets.Get(ctx, ref.Name, metav1.GetOptions{}); err == nil {
					v, ok := s.Data[ref.Key]
					if !ok && (ref.Optional == nil || !*ref.Optional) {
						err = fmt.Errorf("secret %s has no key %s", ref.Name, ref.Key)
					}
					val = string(v)
				} else if ref.Optional != nil && *ref.Optional {
					err = nil
					continue
				}
			}
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
		}
		setVar(e.Name, val)
		vars[e.Name] = val
	}
	return out, nil
}

// fieldRef resolves the downward API's field paths.
func (w *podWorker) fieldRef(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.ip.String(), nil
	case "status.podIPs":
		// Comma-separated, IPv4 first, as the kubelet gives them.
		w.mu.Lock()
		defer w.mu.Unlock()
		return joinAddrs(w.podIPs()), nil
	case "status.hostIP":
		return NodeIP(w.node.index).String(), nil
	case "status.hostIPs":
		return joinAddrs(w.s.nodeIPs(w.node)), nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if path == prefix {
			var lines []string
			for k, v := range m {
				lines = append(lines, fmt.Sprintf("%s=%q", k, v))
			}
			return strings.Join(lines, "\n"), nil
		}
		if strings.HasPrefix(path, prefix+"['") && strings.HasSuffix(path, "']") {
			return m[path[len(prefix)+2:len(path)-2]], nil
		}
	}
	return "", fmt.Errorf("field path %q is not supported by the node simulator", path)
}

func resourceRef(c *corev1.Container, ref *corev1.ResourceFieldSelector) string {
	parts := strings.SplitN(ref.Resource, ".", 2)
	if len(parts) != 2 {
		return ""
	}
	list := c.Resources.Limits
	if parts[0] == "requests" {
		list = c.Resources.Requests
	}
	q, ok := list[corev1.ResourceName(parts[1])]
	if !ok {
		return "0"
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	v := (q.MilliValue() + div.MilliValue() - 1) / div.MilliValue()
	return strconv.FormatInt(v, 10)
}

// writeFile writes data to path atomically (what a container reads is old
// or new, never half).
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// joinAddrs is ips comma-separated, as the downward API gives lists.
func joinAddrs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ",")
}
