package keda

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/internal/imagebuild"
)

// Namespace is KEDA's: its ClusterTriggerAuthentications read Secrets
// there.
const Namespace = "keda"

// module is KEDA's Go module.
const module = "github.com/kedacore/keda/v2"

// imageName is the operator's image below the registry prefix.
const imageName = "keda-operator"

// Source is KEDA's module as go.mod pins it: its version, its commit
// time, and a writable copy of its source under the cache directory (the
// module cache is read-only, and KEDA's own go.mod, with its replace
// directives, builds only from its own root).
type Source struct {
	Version string
	Time    time.Time
	Dir     string
}

// cacheDir is $CACHE_DIR (the Makefile's), else ~/.cache/sockscale.
func cacheDir() (string, error) {
	if d := os.Getenv("CACHE_DIR"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".cache", "sockscale"), nil
}

// moduleRoot is this module's root (where go.mod pins KEDA).
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the sockscale module")
	}
	return filepath.Dir(mod), nil
}

// FindSource downloads KEDA's module (if the module cache lacks it) and
// copies it to <cache>/keda-<version>-src once.
func FindSource(ctx context.Context) (Source, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return Source{}, err
	}
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return Source{}, fmt.Errorf("go mod download %s: %w", module, err)
	}
	var m struct {
		Version, Dir, Info string
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return Source{}, fmt.Errorf("go mod download %s: %w", module, err)
	}
	if m.Dir == "" || m.Info == "" {
		return Source{}, fmt.Errorf("go mod download %s: no directory or info in %q", module, out)
	}
	// The version's commit time, for reproducible images.
	info, err := os.ReadFile(m.Info)
	if err != nil {
		return Source{}, err
	}
	var v struct{ Time time.Time }
	if err := json.Unmarshal(info, &v); err != nil {
		return Source{}, fmt.Errorf("%s: %w", m.Info, err)
	}
	if v.Time.IsZero() {
		return Source{}, fmt.Errorf("%s: no time in %q", m.Info, info)
	}
	src := Source{Version: m.Version, Time: v.Time}
	cache, err := cacheDir()
	if err != nil {
		return Source{}, err
	}
	src.Dir = filepath.Join(cache, "keda-"+m.Version+"-src")
	if _, err := os.Stat(filepath.Join(src.Dir, "go.mod")); err == nil {
		return src, nil
	}
	tmp := src.Dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return Source{}, err
	}
	if err := copyTree(m.Dir, tmp); err != nil {
		return Source{}, fmt.Errorf("copy %s: %w", m.Dir, err)
	}
	return src, os.Rename(tmp, src.Dir)
}

// copyTree copies the regular files and directories under from to to,
// writable by their owner.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case !d.Type().IsRegular():
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			_ = out.Close()
			return err
		}
		return out.Close()
	})
}

// Image returns the operator's image, built once into an OCI layout at
// <cache>/keda-operator-<version> (a cold build takes minutes: `make
// keda-image` does it ahead of the tests), and its tag (the version).
func Image(ctx context.Context, src Source) (imagebuild.Built, error) {
	cache, err := cacheDir()
	if err != nil {
		return imagebuild.Built{}, err
	}
	dir := filepath.Join(cache, imageName+"-"+src.Version)
	if imgs, err := imagebuild.ReadLayout(dir); err == nil && len(imgs) == 1 {
		return imgs[0].Built, nil
	}
	built, err := imagebuild.Build(ctx, imagebuild.Options{Dir: src.Dir, Epoch: src.Time},
		[]imagebuild.Spec{{Name: imageName, Package: "./cmd/operator", User: imagebuild.NonRoot}})
	if err != nil {
		return imagebuild.Built{}, err
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return imagebuild.Built{}, err
	}
	if err := imagebuild.WriteLayout(tmp, built, src.Version); err != nil {
		return imagebuild.Built{}, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return imagebuild.Built{}, err
	}
	return built[0], os.Rename(tmp, dir)
}

// Install pushes the operator's image to registry (host:port/path) and
// runs it in namespace keda: KEDA's CRDs and ClusterRole from its source,
// a ServiceAccount, and one replica without leader election. Its metrics
// service's certificate is made here (a Secret mounted at /certs): KEDA's
// own rotation would also patch the external metrics APIService, which
// sockscale may serve.
func Install(ctx context.Context, c client.Client, registry string) error {
	src, err := FindSource(ctx)
	if err != nil {
		return err
	}
	img, err := Image(ctx, src)
	if err != nil {
		return err
	}
	refs, err := imagebuild.Push(ctx, []imagebuild.Built{img}, registry, src.Version)
	if err != nil {
		return err
	}
	var objs []*unstructured.Unstructured
	for _, f := range []string{"config/crd/bases", "config/rbac/role.yaml", "config/rbac/role_binding.yaml", "config/service_account"} {
		o, err := manifests(filepath.Join(src.Dir, f))
		if err != nil {
			return err
		}
		objs = append(objs, o...)
	}
	if err := create(ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil {
		return err
	}
	for _, o := range objs {
		if o.GetKind() == "Kustomization" {
			continue
		}
		if o.GetNamespace() == "" && o.GetKind() != "CustomResourceDefinition" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" {
			o.SetNamespace(Namespace)
		}
		if err := create(ctx, c, o); err != nil {
			return fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	certs, err := metricsServiceCerts()
	if err != nil {
		return err
	}
	if err := create(ctx, c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "kedaorg-certs"}, Data: certs}); err != nil {
		return err
	}
	return create(ctx, c, deployment(refs[0]))
}

// deployment is the operator's Deployment, as KEDA's own manifest runs it
// less leader election and certificate rotation.
func deployment(image string) *appsv1.Deployment {
	labels := map[string]string{"app": imageName}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: imageName, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: imageName,
					Containers: []corev1.Container{{
						Name:  imageName,
						Image: image,
						Args: []string{"--leader-elect=false", "--zap-log-level=info", "--zap-encoder=console",
							"--enable-cert-rotation=false", "--enable-webhook-patching=false", "--enable-apiservice-patching=false",
							"--metrics-bind-address=:8080", "--health-probe-bind-address=:8081"},
						Env: []corev1.EnvVar{
							{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
							{Name: "WATCH_NAMESPACE", Value: ""},
						},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(8081)}},
							PeriodSeconds: 2},
						VolumeMounts: []corev1.VolumeMount{{Name: "certificates", MountPath: "/certs", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "certificates", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kedaorg-certs"}}}},
				},
			},
		},
	}
}

// metricsServiceCerts are a CA and the operator's metrics service
// certificate (ca.crt, tls.crt, tls.key), as KEDA's rotation would make
// them.
func metricsServiceCerts() (map[string][]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "keda-e2e-ca"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	svc := imageName + "." + Namespace + ".svc"
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: svc}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{imageName, imageName + "." + Namespace, svc, svc + ".cluster.local"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		"ca.crt":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// manifests reads the YAML documents of a file, or of every .yaml file
// in a directory.
func manifests(path string) ([]*unstructured.Unstructured, error) {
	files := []string{path}
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if st.IsDir() {
		if files, err = filepath.Glob(filepath.Join(path, "*.yaml")); err != nil {
			return nil, err
		}
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := d.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(u.Object) > 0 {
				out = append(out, u)
			}
		}
	}
	return out, nil
}

// create creates o, or leaves the one there.
func create(ctx context.Context, c client.Client, o client.Object) error {
	if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}
