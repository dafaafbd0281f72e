package imagebuild

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func writeBinary(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func digest(t *testing.T, spec Spec, bin string, epoch time.Time) v1.Hash {
	t.Helper()
	img, err := Assemble(spec, bin, epoch, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Same inputs, same digest; any input changed, another digest.
func TestAssembleReproducible(t *testing.T) {
	epoch := time.Unix(1_790_000_000, 0)
	spec := Spec{Name: "app", Package: "./app", User: NonRoot}
	bin := writeBinary(t, "binary v1")
	want := digest(t, spec, bin, epoch)
	// Another file with the same bytes, built at another time: the file's
	// own mtime and path must not reach the image.
	time.Sleep(10 * time.Millisecond)
	if got := digest(t, spec, writeBinary(t, "binary v1"), epoch); got != want {
		t.Errorf("same inputs: digest %s, first %s", got, want)
	}
	for name, d := range map[string]v1.Hash{
		"binary":  digest(t, spec, writeBinary(t, "binary v2"), epoch),
		"epoch":   digest(t, spec, bin, epoch.Add(time.Second)),
		"user":    digest(t, Spec{Name: "app", Package: "./app", User: 0}, bin, epoch),
		"name":    digest(t, Spec{Name: "app2", Package: "./app", User: NonRoot}, bin, epoch),
		"package": digest(t, Spec{Name: "app", Package: "./other", User: NonRoot}, bin, epoch),
	} {
		if d == want {
			t.Errorf("%s changed, digest stayed %s", name, d)
		}
	}
}

type fileInfo struct {
	Mode     int64
	UID, GID int
	ModTime  time.Time
	Size     int64
}

// The image's layers, config and files are what a runtime needs: the
// base's users, a sticky /tmp, the binary as the entrypoint, the user.
func TestAssembleContent(t *testing.T) {
	epoch := time.Unix(1_790_000_000, 0).UTC()
	img, err := Assemble(Spec{Name: "app", Package: "./app", User: NonRoot}, writeBinary(t, "#!binary"), epoch, "arm64")
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	wantCfg := v1.Config{Entrypoint: []string{"/app"}, User: "65532", Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		WorkingDir: "/", Labels: map[string]string{"org.opencontainers.image.title": "app"}}
	if diff := cmp.Diff(wantCfg, cf.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if !cf.Created.Equal(epoch) || cf.OS != "linux" || cf.Architecture != "arm64" {
		t.Errorf("created %s os %s arch %s, want %s linux arm64", cf.Created.Time, cf.OS, cf.Architecture, epoch)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fileInfo{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		var names []string
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
			got[h.Name] = fileInfo{Mode: h.Mode, UID: h.Uid, GID: h.Gid, ModTime: h.ModTime.UTC(), Size: h.Size}
		}
		rc.Close()
		for i := 1; i < len(names); i++ {
			if names[i-1] > names[i] {
				t.Errorf("layer entries not sorted: %q before %q", names[i-1], names[i])
			}
		}
	}
	dir := func(mode int64) fileInfo { return fileInfo{Mode: mode, ModTime: epoch} }
	want := map[string]fileInfo{
		"etc/": dir(0o755), "home/": dir(0o755), "home/nonroot/": dir(0o700), "root/": dir(0o700), "tmp/": dir(0o1777),
		"etc/passwd": {Mode: 0o644, ModTime: epoch, Size: got["etc/passwd"].Size},
		"etc/group":  {Mode: 0o644, ModTime: epoch, Size: got["etc/group"].Size},
		"app":        {Mode: 0o755, ModTime: epoch, Size: 8},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
}

// Written to a layout, read back, pushed to a registry: the registry
// serves the same digest under name:tag.
func TestLayoutAndPush(t *testing.T) {
	epoch := time.Unix(1_790_000_000, 0)
	var built []Built
	for _, n := range []string{"a", "b"} {
		img, err := Assemble(Spec{Name: n, Package: "./" + n}, writeBinary(t, n), epoch, "amd64")
		if err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		built = append(built, Built{Name: n, Image: img, Digest: d})
	}
	dir := filepath.Join(t.TempDir(), "layout")
	if err := WriteLayout(dir, built, "1.2.3"); err != nil {
		t.Fatal(err)
	}
	read, err := ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(read) != 2 || read[0].Name != "a" || read[0].Tag != "1.2.3" || read[0].Digest != built[0].Digest || read[1].Digest != built[1].Digest {
		t.Fatalf("layout read back: %+v", read)
	}
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://") + "/proj"
	refs, err := Push(context.Background(), []Built{read[0].Built, read[1].Built}, reg, "1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if want := reg + "/a:1.2.3@" + built[0].Digest.String(); refs[0] != want {
		t.Errorf("pushed %q, want %q", refs[0], want)
	}
	ref, err := ParseReference(reg + "/b:1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(ref)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != built[1].Digest {
		t.Errorf("registry has b:1.2.3 at %s, pushed %s", desc.Digest, built[1].Digest)
	}
}

func TestNameOptions(t *testing.T) {
	for reg, insecure := range map[string]bool{
		"127.0.0.1:5000/x": true, "localhost:5000": true, "[::1]:5000/a/b": true, "127.0.0.1": true,
		"ghcr.io/sockscale": false, "10.0.0.1:5000": false, "registry.local:5000": false,
	} {
		if got := len(NameOptions(reg)) > 0; got != insecure {
			t.Errorf("NameOptions(%q): plain HTTP %v, want %v", reg, got, insecure)
		}
	}
}

func TestSourceDateEpoch(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1790000000")
	got, err := SourceDateEpoch(context.Background(), ".")
	if err != nil || !got.Equal(time.Unix(1_790_000_000, 0)) {
		t.Errorf("SourceDateEpoch = %s, %v", got, err)
	}
	t.Setenv("SOURCE_DATE_EPOCH", "yesterday")
	if _, err := SourceDateEpoch(context.Background(), "."); err == nil || !strings.Contains(err.Error(), `"yesterday"`) {
		t.Errorf("SOURCE_DATE_EPOCH=yesterday: error %v, want one naming the value", err)
	}
}
