package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/sockscale/sockscale/internal/imagebuild"
)

// tarEntry is one entry of a test layer.
type tarEntry struct {
	name, link string
	typ        byte
	mode       int64
	data       string
}

func tarOf(t *testing.T, entries ...tarEntry) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode, Size: int64(len(e.data)), ModTime: time.Unix(1_790_000_000, 0)}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

// tree lists rootfs: "path mode [-> link | = content]".
func tree(t *testing.T, rootfs string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == rootfs {
			return err
		}
		rel, _ := filepath.Rel(rootfs, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		line := rel + " " + fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += " = " + string(b)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func TestUnpackLayers(t *testing.T) {
	rootfs := t.TempDir()
	layers := []*bytes.Buffer{
		tarOf(t,
			tarEntry{name: "bin/", typ: tar.TypeDir, mode: 0o755},
			tarEntry{name: "bin/app", mode: 0o755, data: "v1"},
			tarEntry{name: "etc/conf", data: "old"}, // parent made without an entry
			tarEntry{name: "etc/gone", data: "x"},
			tarEntry{name: "var/lib/a", data: "a"},
			tarEntry{name: "var/lib/b", data: "b"},
			tarEntry{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
			tarEntry{name: "link", typ: tar.TypeSymlink, link: "bin/app"},
			tarEntry{name: "hard", typ: tar.TypeLink, link: "bin/app"},
			tarEntry{name: "dev/null", typ: tar.TypeChar},
		),
		tarOf(t,
			tarEntry{name: "bin/app", mode: 0o755, data: "v2"},
			tarEntry{name: "etc/.wh.gone"},
			tarEntry{name: "var/lib/.wh..wh..opq"},
			tarEntry{name: "var/lib/c", data: "c"},
			tarEntry{name: "./etc/../etc/conf", data: "new"},
			tarEntry{name: "../../escape", data: "kept inside"},
		),
	}
	for _, l := range layers {
		if err := unpackLayer(rootfs, l); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		"bin drwxr-xr-x",
		"bin/app -rwxr-xr-x = v2",
		"dev drwxr-xr-x",
		"escape -rw-r--r-- = kept inside",
		"etc drwxr-xr-x",
		"etc/conf -rw-r--r-- = new",
		"hard -rwxr-xr-x = v1",
		"link Lrwxrwxrwx -> bin/app",
		"tmp dtrwxrwxrwx",
		"var drwxr-xr-x",
		"var/lib drwxr-xr-x",
		"var/lib/c -rw-r--r-- = c",
	}
	if diff := cmp.Diff(want, tree(t, rootfs)); diff != "" {
		t.Errorf("rootfs (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(rootfs), "escape")); err == nil {
		t.Error("an entry escaped the rootfs")
	}
}

func TestUnpackLayerRefuses(t *testing.T) {
	tests := []struct {
		name    string
		entries []tarEntry
		want    string
	}{
		{"symlink out, then through it", []tarEntry{{name: "out", typ: tar.TypeSymlink, link: "../../../"}, {name: "out/x", data: "x"}}, "out/x"},
		{"hard link out", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../../../etc/passwd"}}, "hard link h"},
		{"unknown type", []tarEntry{{name: "s", typ: 'Z'}}, `tar entry type 'Z' is not supported`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := unpackLayer(t.TempDir(), tarOf(t, tt.entries...))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
}

func TestContainerArgv(t *testing.T) {
	img := v1.Config{Entrypoint: []string{"/app", "--base"}, Cmd: []string{"--default"}}
	tests := []struct {
		name          string
		command, args []string
		cfg           v1.Config
		want          []string
	}{
		{"image's", nil, nil, img, []string{"/app", "--base", "--default"}},
		{"args replace Cmd", nil, []string{"--port=1"}, img, []string{"/app", "--base", "--port=1"}},
		{"command replaces both", []string{"/other"}, nil, img, []string{"/other"}},
		{"command and args", []string{"/other"}, []string{"-v"}, img, []string{"/other", "-v"}},
		{"Cmd alone", nil, nil, v1.Config{Cmd: []string{"/sh", "-c", "x"}}, []string{"/sh", "-c", "x"}},
		{"args alone are the command", nil, []string{"/sh"}, v1.Config{Cmd: []string{"/x"}}, []string{"/sh"}},
	}
	for _, tt := range tests {
		got, err := containerArgv(tt.command, tt.args, tt.cfg)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: argv (-want +got):\n%s", tt.name, diff)
		}
	}
	if _, err := containerArgv(nil, nil, v1.Config{}); err == nil || !strings.Contains(err.Error(), "no Entrypoint or Cmd") {
		t.Errorf("no entrypoint: error %v", err)
	}
}

func TestImageUserAndExecutable(t *testing.T) {
	rootfs := t.TempDir()
	if err := unpackLayer(rootfs, tarOf(t,
		tarEntry{name: "etc/passwd", data: "root:x:0:0::/root:/bin/sh\nnonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n"},
		tarEntry{name: "etc/group", data: "root:x:0:\nnonroot:x:65532:\nstaff:x:50:\n"},
		tarEntry{name: "usr/bin/tool", mode: 0o755, data: "tool"},
		tarEntry{name: "usr/bin/notexec", mode: 0o644, data: "x"},
		tarEntry{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
	)); err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string][2]int64{"": {0, 0}, "65532": {65532, 65532}, "nonroot": {65532, 65532},
		"nonroot:staff": {65532, 50}, "1000": {1000, 1000}, "1000:50": {1000, 50}} {
		uid, gid, err := imageUser(rootfs, user)
		if err != nil || uid != want[0] || gid != want[1] {
			t.Errorf("imageUser(%q) = %d, %d, %v; want %v", user, uid, gid, err, want)
		}
	}
	if _, _, err := imageUser(rootfs, "nobody"); err == nil || !strings.Contains(err.Error(), `"nobody"`) {
		t.Errorf("unknown user: error %v, want one naming it", err)
	}
	for p, ok := range map[string]bool{"tool": true, "/bin/tool": true, "/usr/bin/tool": true, "notexec": false, "/etc/passwd": false, "missing": false} {
		f, err := openExecutable(rootfs, p, []string{"PATH=/nowhere:/usr/bin"})
		if (err == nil) != ok {
			t.Errorf("openExecutable(%q): %v, want found %v", p, err, ok)
		}
		if f != nil {
			f.Close()
		}
	}
}

// The image store against a real registry: IfNotPresent and Never use
// what a reference resolved to before, Always resolves it again, a
// missing image is the registry's error.
func TestImageStorePullPolicies(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	repo := strings.TrimPrefix(srv.URL, "http://") + "/test"
	push := func(content string) v1.Hash {
		t.Helper()
		bin := filepath.Join(t.TempDir(), "app")
		if err := os.WriteFile(bin, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		img, err := imagebuild.Assemble(imagebuild.Spec{Name: "app", Package: "./app", User: imagebuild.NonRoot}, bin, time.Unix(1_790_000_000, 0), runtime.GOARCH)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		if _, err := imagebuild.Push(context.Background(), []imagebuild.Built{{Name: "app", Image: img, Digest: d}}, repo, "v1"); err != nil {
			t.Fatal(err)
		}
		return d
	}
	s := newImageStore(filepath.Join(t.TempDir(), "images"))
	ctx := context.Background()
	image := repo + "/app:v1"
	if _, err := s.get(ctx, image, corev1.PullNever); !errors.Is(err, errNeverPull) {
		t.Errorf("Never, nothing here: error %v, want errNeverPull", err)
	}
	if _, err := s.get(ctx, image, corev1.PullIfNotPresent); err == nil || !strings.Contains(err.Error(), "NAME_UNKNOWN") {
		t.Errorf("nothing pushed: error %v, want the registry's NAME_UNKNOWN", err)
	}
	d1 := push("one")
	got, err := s.get(ctx, image, corev1.PullIfNotPresent)
	if err != nil {
		t.Fatal(err)
	}
	if want := repo + "/app@" + d1.String(); got.ID != want {
		t.Errorf("imageID %s, want %s", got.ID, want)
	}
	if b, err := os.ReadFile(filepath.Join(got.Rootfs, "app")); err != nil || string(b) != "one" {
		t.Errorf("rootfs /app: %q, %v", b, err)
	}
	if got.Config.User != "65532" || len(got.Config.Entrypoint) != 1 || got.Config.Entrypoint[0] != "/app" {
		t.Errorf("config %+v", got.Config)
	}
	d2 := push("two") // the tag moves
	for _, tt := range []struct {
		policy corev1.PullPolicy
		want   v1.Hash
	}{{corev1.PullIfNotPresent, d1}, {corev1.PullNever, d1}, {corev1.PullAlways, d2}, {corev1.PullIfNotPresent, d2}} {
		got, err := s.get(ctx, image, tt.policy)
		if err != nil {
			t.Fatalf("%s: %v", tt.policy, err)
		}
		if !strings.HasSuffix(got.ID, tt.want.String()) {
			t.Errorf("%s: image %s, want digest %s", tt.policy, got.ID, tt.want)
		}
	}
	byDigest, err := s.get(ctx, repo+"/app@"+d1.String(), corev1.PullIfNotPresent)
	if err != nil || !strings.HasSuffix(byDigest.ID, d1.String()) {
		t.Errorf("by digest: %v, %v", byDigest, err)
	}
}
