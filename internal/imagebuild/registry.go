package imagebuild

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// refAnnotation names an image in an OCI layout's index (name:tag).
const refAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout writes built to a fresh OCI image layout at dir, each
// manifest annotated with its name:tag.
func WriteLayout(dir string, built []Built, tag string) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci layout %s: %w", dir, err)
	}
	for _, b := range built {
		if err := p.AppendImage(b.Image, layout.WithAnnotations(map[string]string{refAnnotation: b.Name + ":" + tag})); err != nil {
			return fmt.Errorf("oci layout %s: image %s: %w", dir, b.Name, err)
		}
	}
	return nil
}

// Layout is one image of an OCI layout, by its name:tag annotation.
type Layout struct {
	Name, Tag string
	Built
}

// ReadLayout reads the images WriteLayout wrote.
func ReadLayout(dir string) ([]Layout, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("oci layout %s (run make images): %w", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out []Layout
	for _, d := range m.Manifests {
		ref := d.Annotations[refAnnotation]
		n, tag, ok := strings.Cut(ref, ":")
		if !ok {
			return nil, fmt.Errorf("oci layout %s: manifest %s has no %s name:tag annotation", dir, d.Digest, refAnnotation)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("oci layout %s: %s: %w", dir, ref, err)
		}
		out = append(out, Layout{Name: n, Tag: tag, Built: Built{Name: n, Image: img, Digest: d.Digest}})
	}
	return out, nil
}

// NameOptions are how to parse a reference to registry: plain HTTP for a
// loopback host (registries there are usually served without TLS, as the
// local cluster's is), HTTPS for any other.
func NameOptions(registry string) []name.Option {
	host := registry
	if i := strings.IndexByte(host, '/'); i >= 0 {
		host = host[:i]
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return []name.Option{name.Insecure}
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return []name.Option{name.Insecure}
	}
	return nil
}

// Push pushes each image to <registry>/<name>:<tag> with the user's docker
// credentials (none needed for a local registry) and returns the
// references pushed, name:tag@digest.
func Push(ctx context.Context, built []Built, registry, tag string) ([]string, error) {
	registry = strings.TrimSuffix(registry, "/")
	if registry == "" {
		return nil, fmt.Errorf("push: empty registry: want host[:port][/path], e.g. 127.0.0.1:5000/sockscale")
	}
	var refs []string
	for _, b := range built {
		s := registry + "/" + b.Name + ":" + tag
		ref, err := name.NewTag(s, append(NameOptions(registry), name.StrictValidation)...)
		if err != nil {
			return nil, fmt.Errorf("push: reference %q: %w", s, err)
		}
		if err := remote.Write(ref, b.Image, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return nil, fmt.Errorf("push %s: %w", ref, err)
		}
		refs = append(refs, ref.String()+"@"+b.Digest.String())
	}
	return refs, nil
}

// ParseReference parses an image reference, with plain HTTP for a
// loopback registry (NameOptions).
func ParseReference(s string) (name.Reference, error) {
	return name.ParseReference(s, NameOptions(s)...)
}
