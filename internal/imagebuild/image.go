package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"
)

// Spec says what one image holds: the binary of a Go package at /<Name>,
// run as User.
type Spec struct {
	// Name is the image's repository name below a registry prefix and
	// its binary's name: "sockscale-agent".
	Name string
	// Package is the Go package of the binary (an import path or a
	// ./relative one, from Options.Dir).
	Package string
	// User is the image config's user ("65532").
	User int
}

// Images are the project's images: the three components and the test app
// that the end-to-end tests and the demo deploy.
var Images = []Spec{
	// The agent loads BPF programs, attaches them at the node's cgroup root
	// and pins them in bpffs: that needs CAP_BPF, CAP_NET_ADMIN and
	// CAP_SYS_ADMIN in its effective set, which a container's process gets
	// only as root (Kubernetes grants no ambient capabilities). The chart
	// runs it as 0 too and drops every other capability.
	{Name: "sockscale-agent", Package: "./agent/cmd/sockscale-agent", User: 0},
	{Name: "sockscale-controller", Package: "./controller/cmd/sockscale-controller", User: NonRoot},
	{Name: "sockscale-activator", Package: "./activator/cmd/sockscale-activator", User: NonRoot},
	{Name: "autoscale", Package: "./test/autoscale", User: NonRoot},
	// The real node's pod sandbox (test/cluster/realnode.go): containerd's
	// sandbox_image, so no pod there needs an image from outside.
	{Name: "pause", Package: "./test/pause", User: NonRoot},
}

// Built is one built image.
type Built struct {
	Name   string
	Image  v1.Image
	Digest v1.Hash
}

// Assemble makes the image of spec from its binary: the base layer, then
// a layer with the binary at /<Name>; Entrypoint is the binary, every time
// (layers' files, config, history) is epoch. Equal inputs give equal
// digests.
func Assemble(spec Spec, binary string, epoch time.Time, arch string) (v1.Image, error) {
	base, err := layer(baseEntries(), epoch)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	bin, err := binaryLayer(binary, spec.Name, epoch)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", spec.Name, err)
	}
	created := v1.Time{Time: epoch.UTC()}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: "sockscale base: /etc/passwd, /etc/group (nonroot 65532), /tmp", Comment: "imagebuild"}},
		mutate.Addendum{Layer: bin, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: "go build " + spec.Package, Comment: "imagebuild"}})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", spec.Name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created, cf.OS, cf.Architecture = created, "linux", arch
	cf.Config = v1.Config{
		Entrypoint: []string{"/" + spec.Name},
		User:       strconv.Itoa(spec.User),
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		WorkingDir: "/",
		Labels:     map[string]string{"org.opencontainers.image.title": spec.Name},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image %s config: %w", spec.Name, err)
	}
	return img, nil
}

// Options says how to build.
type Options struct {
	// Dir is where `go build` runs: the module's root for Images.
	Dir string
	// Epoch is every time in the images (SourceDateEpoch).
	Epoch time.Time
	// Arch is GOARCH and the images' architecture; empty: this machine's.
	Arch string
}

// Build compiles the binaries of specs with one `go build` (static, no
// paths or VCS stamps in them, so the same commit gives the same bytes; it
// shares the go build cache) and assembles their images.
func Build(ctx context.Context, opts Options, specs []Spec) ([]Built, error) {
	if opts.Arch == "" {
		opts.Arch = runtime.GOARCH
	}
	if opts.Epoch.IsZero() {
		return nil, errors.New("build images: no epoch: set Options.Epoch (SourceDateEpoch)")
	}
	tmp, err := os.MkdirTemp("", "sockscale-images-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", tmp + "/"}
	seen := map[string]string{}
	for _, s := range specs {
		base := path.Base(s.Package)
		if other, ok := seen[base]; ok {
			return nil, fmt.Errorf("build images: packages %s and %s both build a binary named %s", other, s.Package, base)
		}
		seen[base] = s.Package
		args = append(args, s.Package)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = opts.Dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+opts.Arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	var built []Built
	for _, s := range specs {
		img, err := Assemble(s, filepath.Join(tmp, path.Base(s.Package)), opts.Epoch, opts.Arch)
		if err != nil {
			return nil, err
		}
		// The digest reads every layer once (compressed and cached).
		d, err := img.Digest()
		if err != nil {
			return nil, fmt.Errorf("image %s digest: %w", s.Name, err)
		}
		built = append(built, Built{Name: s.Name, Image: img, Digest: d})
	}
	return built, nil
}

// SourceDateEpoch is $SOURCE_DATE_EPOCH (seconds since 1970) if set, else
// the commit time of dir's HEAD: the same commit gives the same images.
func SourceDateEpoch(ctx context.Context, dir string) (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		cmd := exec.CommandContext(ctx, "git", "log", "-1", "--format=%ct")
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			return time.Time{}, fmt.Errorf("commit time of %s (git log -1 --format=%%ct): %w; set SOURCE_DATE_EPOCH outside a git checkout", dir, err)
		}
		s = strings.TrimSpace(string(out))
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil || sec < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970 (a non-negative integer)", s)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// ChartAppVersion is the appVersion of the chart in chartDir: the images'
// tag, and the tag the chart's values default to.
func ChartAppVersion(chartDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return "", fmt.Errorf("chart appVersion: %w", err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return "", fmt.Errorf("chart appVersion: %s/Chart.yaml: %w", chartDir, err)
	}
	if c.AppVersion == "" {
		return "", fmt.Errorf("chart appVersion: %s/Chart.yaml has none", chartDir)
	}
	return c.AppVersion, nil
}
